//! Everything that touches the x86-64 CPU. The hardware `unsafe` lives here.
#![cfg_attr(not(test), no_std)]

pub mod bootinfo;
pub mod cpu;
pub mod cpuid;
pub mod crc32c;
pub mod exit;
pub mod frame;
pub mod gdt;
pub mod hpet;
pub mod idt;
pub mod ioapic;
pub mod lapic;
pub mod madt;
pub mod msr;
pub mod paging;
pub mod pic;
pub mod pit;
pub mod pmu;
pub mod rtc;
pub mod topology;
pub mod uart;
#[cfg(target_os = "none")]
pub mod virtio;
#[cfg(target_os = "none")]
pub mod virtio_net;
