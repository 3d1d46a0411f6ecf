//! The matrix multiplier's build and its configuration image.
//!
//! Every use of the toolchain (g++, Verilator, the content-hash build cache)
//! and of the image builder by the demo lives in this file, so that moving
//! that API to another crate touches the demo here only.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use corefarm_cores::image::{Control, Family};
use corefarm_cores::{image, ArtifactKind};
use corefarm_smp::Configuration;
use corefarm_toolchain::{self as toolchain, BuildKind, ImageBuilder};

use super::workload::{INPUT_SIZE, OUTPUT_SIZE};
use super::Target;

/// HLS entry and Verilog top module of cores/matmul.
pub const ENTRY: &str = "mat_mul_64x64";
/// Embedded so the demo also works from an installed binary; the build cache
/// keys on file name and contents, so these hit the same entries as builds
/// from the repository's files.
const HLS_SOURCE: &str = include_str!("../../../../cores/matmul/matmul.cpp");
const VERILOG_SOURCE: &str = include_str!("../../../../cores/matmul/matmul.v");
/// The AMD (Vitis) style of the same function: C++ top function and AXI core.
const VITIS_SOURCE: &str = include_str!("../../../../cores/matmul/matmul_vitis.cpp");
const AXI_SOURCE: &str = include_str!("../../../../cores/matmul/matmul_axi.v");

/// Fails with an installation hint when a tool the demo needs does not run.
pub fn check_tools(target: Target, family: Family) -> Result<()> {
    let verilog = match family {
        Family::Intel => "cores/matmul/matmul.v",
        Family::Amd => "cores/matmul/matmul_axi.v",
    };
    if !toolchain::cxx_available() {
        bail!(
            "corefarm demo needs a C++ compiler to build the matrix multiplier (cores/matmul/matmul.cpp) \
             and the software baseline, and none runs ($CXX, default `c++`). Install one, e.g. \
             `sudo apt-get install -y g++`, or set $CXX."
        );
    }
    if target == Target::Rtl && !toolchain::verilator_available() {
        bail!(
            "corefarm demo --target rtl simulates {verilog} with Verilator, but Verilator \
             (or make) does not run ($VERILATOR, default `verilator`). Install Verilator 5 and make, e.g. \
             `sudo apt-get install -y verilator make`, or run the demo with --target native."
        );
    }
    Ok(())
}

/// `$COREFARM_CACHE`, else the user's cache directory.
pub fn default_cache_dir() -> PathBuf {
    toolchain::default_cache_dir()
}

/// Shared objects of the matrix multiplier, in the build cache.
pub struct Built {
    /// Always built: the native nodes run it and the software baseline calls it.
    pub native_so: PathBuf,
    /// `--target native --family amd`: the Vitis source behind its shim
    /// (in `_dir`), which the nodes run instead.
    pub vitis_so: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
    /// Built for `--target rtl` only.
    pub rtl_so: Option<PathBuf>,
    pub seconds: f64,
    /// Every artifact came from the cache (nothing was compiled).
    pub reused: bool,
}

impl Built {
    /// The object the nodes of `target` run.
    pub fn object(&self, target: Target) -> &Path {
        match target {
            Target::Native => self.vitis_so.as_deref().unwrap_or(&self.native_so),
            Target::Rtl => self.rtl_so.as_deref().expect("built for rtl"),
        }
    }
}

