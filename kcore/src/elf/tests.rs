//! Tests of the ELF plan: real programs compiled here, hand-built headers, and damage.

use super::*;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------
// Hand-built ELF files: exact control over every field.

#[derive(Clone, Copy)]
struct Ph {
    p_type: u32,
    flags: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
    memsz: u64,
    align: u64,
}

const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

fn load(flags: u32, offset: u64, vaddr: u64, filesz: u64, memsz: u64) -> Ph {
    Ph {
        p_type: 1,
        flags,
        offset,
        vaddr,
        filesz,
        memsz,
        align: 0x1000,
    }
}

fn other(p_type: u32, flags: u32, offset: u64, vaddr: u64, size: u64) -> Ph {
    Ph {
        p_type,
        flags,
        offset,
        vaddr,
        filesz: size,
        memsz: size,
        align: 8,
    }
}

/// A hand-made ELF: header, program headers right after it, then zero bytes up to `len`
/// (with `extra` copied in at their offsets).
#[derive(Clone)]
pub(crate) struct Hand {
    class: Class,
    e_type: u16,
    machine: u16,
    entry: u64,
    phdrs: Vec<Ph>,
    len: usize,
    extra: Vec<(usize, Vec<u8>)>,
    /// e_phoff, if not right after the ELF header.
    phoff: Option<usize>,
}

impl Hand {
    /// A good static 64-bit program: headers+rodata, text, data+bss; GNU_STACK RW.
    pub(crate) fn good64() -> Hand {
        Hand {
            class: Class::Elf64,
            e_type: 2,
            machine: 62,
            entry: 0x401010,
            phdrs: vec![
                load(R, 0, 0x400000, 0x400, 0x400),
                load(R | X, 0x1000, 0x401000, 0x200, 0x200),
                load(R | W, 0x2040, 0x403040, 0x40, 0x3000),
                other(0x6474_e551, R | W, 0, 0, 0),
            ],
            len: 0x2080,
            extra: Vec::new(),
            phoff: None,
        }
    }

    pub(crate) fn good32() -> Hand {
        Hand {
            class: Class::Elf32,
            machine: 3,
            entry: 0x0804_9000,
            phdrs: vec![
                load(R, 0, 0x0804_8000, 0x300, 0x300),
                load(R | X, 0x1000, 0x0804_9000, 0x200, 0x200),
                load(R | W, 0x2010, 0x0804_b010, 0x10, 0x100),
            ],
            ..Hand::good64()
        }
    }

    /// [`Hand::good64`] dynamically linked: a PT_INTERP naming musl's loader.
    pub(crate) fn dynamic64() -> Hand {
        let mut h = Hand::good64();
        let interp = b"/lib/ld-musl-x86_64.so.1\0";
        h.phdrs
            .insert(0, other(3, R, 0x300, 0x400300, interp.len() as u64));
        h.extra.push((0x300, interp.to_vec()));
        h
    }

    fn phoff(&self) -> usize {
        if let Some(at) = self.phoff {
            return at;
        }
        match self.class {
            Class::Elf64 => 64,
            Class::Elf32 => 52,
        }
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.len];
        let is64 = self.class == Class::Elf64;
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = if is64 { 2 } else { 1 };
        b[5] = 1;
        b[6] = 1;
        let put = |b: &mut Vec<u8>, at: usize, v: u64, n: usize| {
            b[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
        };
        put(&mut b, 16, self.e_type.into(), 2);
        put(&mut b, 18, self.machine.into(), 2);
        put(&mut b, 20, 1, 4);
        let phoff = self.phoff();
        let phnum = self.phdrs.len() as u64;
        if is64 {
            put(&mut b, 24, self.entry, 8);
            put(&mut b, 32, phoff as u64, 8);
            put(&mut b, 52, 64, 2);
            put(&mut b, 54, 56, 2);
            put(&mut b, 56, phnum, 2);
            put(&mut b, 58, 64, 2);
        } else {
            put(&mut b, 24, self.entry, 4);
            put(&mut b, 28, phoff as u64, 4);
            put(&mut b, 40, 52, 2);
            put(&mut b, 42, 32, 2);
            put(&mut b, 44, phnum, 2);
            put(&mut b, 46, 40, 2);
        }
        for (i, ph) in self.phdrs.iter().enumerate() {
            if is64 {
                let at = phoff + 56 * i;
                put(&mut b, at, ph.p_type.into(), 4);
                put(&mut b, at + 4, ph.flags.into(), 4);
                put(&mut b, at + 8, ph.offset, 8);
                put(&mut b, at + 16, ph.vaddr, 8);
                put(&mut b, at + 24, ph.vaddr, 8);
                put(&mut b, at + 32, ph.filesz, 8);
                put(&mut b, at + 40, ph.memsz, 8);
                put(&mut b, at + 48, ph.align, 8);
            } else {
                let at = phoff + 32 * i;
                put(&mut b, at, ph.p_type.into(), 4);
                put(&mut b, at + 4, ph.offset, 4);
                put(&mut b, at + 8, ph.vaddr, 4);
                put(&mut b, at + 12, ph.vaddr, 4);
                put(&mut b, at + 16, ph.filesz, 4);
                put(&mut b, at + 20, ph.memsz, 4);
                put(&mut b, at + 24, ph.flags.into(), 4);
                put(&mut b, at + 28, ph.align, 4);
            }
        }
        for (at, data) in &self.extra {
            b[*at..*at + data.len()].copy_from_slice(data);
        }
        b
    }

