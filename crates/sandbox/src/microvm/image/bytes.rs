//! Reading raw images: byte search, little-endian fields and the sections
//! of a 64-bit ELF file.

pub(super) const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Where `needle` first occurs in `haystack`.
pub(super) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let mut at = 0;
    while let Some(i) = haystack.get(at..)?.iter().position(|&b| b == first) {
        let pos = at + i;
        if haystack.get(pos..pos + needle.len())? == needle {
            return Some(pos);
        }
        at = pos + 1;
    }
    None
}

pub(super) fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

pub(super) fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
}

/// The contents of the section called `wanted` in a 64-bit little-endian
/// ELF file (what x86-64 modules are).
pub(super) fn elf_section<'a>(data: &'a [u8], wanted: &str) -> Result<Option<&'a [u8]>, String> {
    if !data.starts_with(ELF_MAGIC) {
        return Err("not an ELF file".into());
    }
    if data.get(4..6) != Some(&[2u8, 1][..]) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let truncated = || "truncated ELF file".to_string();
    let shoff = u64_at(data, 0x28).ok_or_else(truncated)? as usize;
    let shentsize = usize::from(u16_at(data, 0x3a).ok_or_else(truncated)?);
    let shnum = usize::from(u16_at(data, 0x3c).ok_or_else(truncated)?);
    let shstrndx = usize::from(u16_at(data, 0x3e).ok_or_else(truncated)?);
    if shentsize < 64 {
        return Err(format!("odd section header size {shentsize}"));
    }
    // (name offset, file offset, size) of section i.
    let header = |i: usize| -> Option<(usize, &'a [u8])> {
        let base = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let name = u32_at(data, base)? as usize;
        let offset = u64_at(data, base + 24)? as usize;
        let size = u64_at(data, base + 32)? as usize;
        Some((name, data.get(offset..offset.checked_add(size)?)?))
    };
    let (_, names) = header(shstrndx).ok_or_else(truncated)?;
    for i in 0..shnum {
        let (name_at, contents) = header(i).ok_or_else(truncated)?;
        let name = names.get(name_at..).unwrap_or_default();
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if name == wanted.as_bytes() {
            return Ok(Some(contents));
        }
    }
    Ok(None)
}
