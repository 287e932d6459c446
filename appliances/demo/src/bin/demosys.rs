//! demosys: spends most of its time inside a system call. Each round does
//! a little user work (`demosys_prepare_request`), then asks for 64 KiB of
//! random bytes with a raw `getrandom` SYSCALL from
//! `demosys_fetch_random`, which the runtime fills eight bytes at a time.
//! A sample taken in the runtime then carries the user frame saved at
//! entry (RIP in `demosys_fetch_random`, RCX = RIP, RAX = 318) and a
//! callchain into `demosys_main`.
//!
//! `demosys [ROUNDS]`: without ROUNDS it runs until the run ends.

#[cfg(target_arch = "x86_64")]
mod imp {
    use perch_demo_appliance::{mix, repeat, sink};

    /// Bytes asked for per call.
    const REQUEST: usize = 64 << 10;

    /// Linux x86_64 `getrandom`.
    const SYS_GETRANDOM: u64 = 318;

    /// A little user work between the system calls.
    #[inline(never)]
    #[unsafe(no_mangle)]
    pub extern "C" fn demosys_prepare_request(seed: u64) -> u64 {
        let mut x = seed | 7;
        for _ in 0..500 {
            x = mix(x).rotate_left(7);
        }
        x
    }

    /// `getrandom(buf, len, 0)` as a raw SYSCALL, so the call's user frame is
    /// this function's.
    #[inline(never)]
    #[unsafe(no_mangle)]
    pub fn demosys_fetch_random(buf: &mut [u8]) -> i64 {
        let ret: i64;
        // SAFETY: getrandom writes at most `buf.len()` bytes into `buf`, which
        // is a live, exclusively borrowed slice; SYSCALL clobbers only rcx and
        // r11 besides the result in rax.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") SYS_GETRANDOM as i64 => ret,
                in("rdi") buf.as_mut_ptr(),
                in("rsi") buf.len(),
                in("rdx") 0u64,
                out("rcx") _,
                out("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// The loop: prepare, fetch, yield.
    #[inline(never)]
    #[unsafe(no_mangle)]
    pub extern "C" fn demosys_main(rounds: u64) -> u64 {
        let rounds = (rounds != u64::MAX).then_some(rounds);
        let mut buf = vec![0u8; REQUEST];
        let mut x = 7u64;
        let mut failed = 0u64;
        repeat(rounds, || {
            x = demosys_prepare_request(x);
            let got = demosys_fetch_random(&mut buf);
            if got != REQUEST as i64 {
                failed += 1;
            }
            x ^= u64::from(buf[x as usize % REQUEST]);
            sink(x);
            std::thread::yield_now();
        });
        failed
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    let rounds = perch_demo_appliance::rounds();
    println!("demosys: appliance task ready");
    let failed = imp::demosys_main(rounds.unwrap_or(u64::MAX));
    println!("demosys: done, {failed} short getrandom calls");
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("demosys is an x86_64 program");
    std::process::exit(2);
}