    fn plan(&self) -> Result<LoadPlan, ElfError> {
        plan(&self.bytes())
    }
}

fn seg_err(hand: &Hand, index: usize) -> SegmentProblem {
    match hand.plan() {
        Err(ElfError::BadSegment { index: i, problem }) if i == index => problem,
        other => panic!("expected a BadSegment {index} error, got {other:?}"),
    }
}

#[test]
fn hand_built_static_64() {
    let p = Hand::good64().plan().unwrap();
    assert_eq!(p.class, Class::Elf64);
    assert_eq!(p.kind, Kind::Exec);
    assert_eq!(p.bias, 0);
    assert_eq!(p.entry, 0x401010);
    assert_eq!(
        p.segments,
        vec![
            Segment {
                vaddr: 0x400000,
                memsz: 0x400,
                file_offset: 0,
                filesz: 0x400,
                prot: Prot {
                    read: true,
                    write: false,
                    exec: false
                }
            },
            Segment {
                vaddr: 0x401000,
                memsz: 0x200,
                file_offset: 0x1000,
                filesz: 0x200,
                prot: Prot {
                    read: true,
                    write: false,
                    exec: true
                }
            },
            Segment {
                vaddr: 0x403040,
                memsz: 0x3000,
                file_offset: 0x2040,
                filesz: 0x40,
                prot: Prot {
                    read: true,
                    write: true,
                    exec: false
                }
            },
        ]
    );
    assert_eq!(p.phdr_addr, 0x400040);
    assert_eq!((p.phent, p.phnum), (56, 4));
    assert_eq!(p.brk_start, 0x407000);
    assert!(!p.stack_exec);
    assert_eq!(p.tls, None);
    assert_eq!(p.segments[2].page_start(), 0x403000);
    assert_eq!(p.segments[2].page_end(), 0x407000);
}

#[test]
fn hand_built_static_32() {
    let p = Hand::good32().plan().unwrap();
    assert_eq!((p.class, p.kind, p.bias), (Class::Elf32, Kind::Exec, 0));
    assert_eq!(p.phdr_addr, 0x0804_8034);
    assert_eq!((p.phent, p.phnum), (32, 3));
    assert_eq!(p.brk_start, 0x0804_c000);
    assert_eq!(p.segments.len(), 3);
}

#[test]
fn static_pie_bias_and_alignment() {
    let mut h = Hand::good64();
    h.e_type = 3;
    for ph in &mut h.phdrs {
        ph.vaddr = ph.vaddr.saturating_sub(0x400000);
    }
    h.entry = 0x1010;
    let p = h.plan().unwrap();
    assert_eq!((p.kind, p.bias), (Kind::StaticPie, PIE_BASE_64));
    assert_eq!(p.entry, PIE_BASE_64 + 0x1010);
    assert_eq!(p.segments[0].vaddr, PIE_BASE_64);
    assert_eq!(p.phdr_addr, PIE_BASE_64 + 0x40);
    // A 2 MiB alignment is kept.
    h.phdrs[1].align = 0x20_0000;
    let p = h.plan().unwrap();
    assert_eq!(p.bias, PIE_BASE_64.next_multiple_of(0x20_0000));
    assert_eq!(p.bias % 0x20_0000, 0);

    let mut h = Hand::good32();
    h.e_type = 3;
    for ph in &mut h.phdrs {
        ph.vaddr -= 0x0804_8000;
    }
    h.entry = 0x1000;
    let p = h.plan().unwrap();
    assert_eq!((p.class, p.bias), (Class::Elf32, PIE_BASE_32));
    assert_eq!(p.entry, 0x5655_6000);
}

