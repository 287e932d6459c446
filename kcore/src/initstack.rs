//! The initial process stack: argc, argv, envp, the auxiliary vector and their strings.
//!
//! [`build`] lays the stack out as Linux's `create_elf_tables` does, for 8-byte words
//! (ELFCLASS64) and 4-byte words (ELFCLASS32), so that musl's and glibc's start code
//! (`_start` → `__libc_start_main`, `__init_libc` / `_dl_aux_init`) read it unchanged.
//! From the stack top down:
//!
//! ```text
//! top ->  one zero word                          (so the last string never touches top)
//!         AT_EXECFN string                        NUL-terminated
//!         envp strings, envp[0] lowest            contiguous, each NUL-terminated
//!         argv strings, argv[0] lowest            contiguous, each NUL-terminated
//!         AT_PLATFORM string                      "x86_64" or "i686"
//!         16 random bytes                         AT_RANDOM
//!         zero padding                            so that sp % 16 == 0
//!         auxv: (type, value) word pairs          ending with AT_NULL
//!         envp pointers, NULL
//!         argv pointers, NULL
//! sp ->   argc
//! ```
//!
//! The auxv has AT_PHDR, AT_PHENT, AT_PHNUM, AT_PAGESZ (4096), AT_BASE (0: no interpreter),
//! AT_FLAGS (0), AT_ENTRY, AT_UID, AT_EUID, AT_GID, AT_EGID, AT_SECURE (0), AT_RANDOM,
//! AT_HWCAP, AT_HWCAP2 (0), AT_CLKTCK, AT_PLATFORM, AT_EXECFN and AT_NULL. There is no
//! AT_SYSINFO or AT_SYSINFO_EHDR: without a vDSO, libc makes real system calls (i386 glibc
//! and musl use `int 0x80` when AT_SYSINFO is absent).
//!
//! The image is at most [`MAX_IMAGE`] bytes; larger argument lists are refused with
//! [`StackError::TooLarge`], as Linux refuses one beyond ARG_MAX with E2BIG.

use crate::elf::{Class, LoadPlan};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// The largest stack image [`build`] produces, strings and pointers included.
pub const MAX_IMAGE: usize = 256 * 1024;
/// AT_PAGESZ.
pub const PAGE_SIZE: u64 = 4096;
/// AT_CLKTCK as Linux reports it (USER_HZ).
pub const CLOCK_TICKS: u64 = 100;

/// Auxiliary vector types (`<elf.h>` AT_*).
pub mod at {
    /// End of the vector.
    pub const NULL: u64 = 0;
    /// Program headers' address.
    pub const PHDR: u64 = 3;
    /// Size of one program header.
    pub const PHENT: u64 = 4;
    /// Number of program headers.
    pub const PHNUM: u64 = 5;
    /// Page size.
    pub const PAGESZ: u64 = 6;
    /// Interpreter base (0: none).
    pub const BASE: u64 = 7;
    /// Flags (0).
    pub const FLAGS: u64 = 8;
    /// The program's entry point.
    pub const ENTRY: u64 = 9;
    /// Real uid.
    pub const UID: u64 = 11;
    /// Effective uid.
    pub const EUID: u64 = 12;
    /// Real gid.
    pub const GID: u64 = 13;
    /// Effective gid.
    pub const EGID: u64 = 14;
    /// Address of the platform string.
    pub const PLATFORM: u64 = 15;
    /// CPU feature bits (CPUID.1:EDX on x86).
    pub const HWCAP: u64 = 16;
    /// Clock ticks per second (for `times`).
    pub const CLKTCK: u64 = 17;
    /// Secure mode (setuid): 0.
    pub const SECURE: u64 = 23;
    /// Address of 16 random bytes.
    pub const RANDOM: u64 = 25;
    /// More CPU feature bits.
    pub const HWCAP2: u64 = 26;
    /// Address of the executed file's name.
    pub const EXECFN: u64 = 31;
}

