//! Synthetic captures: a wire stream as the runtime would send it (Hello,
//! tasks, samples with callchains and user registers, End), for benchmarks,
//! tests and trying the tools without an appliance.

use std::io::{self, Write};

use sampler::event::{EventConfig, PmuCaps, sample_type as st};
use sampler::regs::{CodeMode, GPR_MASK, RegFile, RegsSample};
use sampler::sample::{CpuMode, PERF_CONTEXT_KERNEL, PERF_CONTEXT_USER, Sample};
use sampler::wire::{self, CpuId, CpuVendor, Encoder, EncoderConfig, MAX_FRAME, Record};

use crate::image::Image;

/// Shape of a synthetic capture.
#[derive(Clone, Debug)]
pub struct SynthConfig {
    /// Samples to generate.
    pub samples: u64,
    /// Sampling frequency (Hz), which sets the time step.
    pub freq: u64,
    /// Every n-th sample is a runtime sample inside a syscall (0: none).
    pub kernel_every: u64,
    /// Lost samples reported in one Lost record halfway through.
    pub lost: u64,
    /// End the stream with End (false: a truncated capture).
    pub end: bool,
    /// Repeat Hello and the Task record every this many samples, as the
    /// runtime does every few seconds (0: never).
    pub repeat_every: u64,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            samples: 10_000,
            freq: 4000,
            kernel_every: 10,
            lost: 0,
            end: true,
            repeat_every: 0,
        }
    }
}

/// Addresses used for samples: (user functions, runtime function, build-id).
fn addresses(image: Option<&Image>) -> (Vec<u64>, u64, Vec<u8>) {
    let Some(img) = image else {
        return (
            vec![0x40_1000, 0x40_1100, 0x40_1200],
            0x10_0100,
            vec![0xab; 20],
        );
    };
    // Function starts, keeping only functions at least 16 bytes long so
    // every generated IP stays inside its function.
    let user: Vec<u64> = img
        .symbols
        .iter()
        .filter(|s| img.is_user_ip(s.addr) && s.size >= 16)
        .map(|s| s.addr)
        .collect();
    let kernel = img
        .symbols
        .iter()
        .find(|s| s.addr >= img.kernel_start && s.addr < img.kernel_end)
        .map_or(img.kernel_start, |s| s.addr);
    let user = if user.is_empty() {
        vec![img.user_text.first().map_or(0x40_1000, |t| t.addr)]
    } else {
        user
    };
    (user, kernel, img.build_id.clone().unwrap_or_default())
}

/// Writes a synthetic capture to `out`; returns the bytes written.
pub fn write_capture(
    image: Option<&Image>,
    cfg: &SynthConfig,
    out: &mut impl Write,
) -> io::Result<u64> {
    let (user, kernel, build_id) = addresses(image);
    let mut enc = Encoder::new(EncoderConfig::default());
    let mut buf = vec![0u8; MAX_FRAME];
    let mut bytes = 0u64;
    let mut put = |enc: &mut Encoder, rec: &Record, out: &mut dyn Write| -> io::Result<()> {
        let n = enc
            .encode(rec, &mut buf)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("encoding {e:?}")))?;
        bytes += n as u64;
        out.write_all(&buf[..n])
    };
    let cpu = CpuId {
        vendor: CpuVendor::Other(*b"PerchSynth\0\0"),
        family: 0,
        model: 0,
        stepping: 0,
    };
    let mut hello = wire::Hello::new(cpu, PmuCaps::cpu_clock());
    let _ = hello
        .build_id
        .extend_from_slice(&build_id[..build_id.len().min(wire::MAX_BUILD_ID)]);
    let _ = hello.cmdline.push_str("console=wire synthetic");
    let mut ev = EventConfig::cpu_clock(0, cfg.freq);
    ev.sample_type |= st::CALLCHAIN | st::CPU | st::REGS_USER;
    ev.regs_user = GPR_MASK;
    let _ = hello.events.push(ev);
    hello.boot = 0x5e7d_1b0a_77c3_0001;
    put(&mut enc, &Record::Hello(hello.clone()), out)?;
    let mut name = heapless::String::new();
    let _ = name.push_str("synth64");
    let task = wire::Task {
        time: 0,
        pid: 1,
        tid: 1,
        name,
        abi: sampler::regs::Abi::Bits64,
        text: heapless::Vec::new(),
        program: None,
        origin: wire::Origin::Named,
    };
    put(&mut enc, &Record::Task(task.clone()), out)?;
    let step = 1_000_000_000 / cfg.freq.max(1);
    let mut regs = RegFile([0; sampler::regs::NUM_GPR_SLOTS]);
    for i in 0..cfg.samples {
        if cfg.repeat_every > 0 && i > 0 && i % cfg.repeat_every == 0 {
            hello.repeat += 1;
            put(&mut enc, &Record::Hello(hello.clone()), out)?;
            put(&mut enc, &Record::Task(task.clone()), out)?;
        }
        let f = user[(i as usize * 7 + i as usize / 3) % user.len()];
        let uip = f + (i % 16);
        let in_kernel = cfg.kernel_every != 0 && i % cfg.kernel_every == cfg.kernel_every - 1;
        for (k, r) in regs.0.iter_mut().enumerate() {
            *r = 0x1000 * k as u64 + (i & 0xff);
        }
        regs.0[8] = uip;
        regs.0[10] = 0x23;
        let mut chain = heapless::Vec::new();
        let ip = if in_kernel {
            let kip = kernel + (i % 8);
            let _ = chain.push(PERF_CONTEXT_KERNEL);
            let _ = chain.push(kip);
            kip
        } else {
            uip
        };
        let _ = chain.push(PERF_CONTEXT_USER);
        let _ = chain.push(uip);
        let _ = chain.push(user[0] + 5);
        let s = Sample {
            event: 0,
            cpumode: if in_kernel {
                CpuMode::Kernel
            } else {
                CpuMode::User
            },
            ip,
            pid: 1,
            tid: 1,
            time: 1_000_000 + i * step,
            cpu: 0,
            period: step,
            callchain: chain,
            regs_user: Some(RegsSample::from_file(&regs, GPR_MASK, CodeMode::Long64)),
            ..Sample::default()
        };
        put(&mut enc, &Record::Sample(s), out)?;
        if cfg.lost > 0 && i == cfg.samples / 2 {
            put(
                &mut enc,
                &Record::Lost(wire::Lost {
                    time: 1_000_000 + i * step,
                    cpu: 0,
                    event: 0,
                    count: cfg.lost,
                    reason: wire::LostReason::RingFull,
                }),
                out,
            )?;
        }
    }
    if cfg.end {
        let end = wire::End {
            time: 1_000_000 + cfg.samples * step,
            taken: cfg.samples + cfg.lost,
            delivered: cfg.samples,
            lost: cfg.lost,
            throttled: 0,
            frames: 0,
            unknown_syscalls: heapless::Vec::new(),
        };
        put(&mut enc, &Record::End(end), out)?;
    }
    Ok(bytes)
}