#[test]
fn pt_phdr_tls_and_stack() {
    let mut h = Hand::good64();
    h.phdrs.insert(0, other(6, R, 64, 0x400040, 5 * 56));
    h.phdrs.push(other(7, R, 0x2040, 0x403040, 0x10));
    h.phdrs[5].memsz = 0x30;
    h.phdrs[5].align = 16;
    h.phdrs[4].flags = R | W | X; // GNU_STACK
    let p = h.plan().unwrap();
    assert_eq!(p.phdr_addr, 0x400040);
    assert_eq!(p.phnum, 6);
    assert!(p.stack_exec);
    assert_eq!(
        p.tls,
        Some(Tls {
            vaddr: 0x403040,
            filesz: 0x10,
            memsz: 0x30,
            align: 16
        })
    );
    // PT_PHDR pointing into bss (not file-backed) or nowhere is refused.
    h.phdrs[0].vaddr = 0x403100;
    assert_eq!(
        h.plan(),
        Err(ElfError::PhdrNotMapped {
            addr: Some(0x403100)
        })
    );
    h.phdrs[0].vaddr = 0x500000;
    assert_eq!(
        h.plan(),
        Err(ElfError::PhdrNotMapped {
            addr: Some(0x500000)
        })
    );
    // Without PT_PHDR, the table is found in whichever PT_LOAD's file bytes hold it.
    let mut h = Hand::good64();
    h.phoff = Some(0x1100);
    let p = h.plan().unwrap();
    assert_eq!(p.phdr_addr, 0x401100);
    h.phoff = Some(0x1180); // runs past the text segment's 0x200 file bytes
    assert_eq!(h.plan(), Err(ElfError::PhdrNotMapped { addr: None }));
    // A table outside every PT_LOAD is refused.
    let mut h = Hand::good64();
    h.phdrs[0].offset = 0x1000;
    h.phdrs[0].vaddr = 0x3ff000;
    h.phdrs[0].filesz = 0;
    h.phdrs[0].memsz = 0x10;
    assert_eq!(h.plan(), Err(ElfError::PhdrNotMapped { addr: None }));
}

#[test]
fn identification_errors() {
    let good = Hand::good64().bytes();
    let with = |at: usize, v: u8| {
        let mut b = good.clone();
        b[at] = v;
        plan(&b)
    };
    assert_eq!(plan(b""), Err(ElfError::NotElf));
    assert_eq!(plan(b"\x7fELF"), Err(ElfError::NotElf));
    assert_eq!(
        plan(b"#!/bin/sh\necho hello world\n"),
        Err(ElfError::NotElf)
    );
    assert_eq!(with(1, b'e'), Err(ElfError::NotElf));
    assert_eq!(with(4, 0), Err(ElfError::BadClass { class: 0 }));
    assert_eq!(with(4, 3), Err(ElfError::BadClass { class: 3 }));
    assert_eq!(with(5, 2), Err(ElfError::NotLittleEndian { data: 2 }));
    assert_eq!(with(6, 0), Err(ElfError::BadVersion { version: 0 }));
    assert_eq!(with(7, 9), Err(ElfError::UnsupportedOsAbi { os_abi: 9 }));
    assert!(with(7, 3).is_ok(), "ELFOSABI_GNU is Linux");
    assert_eq!(with(20, 2), Err(ElfError::BadVersion { version: 2 }));
    // A 64-bit header read as a 32-bit one has the wrong machine for that class.
    assert_eq!(
        with(4, 1),
        Err(ElfError::UnsupportedMachine {
            machine: 62,
            class: Class::Elf32
        })
    );
}

#[test]
fn machine_and_type_errors_say_what_runs() {
    let mut h = Hand::good64();
    h.machine = 183;
    let e = h.plan().unwrap_err();
    assert_eq!(
        e,
        ElfError::UnsupportedMachine {
            machine: 183,
            class: Class::Elf64
        }
    );
    assert_eq!(
        e.to_string(),
        "ELF for EM_AARCH64, this runtime runs x86-64 (ELFCLASS64 EM_X86_64) and i386 (ELFCLASS32 EM_386) programs"
    );
    h.machine = 3;
    assert!(
        h.plan()
            .unwrap_err()
            .to_string()
            .starts_with("ELF for EM_386 with ELFCLASS64, ")
    );
    let mut h = Hand::good32();
    h.machine = 62;
    assert!(
        h.plan()
            .unwrap_err()
            .to_string()
            .starts_with("ELF for EM_X86_64 with ELFCLASS32 (the x32 ABI), ")
    );
    h.machine = 0xfffe;
    assert!(
        h.plan()
            .unwrap_err()
            .to_string()
            .starts_with("ELF for machine 65534, ")
    );

    for (e_type, text) in [
        (
            1,
            "ELF type ET_REL: a relocatable object file, not a program (link it statically)",
        ),
        (4, "ELF type ET_CORE: a core dump, not a program"),
        (0, "ELF type 0 is not ET_EXEC or ET_DYN"),
    ] {
        let mut h = Hand::good64();
        h.e_type = e_type;
        let e = h.plan().unwrap_err();
        assert_eq!(e, ElfError::UnsupportedType { e_type });
        assert_eq!(e.to_string(), text);
    }
}

