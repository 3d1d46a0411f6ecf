//! The functions a shared object exports, read from its dynamic symbol
//! table, for the message about a missing entry symbol (a C++ entry
//! without `extern "C"` is exported under its mangled name). ELF, 32- or
//! 64-bit little-endian: the targets corefarm builds for. The object comes
//! from a user's image, so every read is bounds-checked and a malformed
//! one yields `None`, never a panic.

/// Symbols read at most (a core exports a handful).
const MAX_SYMBOLS: usize = 1 << 16;

const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;

struct Reader<'a> {
    b: &'a [u8],
    wide: bool,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&self, at: u64) -> Option<[u8; N]> {
        let at = usize::try_from(at).ok()?;
        self.b.get(at..at.checked_add(N)?)?.try_into().ok()
    }
    fn u8(&self, at: u64) -> Option<u8> {
        Some(self.bytes::<1>(at)?[0])
    }
    fn u16(&self, at: u64) -> Option<u16> {
        self.bytes(at).map(u16::from_le_bytes)
    }
    fn u32(&self, at: u64) -> Option<u32> {
        self.bytes(at).map(u32::from_le_bytes)
    }
    /// An address-sized field.
    fn word(&self, at: u64) -> Option<u64> {
        if self.wide {
            self.bytes(at).map(u64::from_le_bytes)
        } else {
            self.u32(at).map(u64::from)
        }
    }
}

struct Section {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

fn section(r: &Reader, shoff: u64, shentsize: u64, i: u64) -> Option<Section> {
    let at = shoff.checked_add(shentsize.checked_mul(i)?)?;
    let (offset, size, link, entsize) = if r.wide {
        (24, 32, 40, 56)
    } else {
        (16, 20, 24, 36)
    };
    Some(Section {
        kind: r.u32(at.checked_add(4)?)?,
        offset: r.word(at.checked_add(offset)?)?,
        size: r.word(at.checked_add(size)?)?,
        link: r.u32(at.checked_add(link)?)?,
        entsize: r.word(at.checked_add(entsize)?)?,
    })
}

/// Names of the functions `so` defines and exports (global or weak), in
/// symbol table order; `None` if it is not a little-endian ELF object with
/// a dynamic symbol table.
pub(crate) fn exported_functions(so: &[u8]) -> Option<Vec<String>> {
    if so.get(..4)? != b"\x7fELF" || *so.get(5)? != 1 {
        return None;
    }
    let wide = match so.get(4)? {
        1 => false,
        2 => true,
        _ => return None,
    };
    let r = Reader { b: so, wide };
    let (shoff, shentsize, shnum) = if wide {
        (r.word(0x28)?, r.u16(0x3A)?, r.u16(0x3C)?)
    } else {
        (r.word(0x20)?, r.u16(0x2E)?, r.u16(0x30)?)
    };
    let (shentsize, shnum) = (u64::from(shentsize), u64::from(shnum));
    let dynsym = (0..shnum)
        .filter_map(|i| section(&r, shoff, shentsize, i))
        .find(|s| s.kind == SHT_DYNSYM)?;
    let strtab = section(&r, shoff, shentsize, u64::from(dynsym.link))?;
    let strings = so.get(
        usize::try_from(strtab.offset).ok()?
            ..usize::try_from(strtab.offset.checked_add(strtab.size)?).ok()?,
    )?;
    let entsize = if dynsym.entsize == 0 {
        if wide {
            24
        } else {
            16
        }
    } else {
        dynsym.entsize
    };
    let count = (dynsym.size / entsize).min(MAX_SYMBOLS as u64);
    // (st_info, st_other, st_shndx) offsets in a symbol.
    let (info, other, shndx) = if wide { (4, 5, 6) } else { (12, 13, 14) };
    let mut out = Vec::new();
    for i in 0..count {
        let at = dynsym.offset.checked_add(i.checked_mul(entsize)?)?;
        let field = |k: u64| at.checked_add(k);
        let (info, visibility, index) = (
            r.u8(field(info)?)?,
            r.u8(field(other)?)? & 3,
            r.u16(field(shndx)?)?,
        );
        let (kind, bind) = (info & 0xF, info >> 4);
        // Defined (section index not 0), default or protected visibility.
        if !matches!(kind, STT_FUNC | STT_GNU_IFUNC)
            || !matches!(bind, STB_GLOBAL | STB_WEAK)
            || index == 0
            || !matches!(visibility, 0 | 3)
        {
            continue;
        }
        let name_at = usize::try_from(r.u32(at)?).ok()?;
        let name = strings.get(name_at..)?;
        let name = &name[..name.iter().position(|&c| c == 0)?];
        if !name.is_empty() {
            out.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Some(out)
}

/// Whether `symbol` is the C++ (Itanium ABI) mangled name of a function
/// called `name`, free or in a namespace or class: `_Z5crc32PKhPh`,
/// `_ZN2ns5crc32EPKhPh` — the name appears length-prefixed.
pub(crate) fn mangles(symbol: &str, name: &str) -> bool {
    let Some(rest) = symbol.strip_prefix("_Z") else {
        return false;
    };
    let needle = format!("{}{name}", name.len());
    rest.match_indices(&needle)
        .any(|(i, _)| !rest[..i].ends_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangled_names_are_recognised_by_their_length_prefix() {
        assert!(mangles("_Z5crc32PKhPh", "crc32"));
        assert!(mangles("_ZN2ns5crc32EPKhPh", "crc32"));
        assert!(!mangles("_Z11crc32_tablePh", "crc32"));
        assert!(!mangles("_Z15crc32abcdefghijPh", "crc32"));
        assert!(!mangles("crc32", "crc32"));
    }

    #[test]
    fn anything_but_an_elf_object_has_no_symbols() {
        assert_eq!(exported_functions(b""), None);
        assert_eq!(exported_functions(b"\x7fELF\x02\x01"), None);
        assert_eq!(exported_functions(b"not an object at all"), None);
        // A header whose tables point outside the object.
        let mut h = vec![0u8; 64];
        h[..6].copy_from_slice(b"\x7fELF\x02\x01");
        h[0x28..0x30].copy_from_slice(&u64::MAX.to_le_bytes());
        h[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        h[0x3C..0x3E].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(exported_functions(&h), None);
    }

    #[test]
    fn this_test_binary_exports_nothing_but_reads_as_elf() {
        // An executable has a dynamic symbol table of imports, which are
        // undefined: the reader must skip them rather than list them.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let names = exported_functions(&exe).unwrap();
        assert!(
            !names.iter().any(|n| n == "malloc" || n == "dlopen"),
            "{names:?}"
        );
    }
}