/// What the initial stack is built from.
#[derive(Debug, Clone)]
pub struct StackSpec<'a> {
    /// Word size: 8 bytes for [`Class::Elf64`], 4 for [`Class::Elf32`].
    pub class: Class,
    /// The stack top (exclusive end of the image); 16-byte aligned.
    pub top: u64,
    /// argv (no NUL bytes inside).
    pub argv: &'a [Vec<u8>],
    /// envp (no NUL bytes inside).
    pub envp: &'a [Vec<u8>],
    /// AT_EXECFN: the path the program was started as.
    pub execfn: &'a [u8],
    /// AT_PHDR.
    pub phdr: u64,
    /// AT_PHENT.
    pub phent: u64,
    /// AT_PHNUM.
    pub phnum: u64,
    /// AT_ENTRY.
    pub entry: u64,
    /// The 16 bytes AT_RANDOM points at (libc seeds its stack protector and pointer guard).
    pub random: [u8; 16],
    /// AT_HWCAP: CPUID.1:EDX.
    pub hwcap: u32,
    /// AT_UID and AT_EUID.
    pub uid: u32,
    /// AT_GID and AT_EGID.
    pub gid: u32,
    /// AT_CLKTCK.
    pub clock_ticks: u64,
    /// AT_PLATFORM.
    pub platform: &'a [u8],
}

impl<'a> StackSpec<'a> {
    /// The spec for a planned program: its class, AT_PHDR/PHENT/PHNUM/ENTRY and platform,
    /// uid and gid 0 and [`CLOCK_TICKS`].
    pub fn for_plan(
        plan: &LoadPlan,
        top: u64,
        argv: &'a [Vec<u8>],
        envp: &'a [Vec<u8>],
        execfn: &'a [u8],
        random: [u8; 16],
        hwcap: u32,
    ) -> StackSpec<'a> {
        StackSpec {
            class: plan.class,
            top,
            argv,
            envp,
            execfn,
            phdr: plan.phdr_addr,
            phent: plan.phent,
            phnum: plan.phnum,
            entry: plan.entry,
            random,
            hwcap,
            uid: 0,
            gid: 0,
            clock_ticks: CLOCK_TICKS,
            platform: plan.class.platform(),
        }
    }
}

/// The built stack: copy `bytes` to `[sp, top)` and start the program with `rsp`/`esp = sp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackImage {
    /// The image; `bytes[0..word]` is argc.
    pub bytes: Vec<u8>,
    /// The initial stack pointer: `top - bytes.len()`, 16-byte aligned, pointing at argc.
    pub sp: u64,
}

/// Which string could not be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StringId {
    /// argv\[i\].
    Arg(usize),
    /// envp\[i\].
    Env(usize),
    /// AT_EXECFN.
    ExecFn,
    /// AT_PLATFORM.
    Platform,
}

impl fmt::Display for StringId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StringId::Arg(i) => write!(f, "argv[{i}]"),
            StringId::Env(i) => write!(f, "envp[{i}]"),
            StringId::ExecFn => f.write_str("the executable path"),
            StringId::Platform => f.write_str("the platform string"),
        }
    }
}

/// Why the stack could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackError {
    /// A string holds a NUL byte, which a C string cannot carry.
    NulInString {
        /// Which string.
        which: StringId,
    },
    /// The image would be larger than [`MAX_IMAGE`].
    TooLarge {
        /// Its size in bytes.
        size: usize,
        /// [`MAX_IMAGE`].
        limit: usize,
    },
    /// `top` is not 16-byte aligned.
    TopMisaligned {
        /// The top given.
        top: u64,
    },
    /// An address or value does not fit the word size (or the image would wrap below 0).
    AddressRange {
        /// The top given.
        top: u64,
    },
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StackError::NulInString { which } => {
                write!(f, "{which} contains a NUL byte")
            }
            StackError::TooLarge { size, limit } => write!(
                f,
                "arguments and environment need a {size}-byte initial stack, more than the {limit}-byte limit"
            ),
            StackError::TopMisaligned { top } => {
                write!(f, "stack top {top:#x} is not 16-byte aligned")
            }
            StackError::AddressRange { top } => write!(
                f,
                "the initial stack below {top:#x} or an auxv value does not fit the program's word size"
            ),
        }
    }
}