#[test]
fn program_header_table_errors() {
    let good = Hand::good64().bytes();
    let mut b = good.clone();
    b[54] = 64; // e_phentsize
    assert_eq!(
        plan(&b),
        Err(ElfError::BadPhentsize {
            phentsize: 64,
            expected: 56
        })
    );
    let mut b = good.clone();
    b[56] = 0;
    assert_eq!(plan(&b), Err(ElfError::BadPhnum { phnum: 0 }));
    let mut b = good.clone();
    b[56..58].copy_from_slice(&74u16.to_le_bytes()); // 74 * 56 > 4096
    assert_eq!(plan(&b), Err(ElfError::BadPhnum { phnum: 74 }));
    let mut b = good.clone();
    b[56..58].copy_from_slice(&0xffffu16.to_le_bytes()); // PN_XNUM
    assert_eq!(plan(&b), Err(ElfError::BadPhnum { phnum: 0xffff }));
    let mut b = good.clone();
    b[32..40].copy_from_slice(&0x2060u64.to_le_bytes());
    assert_eq!(
        plan(&b),
        Err(ElfError::PhdrTableOutsideFile {
            phoff: 0x2060,
            size: 4 * 56,
            file_len: 0x2080
        })
    );
    let mut b = good.clone();
    b[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        plan(&b),
        Err(ElfError::PhdrTableOutsideFile { .. })
    ));
    // Nothing to load.
    let mut h = Hand::good64();
    h.phdrs.retain(|ph| ph.p_type != 1);
    assert_eq!(h.plan(), Err(ElfError::NoLoadSegment));
    let mut h = Hand::good64();
    h.phdrs.push(other(0x6474_e551, R | W, 0, 0, 0));
    assert_eq!(
        h.plan(),
        Err(ElfError::DuplicateHeader {
            p_type: 0x6474_e551
        })
    );
    assert_eq!(
        h.plan().unwrap_err().to_string(),
        "more than one PT_GNU_STACK program header"
    );
}

#[test]
fn every_truncation_of_the_header_area_is_an_error() {
    for hand in [Hand::good64(), Hand::good32()] {
        let bytes = hand.bytes();
        let header_area =
            hand.phoff() + hand.phdrs.len() * if hand.class == Class::Elf64 { 56 } else { 32 };
        for len in 0..header_area {
            assert!(
                plan(&bytes[..len]).is_err(),
                "{:?} cut to {len}",
                hand.class
            );
        }
        // Cutting a segment's last file byte is an error too.
        for ph in hand.phdrs.iter().filter(|ph| ph.p_type == 1) {
            let len = (ph.offset + ph.filesz - 1) as usize;
            assert!(
                matches!(
                    plan(&bytes[..len]),
                    Err(ElfError::BadSegment {
                        problem: SegmentProblem::OutsideFile { .. },
                        ..
                    })
                ),
                "{len}"
            );
        }
    }
}

