//! A simulated appliance task for wire-size measurements and stream tests:
//! a summing loop over an array, sampled by a 4 kHz cpu-clock, with
//! registers that evolve the way such a loop's do.

#![allow(dead_code)]

use sampler::event::{EventConfig, sample_type as st};
use sampler::regs::{CodeMode, GPR_MASK, Reg, RegFile, RegsSample};
use sampler::sample::{CpuMode, PERF_CONTEXT_USER, Sample};

/// Deterministic xorshift64* generator.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Which fields a configuration samples.
#[derive(Clone, Copy, Debug)]
pub enum Config {
    /// IDENTIFIER, IP, TID, TIME, PERIOD.
    Basic,
    /// Basic + REGS_USER with the 20 GPRs (the acceptance sample).
    UserRegs,
    /// Basic + REGS_USER + a 4-frame callchain.
    CallchainUserRegs,
    /// Basic + REGS_USER + REGS_INTR.
    UserAndIntrRegs,
}

impl Config {
    pub const ALL: [Config; 4] = [
        Config::Basic,
        Config::UserRegs,
        Config::CallchainUserRegs,
        Config::UserAndIntrRegs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Config::Basic => "IDENTIFIER, IP, TID, TIME, PERIOD",
            Config::UserRegs => "+ REGS_USER (20 GPRs)",
            Config::CallchainUserRegs => "+ REGS_USER + CALLCHAIN (4 frames)",
            Config::UserAndIntrRegs => "+ REGS_USER + REGS_INTR (20 GPRs each)",
        }
    }

    pub fn event(self) -> EventConfig {
        let mut e = EventConfig::cpu_clock(1, 4000);
        match self {
            Config::Basic => {}
            Config::UserRegs => {
                e.sample_type |= st::REGS_USER;
                e.regs_user = GPR_MASK;
            }
            Config::CallchainUserRegs => {
                e.sample_type |= st::REGS_USER | st::CALLCHAIN;
                e.regs_user = GPR_MASK;
            }
            Config::UserAndIntrRegs => {
                e.sample_type |= st::REGS_USER | st::REGS_INTR;
                e.regs_user = GPR_MASK;
                e.regs_intr = GPR_MASK;
            }
        }
        e
    }
}

/// One simulated task.
#[derive(Clone, Debug)]
pub struct Task {
    pub tid: u32,
    regs: RegFile,
    time: u64,
    rng: Rng,
}

const TEXT: u64 = 0x40_1000;
const LOOP_BODY: [u64; 6] = [
    0x40_1a20, 0x40_1a24, 0x40_1a28, 0x40_1a2c, 0x40_1a30, 0x40_1a33,
];

impl Task {
    pub fn new(tid: u32, seed: u64) -> Self {
        let mut r = RegFile::default();
        let stack = 0x7fff_ffff_e000 - u64::from(tid) * 0x10_0000;
        let data = 0x60_0000 + u64::from(tid) * 0x10_0000;
        r.set(Reg::Ax, 0);
        r.set(Reg::Bx, data + 0x8_0000); // end pointer
        r.set(Reg::Cx, 0);
        r.set(Reg::Dx, data);
        r.set(Reg::Si, data);
        r.set(Reg::Di, 0x1000);
        r.set(Reg::Bp, stack + 0x40);
        r.set(Reg::Sp, stack);
        r.set(Reg::Ip, LOOP_BODY[0]);
        r.set(Reg::Flags, 0x202);
        r.set(Reg::Cs, 0x2b);
        r.set(Reg::Ss, 0x23);
        r.set(Reg::R8, 3);
        r.set(Reg::R9, 0x60_0000);
        r.set(Reg::R10, 0);
        r.set(Reg::R11, 0x246);
        r.set(Reg::R12, TEXT + 0x200);
        r.set(Reg::R13, stack + 0x80);
        r.set(Reg::R14, 0);
        r.set(Reg::R15, 0x1234);
        Task {
            tid,
            regs: r,
            time: 1_000_000_000 + u64::from(tid) * 1000,
            rng: Rng(seed | 1),
        }
    }

    /// Runs the loop for one 250 us sample interval and samples it.
    pub fn step(&mut self, config: Config) -> Sample {
        let iters = 40_000 + self.rng.below(2000);
        let r = &mut self.regs;
        let acc = r
            .get(Reg::Ax)
            .wrapping_add(iters * 1_000 + self.rng.below(1 << 20));
        r.set(Reg::Ax, acc);
        let i = (r.get(Reg::Cx) + iters) % 0x1_0000;
        r.set(Reg::Cx, i);
        let base = r.get(Reg::Si);
        r.set(Reg::Dx, base + i * 8);
        r.set(Reg::R8, self.rng.below(16));
        r.set(Reg::R10, acc >> 3);
        r.set(
            Reg::Flags,
            [0x202, 0x206, 0x246, 0x293][self.rng.below(4) as usize],
        );
        r.set(Reg::R11, r.get(Reg::Flags));
        let ip = LOOP_BODY[self.rng.below(LOOP_BODY.len() as u64) as usize];
        r.set(Reg::Ip, ip);
        self.time += 250_000 + self.rng.below(2_000);
        let mut s = Sample {
            event: 1,
            cpumode: CpuMode::User,
            ip,
            pid: self.tid,
            tid: self.tid,
            time: self.time,
            cpu: 0,
            period: 250_000,
            ..Default::default()
        };
        let user = RegsSample::from_file(r, GPR_MASK, CodeMode::Long64);
        match config {
            Config::Basic => {}
            Config::UserRegs => s.regs_user = Some(user),
            Config::CallchainUserRegs => {
                s.regs_user = Some(user);
                for e in [
                    PERF_CONTEXT_USER,
                    ip,
                    TEXT + 0x1f0,
                    TEXT + 0x80,
                    TEXT + 0x10,
                ] {
                    s.callchain.push(e).unwrap();
                }
            }
            Config::UserAndIntrRegs => {
                s.regs_intr = Some(user.clone());
                s.regs_user = Some(user);
            }
        }
        s
    }
}