/// Builds (or takes from the content-hash cache) the native core, and the
/// RTL simulation for `--target rtl`.
pub fn build(target: Target, family: Family, cache: &Path, say: &dyn Fn(&str)) -> Result<Built> {
    let started = Instant::now();
    let t0 = SystemTime::now();
    let src = tempfile::tempdir().context("creating a temporary directory")?;
    let cpp = src.path().join("matmul.cpp");
    let v = src.path().join("matmul.v");
    std::fs::write(&cpp, HLS_SOURCE).context("writing matmul.cpp")?;
    std::fs::write(&v, VERILOG_SOURCE).context("writing matmul.v")?;
    // A cached object's mtime predates this call; a fresh build's does not.
    let fresh = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .map(|m| m >= t0)
            .unwrap_or(true)
    };
    say("building the native matrix multiplier (c++ -O3; cached after the first run)");
    let native_so = toolchain::cached_build(&BuildKind::Native, &[cpp], ENTRY, cache)
        .context("building cores/matmul/matmul.cpp")?;
    let mut reused = !fresh(&native_so);
    let rtl_so = if target == Target::Rtl {
        say("building the RTL simulation with Verilator (takes a minute the first time; cached)");
        let so = match family {
            Family::Intel => {
                toolchain::cached_build(&BuildKind::Rtl { top: ENTRY.into() }, &[v], "", cache)
                    .context("building cores/matmul/matmul.v")?
            }
            Family::Amd => {
                let axi = src.path().join("matmul_axi.v");
                std::fs::write(&axi, AXI_SOURCE).context("writing matmul_axi.v")?;
                let kind = BuildKind::RtlAxi { top: ENTRY.into() };
                toolchain::cached_build(&kind, &[axi], "", cache)
                    .context("building cores/matmul/matmul_axi.v")?
            }
        };
        reused &= !fresh(&so);
        Some(so)
    } else {
        None
    };
    let (vitis_so, dir) = if target == Target::Native && family == Family::Amd {
        say("building the Vitis-style matrix multiplier as a native soft core (c++ -O3)");
        let (so, dir) = vitis_native(src.path())?;
        reused = false;
        (Some(so), Some(dir))
    } else {
        (None, None)
    };
    Ok(Built {
        native_so,
        vitis_so,
        _dir: dir,
        rtl_so,
        seconds: started.elapsed().as_secs_f64(),
        reused,
    })
}

/// matmul_vitis.cpp built as a native soft core (its shim's symbol is the
/// artifact's entry), in a directory that lives as long as the returned one.
fn vitis_native(src: &Path) -> Result<(PathBuf, tempfile::TempDir)> {
    let cpp = src.join("matmul_vitis.cpp");
    std::fs::write(&cpp, VITIS_SOURCE).context("writing matmul_vitis.cpp")?;
    let built = toolchain::build_image(&toolchain::BuildSpec {
        name: ENTRY.into(),
        cores: 1,
        hls: Some((cpp, ENTRY.into())),
        family: Family::Amd,
        ..toolchain::BuildSpec::default()
    })
    .context("building cores/matmul/matmul_vitis.cpp")?;
    let img = image::Image::parse(Bytes::from(built.image))?;
    let code = img.verified_artifact(0)?;
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let so = dir.path().join("matmul_vitis.so");
    std::fs::write(&so, &code).context("writing the Vitis-style native core")?;
    Ok((so, dir))
}

/// The argument list of the Vitis-style matrix multiplier (A, B in; C out).
fn vitis_control() -> Result<Control> {
    let iface = toolchain::vitis::parse_interface(VITIS_SOURCE, ENTRY, &[])
        .map_err(|e| anyhow!("cores/matmul/matmul_vitis.cpp: {e}"))?;
    Ok(Control::ap_ctrl_hs(iface.args()))
}

/// A configuration image of the matrix multiplier.
pub struct MatmulImage {
    /// Size of the image (the configuration's bitstream field).
    pub bytes: usize,
    /// Targets of its artifacts, comma separated.
    pub artifact: String,
    pub configuration: Configuration,
}

/// An image carrying `so` as the one artifact for `target` and the default
/// core table for `cores` cores.
pub fn matmul_image(target: Target, family: Family, so: &Path, cores: u32) -> Result<MatmulImage> {
    let code = std::fs::read(so).with_context(|| format!("reading {}", so.display()))?;
    let (kind, name) = match target {
        Target::Native => (ArtifactKind::Native, image::native_target()),
        Target::Rtl => (ArtifactKind::Rtl, image::rtl_target()),
    };
    let name = name.ok_or_else(|| {
        anyhow!(
            "no target for this architecture ({})",
            std::env::consts::ARCH
        )
    })?;
    let table = image::default_core_table(cores, INPUT_SIZE as u32, OUTPUT_SIZE as u32)?;
    let (entry, control) = match family {
        Family::Intel => (ENTRY.to_string(), None),
        Family::Amd => {
            let control = vitis_control()?;
            let entry = match target {
                Target::Native => toolchain::vitis::parse_interface(VITIS_SOURCE, ENTRY, &[])
                    .map_err(|e| anyhow!("{e}"))?
                    .shim_symbol(),
                Target::Rtl => ENTRY.to_string(),
            };
            (entry, Some(control))
        }
    };
    let img = ImageBuilder::new(ENTRY, INPUT_SIZE as u32, OUTPUT_SIZE as u32, table)
        .artifact_for(name, kind, entry, family, control, code)
        .build()?;
    let img = Bytes::from(img);
    Ok(MatmulImage {
        bytes: img.len(),
        artifact: image::Image::parse(img.clone())?.targets().join(","),
        configuration: image::configuration(img)?,
    })
}