#[test]
fn segment_checks_are_distinct() {
    let mut h = Hand::good64();
    h.phdrs[2].filesz = 0x4000;
    assert_eq!(
        seg_err(&h, 2),
        SegmentProblem::FileSizeAboveMemSize {
            filesz: 0x4000,
            memsz: 0x3000
        }
    );

    let mut h = Hand::good64();
    h.phdrs[2].filesz = 0x41;
    assert_eq!(
        seg_err(&h, 2),
        SegmentProblem::OutsideFile {
            offset: 0x2040,
            filesz: 0x41,
            file_len: 0x2080
        }
    );
    h.phdrs[2].offset = u64::MAX - 0x20;
    assert!(matches!(seg_err(&h, 2), SegmentProblem::OutsideFile { .. }));

    let mut h = Hand::good64();
    h.phdrs[1].vaddr = 0x401008;
    assert_eq!(
        seg_err(&h, 1),
        SegmentProblem::Misaligned {
            vaddr: 0x401008,
            offset: 0x1000
        }
    );

    let mut h = Hand::good64();
    h.phdrs[2].vaddr = u64::MAX - 0xfbf;
    h.phdrs[2].memsz = 0x2000;
    assert_eq!(seg_err(&h, 2), SegmentProblem::Overflow);
    h.phdrs[2].vaddr = 0xffff_ffff_ffff_f040;
    h.phdrs[2].memsz = 0x40;
    assert_eq!(
        seg_err(&h, 2),
        SegmentProblem::Overflow,
        "end rounds up past 2^64"
    );

    let mut h = Hand::good64();
    h.phdrs[2].vaddr = USER_END_64 - 0x1fc0;
    assert_eq!(
        seg_err(&h, 2),
        SegmentProblem::AboveUserSpace {
            end: USER_END_64 - 0x1fc0 + 0x3000,
            limit: USER_END_64
        }
    );
    // Exactly up to the limit is fine.
    h.phdrs[2].vaddr = USER_END_64 - 0x2fc0;
    h.phdrs[2].memsz = 0x2fc0;
    assert!(h.plan().is_ok());

    let mut h = Hand::good32();
    h.phdrs[2].vaddr = 0xffff_d010;
    h.phdrs[2].memsz = 0x1000;
    assert_eq!(
        seg_err(&h, 2),
        SegmentProblem::AboveUserSpace {
            end: 0xffff_e010,
            limit: USER_END_32
        }
    );

    let mut h = Hand::good64();
    h.phdrs[0].vaddr = 0xf000;
    assert_eq!(
        seg_err(&h, 0),
        SegmentProblem::BelowMinAddr { start: 0xf000 }
    );
    h.phdrs[0].vaddr = 0x10000;
    assert!(h.plan().is_ok());

    let mut h = Hand::good64();
    h.phdrs.swap(1, 2);
    assert_eq!(seg_err(&h, 2), SegmentProblem::Unsorted);

    let mut h = Hand::good64();
    h.phdrs[1].vaddr = 0x400000 + 0x1000 - 0x1000; // same page offset as p_offset 0x1000
    assert_eq!(
        seg_err(&h, 1),
        SegmentProblem::Overlaps {
            previous_end: 0x400400
        }
    );

    let mut h = Hand::good64();
    h.phdrs[2].offset = 0x1200;
    h.phdrs[2].vaddr = 0x401200;
    assert_eq!(
        seg_err(&h, 2),
        SegmentProblem::SharesPage { page: 0x401000 }
    );
}

#[test]
fn entry_must_be_in_text() {
    for entry in [0x400010, 0x403050, 0x401200, 0x4011ff + 0x1000, 0, u64::MAX] {
        let mut h = Hand::good64();
        h.entry = entry;
        assert_eq!(
            h.plan(),
            Err(ElfError::EntryNotExecutable { entry }),
            "{entry:#x}"
        );
    }
    let mut h = Hand::good64();
    h.entry = 0x4011ff;
    assert!(h.plan().is_ok());
    // A PIE whose entry overflows when biased.
    let mut h = Hand::good64();
    h.e_type = 3;
    for ph in &mut h.phdrs {
        ph.vaddr = ph.vaddr.saturating_sub(0x400000);
    }
    h.entry = u64::MAX - 4;
    assert!(matches!(h.plan(), Err(ElfError::EntryNotExecutable { .. })));
}

