//! The ELF loader's plan (`kcore::elf::plan`) and build-id reader: programs
//! of either class laid out as linkers do, with raw and extra program
//! headers and overwritten fields. Never panics; a plan it accepts keeps
//! every promise `LoadPlan` documents: segments sorted, inside the user
//! half and above the floor, not overlapping nor sharing pages, file bytes
//! inside the file, the entry in executable file-backed bytes, AT_PHDR in
//! a segment's file part, brk at the last segment's page end.

#![no_main]

use kcore::elf::{self, Class, MIN_ADDR, PAGE_SIZE};
use libfuzzer_sys::fuzz_target;
use perch_fuzz_input::elf::ElfSpec;

fuzz_target!(|spec: ElfSpec| {
    let bytes = spec.build();
    let _ = elf::build_id(&bytes);
    let Ok(plan) = elf::plan(&bytes) else {
        return;
    };
    let limit = plan.class.user_end();
    assert!(!plan.segments.is_empty());
    let mut prev_end: Option<u64> = None;
    for s in &plan.segments {
        assert!(s.memsz > 0);
        assert!(s.filesz <= s.memsz);
        assert!(s.file_offset + s.filesz <= bytes.len() as u64);
        assert!(s.page_start() >= MIN_ADDR);
        assert!(s.page_end() <= limit);
        assert_eq!(s.vaddr % PAGE_SIZE, s.file_offset % PAGE_SIZE);
        if let Some(end) = prev_end {
            assert!(s.page_start() >= end, "segments share no page");
        }
        prev_end = Some(s.page_end());
    }
    assert_eq!(plan.brk_start, plan.segments.last().unwrap().page_end());
    assert!(
        plan.segments
            .iter()
            .any(|s| s.prot.exec && plan.entry >= s.vaddr && plan.entry - s.vaddr < s.filesz)
    );
    let table = plan.phent * plan.phnum;
    assert!(
        plan.segments
            .iter()
            .any(|s| plan.phdr_addr >= s.vaddr && plan.phdr_addr + table <= s.vaddr + s.filesz)
    );
    match plan.class {
        Class::Elf64 => assert_eq!(plan.phent, 56),
        Class::Elf32 => assert_eq!(plan.phent, 32),
    }
});
