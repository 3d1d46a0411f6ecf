//! dlopen of an artifact held in memory, a private copy per call: each
//! in-process core gets its own, so that static state in its code is per
//! core, as it is per hardware core.
//!
//! The copy is a memory file dlopened through /proc, so nothing is written
//! to disk, and nothing is left there if the artifact's initialiser kills
//! the process. Where memory files may not be mapped executable
//! (`vm.memfd_noexec`) or /proc is missing, a temporary file in TMPDIR
//! (removed once loaded) is the fallback.

use std::path::Path;

use libloading::Library;

use crate::LoadError;

/// A loaded object, and the memory file it was loaded from.
pub(crate) struct Object {
    // Declared first, so dropped (dlclosed) before its file is closed.
    lib: Library,
    /// Held open while the object is loaded: the loader knows an object by
    /// its path, and the next memory file, given this descriptor's number,
    /// would have the same `/proc/self/fd/N` and be taken for this object.
    #[cfg(target_os = "linux")]
    _file: Option<std::os::fd::OwnedFd>,
}

impl Object {
    pub(crate) fn lib(&self) -> &Library {
        &self.lib
    }
}

fn dlopen(path: &Path, what: &str) -> Result<Library, LoadError> {
    // SAFETY: loading runs the object's initialisers. The object comes from
    // a configuration the user chose to run on this node, which is the
    // trust model of the whole system (a bitstream can do anything too).
    unsafe { Library::new(path) }
        .map_err(|e| LoadError::Invalid(format!("{what} artifact cannot be loaded: {e}")))
}

/// dlopens the shared object at `path`; `what` names the kind in errors.
pub(crate) fn open_path(path: &Path, what: &str) -> Result<Object, LoadError> {
    Ok(Object {
        lib: dlopen(path, what)?,
        #[cfg(target_os = "linux")]
        _file: None,
    })
}

/// dlopens a private copy of `so`.
pub(crate) fn open_copy(so: &[u8], what: &str) -> Result<Object, LoadError> {
    #[cfg(target_os = "linux")]
    if let Ok(fd) = memory_copy(so) {
        use std::os::fd::AsRawFd as _;
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        // A broken artifact fails here and again from the file below,
        // whose error is the one reported.
        if let Ok(lib) = dlopen(Path::new(&path), what) {
            return Ok(Object {
                lib,
                _file: Some(fd),
            });
        }
    }
    let file = tempfile::Builder::new()
        .prefix("corefarm-core-")
        .suffix(".so")
        .tempfile()
        .map_err(|e| {
            LoadError::Backend(format!(
                "cannot create a temporary file for the {what} core: {e}"
            ))
        })?;
    std::fs::write(file.path(), so)
        .map_err(|e| LoadError::Backend(format!("cannot write the {what} core: {e}")))?;
    // The file is removed on return; the mapping stays valid once loaded,
    // and the temporary name is unique while the object is loaded.
    open_path(file.path(), what)
}

#[cfg(target_os = "linux")]
fn memory_copy(so: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::io::Write as _;
    let fd = rustix::fs::memfd_create("corefarm-core", rustix::fs::MemfdFlags::CLOEXEC)?;
    std::fs::File::from(fd.try_clone()?).write_all(so)?;
    Ok(fd)
}

/// Whether a memory file may be mapped executable here, so that
/// [`open_copy`] needs no writable, executable TMPDIR.
pub(crate) fn memory_files_execute() -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(fd) = memory_copy(&[0xc3]) else {
            return false;
        };
        let file = std::fs::File::from(fd);
        // SAFETY: the memory file is private to this function, so nothing
        // changes it while mapped; the mapping is neither read nor
        // executed, only dropped.
        std::path::Path::new("/proc/self/fd").is_dir()
            && unsafe { memmap2::MmapOptions::new().len(1).map_exec(&file) }.is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_maps_memory_files_executable() {
        // The worker processes and in-process cores rely on it here (CI
        // runs on the same kind of machine); elsewhere TMPDIR is used.
        assert!(memory_files_execute());
    }

    #[test]
    fn a_copy_that_is_not_an_object_is_refused_by_the_loader() {
        let e = open_copy(b"not an ELF object", "native").err().unwrap();
        assert!(
            e.to_string().contains("native artifact cannot be loaded"),
            "{e}"
        );
    }
}