#[test]
fn interpreter_is_refused_with_its_path() {
    let mut h = Hand::dynamic64();
    let e = h.plan().unwrap_err();
    assert_eq!(
        e,
        ElfError::Dynamic {
            interp: "/lib/ld-musl-x86_64.so.1".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "dynamically linked (PT_INTERP /lib/ld-musl-x86_64.so.1): link it statically"
    );
    // An unreadable PT_INTERP still refuses the program as dynamic.
    h.phdrs[0].offset = 0x10_0000;
    assert_eq!(
        h.plan(),
        Err(ElfError::Dynamic {
            interp: "(unreadable)".into()
        })
    );
}

#[test]
fn static_pie_with_needed_libraries_is_refused() {
    let mut h = Hand::good64();
    h.e_type = 3;
    for ph in &mut h.phdrs {
        ph.vaddr = ph.vaddr.saturating_sub(0x400000);
    }
    h.entry = 0x1010;
    // PT_DYNAMIC with DT_NEEDED, DT_NEEDED, DT_NULL.
    let mut dynamic = Vec::new();
    for (tag, val) in [(1u64, 1u64), (1, 5), (0, 0)] {
        dynamic.extend_from_slice(&tag.to_le_bytes());
        dynamic.extend_from_slice(&val.to_le_bytes());
    }
    h.phdrs
        .push(other(2, R | W, 0x2040, 0x3040, dynamic.len() as u64));
    h.extra.push((0x2040, dynamic));
    assert_eq!(h.plan(), Err(ElfError::NeedsLibraries { count: 2 }));
}

#[test]
fn build_id_of_a_note() {
    let mut h = Hand::good64();
    // namesz 4, descsz 8, type 3, "GNU\0", 8 bytes of id.
    let mut note = Vec::new();
    for v in [4u32, 8, 3] {
        note.extend_from_slice(&v.to_le_bytes());
    }
    note.extend_from_slice(b"GNU\0\x01\x02\x03\x04\x05\x06\x07\x08");
    // Another note first, that must be skipped.
    let mut notes = Vec::new();
    for v in [4u32, 4, 1] {
        notes.extend_from_slice(&v.to_le_bytes());
    }
    notes.extend_from_slice(b"GNU\0abcd");
    notes.extend_from_slice(&note);
    h.phdrs.push(Ph {
        align: 4,
        ..other(4, R, 0x300, 0x400300, notes.len() as u64)
    });
    h.extra.push((0x300, notes));
    let bytes = h.bytes();
    assert_eq!(build_id(&bytes), Some(&[1u8, 2, 3, 4, 5, 6, 7, 8][..]));
    assert_eq!(build_id(&Hand::good64().bytes()), None);
    assert_eq!(build_id(b"nonsense"), None);
}

// ---------------------------------------------------------------------------------------
// Real programs built by the host's compilers.

const C_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__thread int tls_counter = 7;
static char bss[1 << 20];
int data_value = 42;
int main(int argc, char **argv) {
    bss[argc] = 1;
    tls_counter += argc;
    printf("%s %d %d %d\n", argv[0], data_value, tls_counter, bss[1]);
    return 0;
}
"#;

/// Compiles `source` with `compiler args` into a temporary directory, or says why not.
fn compile(compiler: &str, args: &[&str], source: &str, ext: &str) -> Option<Vec<u8>> {
    let dir = tempfile::tempdir().ok()?;
    let src = dir.path().join(format!("prog.{ext}"));
    std::fs::write(&src, source).ok()?;
    let out = dir.path().join("prog");
    let result = Command::new(compiler)
        .args(args)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output();
    match result {
        Err(e) => {
            println!("skipped: cannot run {compiler}: {e}");
            None
        }
        Ok(o) if !o.status.success() => {
            println!(
                "skipped: {compiler} {args:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            );
            None
        }
        Ok(_) => std::fs::read(&out).ok(),
    }
}

fn cached(
    cell: &'static OnceLock<Option<Vec<u8>>>,
    make: impl FnOnce() -> Option<Vec<u8>>,
) -> Option<&'static [u8]> {
    cell.get_or_init(make).as_deref()
}

fn gcc_static() -> Option<&'static [u8]> {
    static C: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    cached(&C, || compile("gcc", &["-static", "-O1"], C_SOURCE, "c"))
}
fn gcc_static_pie() -> Option<&'static [u8]> {
    static C: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    cached(&C, || {
        compile("gcc", &["-static-pie", "-O1"], C_SOURCE, "c")
    })
}
fn gcc_m32_static() -> Option<&'static [u8]> {
    static C: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    cached(&C, || {
        compile("gcc", &["-m32", "-static", "-O1"], C_SOURCE, "c")
    })
}
fn gcc_m32_static_pie() -> Option<&'static [u8]> {
    static C: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    cached(&C, || {
        compile("gcc", &["-m32", "-static-pie", "-O1"], C_SOURCE, "c")
    })
}
fn musl_static() -> Option<&'static [u8]> {
    static C: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    cached(&C, || {
        compile("musl-gcc", &["-static", "-O1"], C_SOURCE, "c")
    })
}

const RUST_SOURCE: &str =
    "fn main() { let v: Vec<String> = std::env::args().collect(); println!(\"{v:?}\"); }\n";

fn rust_musl(target: &str) -> Option<Vec<u8>> {
    compile(
        "rustc",
        &["--target", target, "-O", "--edition", "2021"],
        RUST_SOURCE,
        "rs",
    )
}

/// One `readelf -lW` LOAD line: offset, vaddr, filesz, memsz, flags.
type ReadelfLoad = (u64, u64, u64, u64, String);

/// The PT_LOAD lines of `readelf -lW`, an independent reading of the same file; `None` if
/// readelf is missing.
fn readelf_loads(bytes: &[u8]) -> Option<Vec<ReadelfLoad>> {
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join("prog");
    std::fs::write(&path, bytes).ok()?;
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(Path::new(&path))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    Some(
        text.lines()
            .filter(|l| l.trim_start().starts_with("LOAD "))
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let flags = f[6..f.len() - 1].concat();
                (hex(f[1]), hex(f[2]), hex(f[4]), hex(f[5]), flags)
            })
            .collect(),
    )
}