impl core::error::Error for StackError {}

/// Builds the initial stack image. See the module docs for the layout.
pub fn build(spec: &StackSpec<'_>) -> Result<StackImage, StackError> {
    let word = spec.class.word_size();
    if !spec.top.is_multiple_of(16) {
        return Err(StackError::TopMisaligned { top: spec.top });
    }
    let range = StackError::AddressRange { top: spec.top };
    let max_value = match spec.class {
        Class::Elf64 => u64::MAX,
        Class::Elf32 => u64::from(u32::MAX),
    };
    // The top itself may be 2^32 for a compat process (the image ends just below it).
    if spec.top > max_value.saturating_add(1) {
        return Err(range);
    }
    for v in [
        spec.phdr,
        spec.phent,
        spec.phnum,
        spec.entry,
        spec.clock_ticks,
    ] {
        if v > max_value {
            return Err(range);
        }
    }

    let check = |s: &[u8], which| {
        if s.contains(&0) {
            Err(StackError::NulInString { which })
        } else {
            Ok(s.len() + 1)
        }
    };
    let mut strings =
        check(spec.execfn, StringId::ExecFn)? + check(spec.platform, StringId::Platform)?;
    for (i, e) in spec.envp.iter().enumerate() {
        strings = strings.saturating_add(check(e, StringId::Env(i))?);
    }
    for (i, a) in spec.argv.iter().enumerate() {
        strings = strings.saturating_add(check(a, StringId::Arg(i))?);
    }

    const AUXV_ENTRIES: usize = 19;
    let pointer_words = 1usize
        .saturating_add(spec.argv.len())
        .saturating_add(1)
        .saturating_add(spec.envp.len())
        .saturating_add(1)
        .saturating_add(2 * AUXV_ENTRIES);
    let unaligned = pointer_words
        .saturating_mul(word)
        .saturating_add(16)
        .saturating_add(strings)
        .saturating_add(word);
    let size = unaligned.next_multiple_of(16);
    if size > MAX_IMAGE {
        return Err(StackError::TooLarge {
            size,
            limit: MAX_IMAGE,
        });
    }
    let sp = spec.top.checked_sub(size as u64).ok_or(range)?;

    // Offsets are relative to sp; addresses are sp + offset.
    let mut bytes = vec![0u8; size];
    let mut cursor = size - word; // the zero word at the top
    let put_str = |bytes: &mut [u8], cursor: &mut usize, s: &[u8]| -> u64 {
        *cursor -= s.len() + 1;
        bytes[*cursor..*cursor + s.len()].copy_from_slice(s);
        sp + *cursor as u64
    };
    let execfn = put_str(&mut bytes, &mut cursor, spec.execfn);
    let env_len: usize = spec.envp.iter().map(|e| e.len() + 1).sum();
    let arg_len: usize = spec.argv.iter().map(|a| a.len() + 1).sum();
    let mut env_ptrs = Vec::with_capacity(spec.envp.len());
    cursor -= env_len;
    let mut at = cursor;
    for e in spec.envp {
        bytes[at..at + e.len()].copy_from_slice(e);
        env_ptrs.push(sp + at as u64);
        at += e.len() + 1;
    }
    let mut arg_ptrs = Vec::with_capacity(spec.argv.len());
    cursor -= arg_len;
    let mut at = cursor;
    for a in spec.argv {
        bytes[at..at + a.len()].copy_from_slice(a);
        arg_ptrs.push(sp + at as u64);
        at += a.len() + 1;
    }
    let platform = put_str(&mut bytes, &mut cursor, spec.platform);
    cursor -= 16;
    bytes[cursor..cursor + 16].copy_from_slice(&spec.random);
    let random = sp + cursor as u64;

    let auxv: [(u64, u64); AUXV_ENTRIES] = [
        (at::PHDR, spec.phdr),
        (at::PHENT, spec.phent),
        (at::PHNUM, spec.phnum),
        (at::PAGESZ, PAGE_SIZE),
        (at::BASE, 0),
        (at::FLAGS, 0),
        (at::ENTRY, spec.entry),
        (at::UID, spec.uid.into()),
        (at::EUID, spec.uid.into()),
        (at::GID, spec.gid.into()),
        (at::EGID, spec.gid.into()),
        (at::SECURE, 0),
        (at::RANDOM, random),
        (at::HWCAP, spec.hwcap.into()),
        (at::HWCAP2, 0),
        (at::CLKTCK, spec.clock_ticks),
        (at::PLATFORM, platform),
        (at::EXECFN, execfn),
        (at::NULL, 0),
    ];
    // Every address is below top, and top fits the word (checked), so the truncating
    // stores below lose nothing.
    let mut words = Vec::with_capacity(pointer_words);
    words.push(spec.argv.len() as u64);
    words.extend_from_slice(&arg_ptrs);
    words.push(0);
    words.extend_from_slice(&env_ptrs);
    words.push(0);
    for (key, value) in auxv {
        words.push(key);
        words.push(value);
    }
    for (i, w) in words.iter().enumerate() {
        bytes[i * word..(i + 1) * word].copy_from_slice(&w.to_le_bytes()[..word]);
    }
    Ok(StackImage { bytes, sp })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a libc's start code reads from the stack.
    #[derive(Debug)]
    struct Parsed {
        argv: Vec<Vec<u8>>,
        envp: Vec<Vec<u8>>,
        auxv: Vec<(u64, u64)>,
    }

    /// Reads an image as musl's `_start_c` / `__init_libc` do: argc at sp, argv pointers
    /// after it, envp after argv's NULL, auxv after envp's NULL. Every pointer is an
    /// address that must land inside `[sp, top)`.
    fn parse(image: &StackImage, top: u64, word: usize) -> Parsed {
        let b = &image.bytes;
        assert_eq!(image.sp + b.len() as u64, top, "the image ends at the top");
        let read_word = |off: usize| -> u64 {
            let mut w = [0u8; 8];
            w[..word].copy_from_slice(&b[off..off + word]);
            u64::from_le_bytes(w)
        };
        let cstr = |addr: u64| -> Vec<u8> {
            assert!(
                addr >= image.sp && addr < top,
                "pointer {addr:#x} outside the stack"
            );
            let off = (addr - image.sp) as usize;
            let len = b[off..]
                .iter()
                .position(|&c| c == 0)
                .expect("NUL-terminated");
            b[off..off + len].to_vec()
        };
        let argc = read_word(0) as usize;
        let mut off = word;
        let argv: Vec<Vec<u8>> = (0..argc).map(|i| cstr(read_word(off + i * word))).collect();
        off += argc * word;
        assert_eq!(read_word(off), 0, "argv ends with NULL");
        off += word;
        let mut envp = Vec::new();
        loop {
            let p = read_word(off);
            off += word;
            if p == 0 {
                break;
            }
            envp.push(cstr(p));
        }
        let mut auxv = Vec::new();
        loop {
            let (k, v) = (read_word(off), read_word(off + word));
            off += 2 * word;
            auxv.push((k, v));
            if k == at::NULL {
                break;
            }
        }
        Parsed { argv, envp, auxv }
    }

    fn aux(p: &Parsed, key: u64) -> u64 {
        let found: Vec<u64> = p.auxv.iter().filter(|e| e.0 == key).map(|e| e.1).collect();
        assert_eq!(found.len(), 1, "exactly one auxv entry {key}");
        found[0]
    }

    fn bytes_at(image: &StackImage, addr: u64, len: usize) -> &[u8] {
        let off = (addr - image.sp) as usize;
        &image.bytes[off..off + len]
    }

    fn spec<'a>(class: Class, top: u64, argv: &'a [Vec<u8>], envp: &'a [Vec<u8>]) -> StackSpec<'a> {
        StackSpec {
            class,
            top,
            argv,
            envp,
            execfn: b"/bin/prog",
            phdr: 0x400040,
            phent: if class == Class::Elf64 { 56 } else { 32 },
            phnum: 9,
            entry: 0x401234,
            random: *b"0123456789abcdef",
            hwcap: 0x178b_fbff,
            uid: 0,
            gid: 0,
            clock_ticks: CLOCK_TICKS,
            platform: class.platform(),
        }
    }

    fn strs(v: &[&str]) -> Vec<Vec<u8>> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    fn check_round_trip(class: Class, top: u64) {
        let word = class.word_size();
        let argv = vec![
            b"prog".to_vec(),
            b"".to_vec(),
            b"with space".to_vec(),
            vec![0xff, 0x80],
        ];
        let envp = strs(&["PATH=/bin", "HOME=/", "EMPTY="]);
        let s = spec(class, top, &argv, &envp);
        let image = build(&s).unwrap();
        assert_eq!(image.sp % 16, 0, "SysV ABI: sp is 16-byte aligned at entry");
        assert_eq!(image.bytes.len() % 16, 0);
        let p = parse(&image, top, word);
        assert_eq!(p.argv, argv);
        assert_eq!(p.envp, envp);
        let expected_keys = [
            3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 23, 25, 16, 26, 17, 15, 31, 0,
        ];
        assert_eq!(
            p.auxv.iter().map(|e| e.0).collect::<Vec<_>>(),
            expected_keys
        );
        assert_eq!(aux(&p, at::PHDR), 0x400040);
        assert_eq!(aux(&p, at::PHENT), s.phent);
        assert_eq!(aux(&p, at::PHNUM), 9);
        assert_eq!(aux(&p, at::PAGESZ), 4096);
        assert_eq!(aux(&p, at::BASE), 0);
        assert_eq!(aux(&p, at::FLAGS), 0);
        assert_eq!(aux(&p, at::ENTRY), 0x401234);
        for key in [at::UID, at::EUID, at::GID, at::EGID, at::SECURE, at::HWCAP2] {
            assert_eq!(aux(&p, key), 0);
        }
        assert_eq!(aux(&p, at::HWCAP), 0x178b_fbff);
        assert_eq!(aux(&p, at::CLKTCK), 100);
        assert_eq!(
            bytes_at(&image, aux(&p, at::RANDOM), 16),
            b"0123456789abcdef"
        );
        let platform = aux(&p, at::PLATFORM);
        let plat = class.platform();
        assert_eq!(
            bytes_at(&image, platform, plat.len() + 1),
            &[plat, b"\0"].concat()[..]
        );
        let execfn = aux(&p, at::EXECFN);
        assert_eq!(bytes_at(&image, execfn, 10), b"/bin/prog\0");
        // Strings are above the pointers, the random bytes above those, execfn highest,
        // and one zero word is left at the top.
        let pointers_end = image.sp + ((1 + 4 + 1 + 3 + 1 + 2 * 19) * word) as u64;
        assert!(aux(&p, at::RANDOM) >= pointers_end);
        assert!(platform >= aux(&p, at::RANDOM) + 16);
        assert_eq!(execfn + 10, top - word as u64);
        assert!(
            image.bytes[image.bytes.len() - word..]
                .iter()
                .all(|&b| b == 0)
        );
        // argv strings are contiguous with argv[0] lowest, and envp's follow them.
        let arg0 = u64::from_le_bytes({
            let mut w = [0u8; 8];
            w[..word].copy_from_slice(&image.bytes[word..2 * word]);
            w
        });
        assert_eq!(
            bytes_at(&image, arg0, 4 + 1 + 1 + 11 + 3),
            b"prog\0\0with space\0\xff\x80\0"
        );
        assert_eq!(bytes_at(&image, arg0 + 20, 10), b"PATH=/bin\0");
    }

    #[test]
    fn round_trip_64() {
        check_round_trip(Class::Elf64, 0x7fff_ffff_f000);
    }

    #[test]
    fn round_trip_32() {
        check_round_trip(Class::Elf32, 0xffff_e000);
        // Just below 4 GiB: the top is 2^32 itself.
        check_round_trip(Class::Elf32, 0x1_0000_0000);
    }

    #[test]
    fn words_are_four_bytes_in_compat() {
        let argv = strs(&["a"]);
        let image = build(&spec(Class::Elf32, 0xffff_e000, &argv, &[])).unwrap();
        assert_eq!(&image.bytes[..4], &1u32.to_le_bytes());
        let arg0 = u32::from_le_bytes(image.bytes[4..8].try_into().unwrap());
        assert!(u64::from(arg0) > image.sp && u64::from(arg0) < 0xffff_e000);
        assert_eq!(&image.bytes[8..12], &[0; 4], "argv NULL");
        assert_eq!(&image.bytes[12..16], &[0; 4], "envp NULL");
        assert_eq!(&image.bytes[16..20], &3u32.to_le_bytes(), "AT_PHDR");
        assert_eq!(&image.bytes[20..24], &0x400040u32.to_le_bytes());
    }

    #[test]
    fn empty_argv_and_envp() {
        for class in [Class::Elf64, Class::Elf32] {
            let image = build(&spec(class, 0x10_0000, &[], &[])).unwrap();
            let p = parse(&image, 0x10_0000, class.word_size());
            assert!(p.argv.is_empty() && p.envp.is_empty());
            assert_eq!(p.auxv.len(), 19);
            assert_eq!(image.sp % 16, 0);
        }
    }

    #[test]
    fn alignment_for_every_string_length() {
        for class in [Class::Elf64, Class::Elf32] {
            for len in 0..40 {
                let argv = vec![vec![b'x'; len]];
                let image = build(&spec(class, 0x7000_0000, &argv, &[])).unwrap();
                assert_eq!(image.sp % 16, 0, "{class:?} {len}");
                assert_eq!(parse(&image, 0x7000_0000, class.word_size()).argv, argv);
            }
        }
    }

    #[test]
    fn limits() {
        let big = vec![vec![b'a'; 64 * 1024]; 3];
        let image = build(&spec(Class::Elf64, 0x7fff_0000, &big, &[])).unwrap();
        assert!(image.bytes.len() <= MAX_IMAGE);
        let too_big = vec![vec![b'a'; 64 * 1024]; 4];
        let e = build(&spec(Class::Elf64, 0x7fff_0000, &too_big, &[])).unwrap_err();
        assert!(matches!(e, StackError::TooLarge { size, limit: MAX_IMAGE } if size > MAX_IMAGE));
        // Many tiny strings: the pointers count too.
        let many = vec![Vec::new(); MAX_IMAGE / 8];
        assert!(matches!(
            build(&spec(Class::Elf64, 0x7fff_0000, &[], &many)),
            Err(StackError::TooLarge { .. })
        ));
        let fewer = vec![Vec::new(); MAX_IMAGE / 16];
        assert!(build(&spec(Class::Elf32, 0x7fff_0000, &[], &fewer)).is_ok());
        // The boundary: find the largest single argument that fits.
        let fits =
            |n: usize| build(&spec(Class::Elf64, 0x7fff_0000, &[vec![b'z'; n]], &[])).is_ok();
        let mut n = MAX_IMAGE - 512;
        while fits(n + 1) {
            n += 1;
        }
        let image = build(&spec(Class::Elf64, 0x7fff_0000, &[vec![b'z'; n]], &[])).unwrap();
        assert!(image.bytes.len() > MAX_IMAGE - 16 && image.bytes.len() <= MAX_IMAGE);
        assert_eq!(
            build(&spec(Class::Elf64, 0x7fff_0000, &[vec![b'z'; n + 1]], &[])),
            Err(StackError::TooLarge {
                size: MAX_IMAGE + 16,
                limit: MAX_IMAGE
            })
        );
    }

    #[test]
    fn refusals() {
        let argv = vec![b"a\0b".to_vec()];
        assert_eq!(
            build(&spec(Class::Elf64, 0x100000, &argv, &[])),
            Err(StackError::NulInString {
                which: StringId::Arg(0)
            })
        );
        let envp = vec![b"A=1".to_vec(), b"B=\0".to_vec()];
        let e = build(&spec(Class::Elf64, 0x100000, &[], &envp)).unwrap_err();
        assert_eq!(e.to_string(), "envp[1] contains a NUL byte");
        let mut s = spec(Class::Elf64, 0x100000, &[], &[]);
        s.execfn = b"x\0";
        assert_eq!(
            build(&s),
            Err(StackError::NulInString {
                which: StringId::ExecFn
            })
        );
        let s = spec(Class::Elf64, 0x100008, &[], &[]);
        assert_eq!(build(&s), Err(StackError::TopMisaligned { top: 0x100008 }));
        let s = spec(Class::Elf64, 0x100, &[], &[]);
        assert_eq!(build(&s), Err(StackError::AddressRange { top: 0x100 }));
        let s = spec(Class::Elf32, 0x1_0000_0010, &[], &[]);
        assert_eq!(
            build(&s),
            Err(StackError::AddressRange { top: 0x1_0000_0010 })
        );
        let mut s = spec(Class::Elf32, 0xffff_e000, &[], &[]);
        s.entry = 0x1_0000_0000;
        assert_eq!(
            build(&s),
            Err(StackError::AddressRange { top: 0xffff_e000 })
        );
    }

    #[test]
    fn for_plan_takes_the_plan_fields() {
        let plan = LoadPlan {
            class: Class::Elf32,
            kind: crate::elf::Kind::Exec,
            bias: 0,
            entry: 0x0804_9570,
            segments: Vec::new(),
            phdr_addr: 0x0804_8034,
            phent: 32,
            phnum: 8,
            brk_start: 0x0810_0000,
            stack_exec: false,
            tls: None,
        };
        let argv = strs(&["p"]);
        let s = StackSpec::for_plan(
            &plan,
            0xffff_d000,
            &argv,
            &[],
            b"bin/p",
            [7; 16],
            0xbfebfbff,
        );
        let image = build(&s).unwrap();
        let p = parse(&image, 0xffff_d000, 4);
        assert_eq!(aux(&p, at::PHDR), 0x0804_8034);
        assert_eq!(aux(&p, at::PHENT), 32);
        assert_eq!(aux(&p, at::PHNUM), 8);
        assert_eq!(aux(&p, at::ENTRY), 0x0804_9570);
        assert_eq!(aux(&p, at::HWCAP), 0xbfebfbff);
        assert_eq!(bytes_at(&image, aux(&p, at::PLATFORM), 5), b"i686\0");
        assert_eq!(bytes_at(&image, aux(&p, at::RANDOM), 16), &[7; 16]);
    }

    proptest! {
        #[test]
        fn proptest_round_trip(
            argv in proptest::collection::vec(proptest::collection::vec(1u8..=255, 0..40), 0..20),
            envp in proptest::collection::vec(proptest::collection::vec(1u8..=255, 0..40), 0..20),
            is64 in any::<bool>(),
            top_pages in 0x100u64..0xf0000,
        ) {
            let class = if is64 { Class::Elf64 } else { Class::Elf32 };
            let top = top_pages * 4096;
            let image = build(&spec(class, top, &argv, &envp)).unwrap();
            prop_assert_eq!(image.sp % 16, 0);
            let p = parse(&image, top, class.word_size());
            prop_assert_eq!(p.argv, argv);
            prop_assert_eq!(p.envp, envp);
        }
    }
}