/// Reads `len` bytes at `addr` of the image the plan describes, as the runtime maps it.
fn read_mapped(plan: &LoadPlan, file: &[u8], addr: u64, len: u64) -> Option<Vec<u8>> {
    let s = plan
        .segments
        .iter()
        .find(|s| addr >= s.vaddr && addr + len <= s.vaddr + s.memsz)?;
    Some(
        (addr..addr + len)
            .map(|a| {
                let off = a - s.vaddr;
                if off < s.filesz {
                    file[(s.file_offset + off) as usize]
                } else {
                    0
                }
            })
            .collect(),
    )
}

/// Checks a plan of a real program against readelf and against the file itself.
fn check_real(bytes: &[u8], class: Class, kind: Kind, bias: u64) -> LoadPlan {
    let p = plan(bytes).unwrap_or_else(|e| panic!("plan failed: {e}"));
    assert_eq!((p.class, p.kind, p.bias), (class, kind, bias));
    if let Some(loads) = readelf_loads(bytes) {
        let expect: Vec<Segment> = loads
            .iter()
            .filter(|l| l.3 > 0)
            .map(|&(offset, vaddr, filesz, memsz, ref flags)| Segment {
                vaddr: vaddr + bias,
                memsz,
                file_offset: offset,
                filesz,
                prot: Prot {
                    read: flags.contains('R'),
                    write: flags.contains('W'),
                    exec: flags.contains('E'),
                },
            })
            .collect();
        assert_eq!(p.segments, expect);
    } else {
        println!("readelf missing: segments not cross-checked");
    }
    // AT_PHDR must show the program headers themselves once mapped.
    let (phoff, entry) = match class {
        Class::Elf64 => (
            u64::from_le_bytes(bytes[32..40].try_into().unwrap()),
            u64::from_le_bytes(bytes[24..32].try_into().unwrap()),
        ),
        Class::Elf32 => (
            u64::from(u32::from_le_bytes(bytes[28..32].try_into().unwrap())),
            u64::from(u32::from_le_bytes(bytes[24..28].try_into().unwrap())),
        ),
    };
    let table = p.phent * p.phnum;
    assert_eq!(
        read_mapped(&p, bytes, p.phdr_addr, table).expect("AT_PHDR is mapped"),
        bytes[phoff as usize..(phoff + table) as usize]
    );
    assert_eq!(p.entry, entry + bias);
    let top = p.segments.iter().map(|s| s.vaddr + s.memsz).max().unwrap();
    assert_eq!(p.brk_start, top.next_multiple_of(PAGE_SIZE));
    assert!(!p.stack_exec, "gcc and rustc mark the stack non-executable");
    p
}

#[test]
fn real_gcc_static() {
    let Some(b) = gcc_static() else { return };
    let p = check_real(b, Class::Elf64, Kind::Exec, 0);
    assert!(p.segments[0].vaddr >= 0x400000);
    let tls = p.tls.expect("the program has a TLS variable");
    assert!(tls.filesz >= 4 && tls.memsz >= tls.filesz);
    assert!(
        p.segments.iter().any(|s| s.memsz - s.filesz >= 1 << 20),
        "bss"
    );
}

#[test]
fn real_gcc_static_pie() {
    let Some(b) = gcc_static_pie() else { return };
    check_real(b, Class::Elf64, Kind::StaticPie, PIE_BASE_64);
}

#[test]
fn real_gcc_m32_static() {
    let Some(b) = gcc_m32_static() else { return };
    let p = check_real(b, Class::Elf32, Kind::Exec, 0);
    assert_eq!(p.phent, 32);
    assert!(p.brk_start < USER_END_32);
}

#[test]
fn real_gcc_m32_static_pie() {
    let Some(b) = gcc_m32_static_pie() else {
        return;
    };
    check_real(b, Class::Elf32, Kind::StaticPie, PIE_BASE_32);
}

#[test]
fn real_musl_gcc_static() {
    let Some(b) = musl_static() else { return };
    check_real(b, Class::Elf64, Kind::Exec, 0);
}

#[test]
fn real_rust_musl_programs() {
    if let Some(b) = rust_musl("x86_64-unknown-linux-musl") {
        check_real(&b, Class::Elf64, Kind::StaticPie, PIE_BASE_64);
    }
    if let Some(b) = rust_musl("i686-unknown-linux-musl") {
        check_real(&b, Class::Elf32, Kind::Exec, 0);
    }
}

#[test]
fn real_dynamic_programs_are_refused() {
    if let Some(b) = compile("gcc", &["-O1"], C_SOURCE, "c") {
        let e = plan(&b).unwrap_err();
        assert_eq!(
            e,
            ElfError::Dynamic {
                interp: "/lib64/ld-linux-x86-64.so.2".into()
            }
        );
    }
    if let Some(b) = compile("musl-gcc", &["-O1"], C_SOURCE, "c") {
        assert_eq!(
            plan(&b).unwrap_err().to_string(),
            "dynamically linked (PT_INTERP /lib/ld-musl-x86_64.so.1): link it statically"
        );
    }
    if let Some(b) = compile("gcc", &["-m32", "-O1"], C_SOURCE, "c") {
        assert_eq!(
            plan(&b),
            Err(ElfError::Dynamic {
                interp: "/lib/ld-linux.so.2".into()
            })
        );
    }
    if let Some(b) = compile("gcc", &["-shared", "-fPIC", "-O1"], C_SOURCE, "c") {
        assert!(matches!(plan(&b), Err(ElfError::NeedsLibraries { count }) if count >= 1));
    }
    if let Some(b) = compile("gcc", &["-c", "-O1"], C_SOURCE, "c") {
        assert_eq!(plan(&b), Err(ElfError::UnsupportedType { e_type: 1 }));
    }
}

#[test]
fn real_build_ids() {
    let Some(b) = gcc_static() else { return };
    let id = build_id(b).expect("gcc links a build id by default on Debian");
    assert_eq!(id.len(), 20, "sha1 build id");
    if let Some(b) = gcc_m32_static() {
        assert_eq!(build_id(b).map(<[u8]>::len), Some(20));
    }
}

#[test]
fn real_programs_damaged() {
    let Some(b) = gcc_static() else { return };
    let phnum = u64::from(u16::from_le_bytes([b[56], b[57]]));
    let header_area = 64 + 56 * phnum as usize;
    for len in 0..header_area {
        assert!(plan(&b[..len]).is_err(), "cut to {len}");
    }
    let mut m = b.to_vec();
    m[18] = 183;
    m[19] = 0;
    assert!(
        plan(&m)
            .unwrap_err()
            .to_string()
            .starts_with("ELF for EM_AARCH64, ")
    );
    let mut m = b.to_vec();
    m[4] = 1;
    assert!(matches!(plan(&m), Err(ElfError::UnsupportedMachine { .. })));
    // Grow the first PT_LOAD's p_filesz beyond p_memsz.
    let first_load = (0..phnum as usize)
        .map(|i| 64 + 56 * i)
        .find(|&at| b[at] == 1)
        .unwrap();
    let mut m = b.to_vec();
    let memsz = u64::from_le_bytes(m[first_load + 40..first_load + 48].try_into().unwrap());
    m[first_load + 32..first_load + 40].copy_from_slice(&(memsz + 1).to_le_bytes());
    assert!(matches!(
        plan(&m),
        Err(ElfError::BadSegment {
            problem: SegmentProblem::FileSizeAboveMemSize { .. },
            ..
        })
    ));
    // Move the entry point into the first (read-only) segment.
    let mut m = b.to_vec();
    m[24..32].copy_from_slice(&0x400010u64.to_le_bytes());
    assert_eq!(
        plan(&m),
        Err(ElfError::EntryNotExecutable { entry: 0x400010 })
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    #[test]
    fn proptest_mutated_elf_never_panics(
        edits in proptest::collection::vec((0usize..1024, proptest::prelude::any::<u8>()), 1..8),
        use_real in proptest::prelude::any::<bool>(),
        cut in proptest::prelude::any::<proptest::sample::Index>(),
    ) {
        let base: Vec<u8> = match gcc_static() {
            Some(b) if use_real => b.to_vec(),
            _ => Hand::good64().bytes(),
        };
        let mut m = base;
        for (at, v) in edits {
            let at = at % m.len();
            m[at] = v;
        }
        if let Ok(p) = plan(&m) {
            // Whatever was accepted obeys the plan's invariants.
            for s in &p.segments {
                proptest::prop_assert!(s.filesz <= s.memsz);
                proptest::prop_assert!(s.file_offset + s.filesz <= m.len() as u64);
                proptest::prop_assert!(s.page_start() >= MIN_ADDR && s.page_end() <= p.class.user_end());
            }
            for w in p.segments.windows(2) {
                proptest::prop_assert!(w[0].page_end() <= w[1].page_start());
            }
        }
        let _ = build_id(&m);
        let cut = cut.index(m.len() + 1);
        let _ = plan(&m[..cut]);
        let _ = build_id(&m[..cut]);
    }

    #[test]
    fn proptest_mutated_elf32_never_panics(
        edits in proptest::collection::vec((0usize..200, proptest::prelude::any::<u8>()), 1..8),
    ) {
        let mut m = Hand::good32().bytes();
        for (at, v) in edits {
            m[at] = v;
        }
        let _ = plan(&m);
        let _ = build_id(&m);
    }
}
