//! Event names and their encodings: the generic perf hardware events, memory
//! events for PEBS and raw `rUUEE` codes, with `:u`, `:k` and `:p` modifiers.
//!
//! Encodings: Intel SDM vol. 3 "Pre-defined Architectural Performance Events"
//! (plus MEM_TRANS_RETIRED / MEM_INST_RETIRED for the memory events); AMD PPR
//! "Core Performance Monitor Counters" for family 17h and later.

use crate::cpuid::Vendor;

/// The event being counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Core cycles.
    Cycles,
    /// Instructions retired.
    Instructions,
    /// Reference cycles (Intel).
    RefCycles,
    /// Branch instructions retired.
    Branches,
    /// Mispredicted branches retired.
    BranchMisses,
    /// Last-level cache references.
    CacheReferences,
    /// Last-level cache misses.
    CacheMisses,
    /// Loads with latency information (Intel PEBS load latency).
    MemLoads,
    /// Stores with address information (Intel PEBS data-LA).
    MemStores,
    /// A raw event-select encoding (event, umask, edge, inv, cmask bits).
    Raw(u64),
}

/// An event with its modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// What to count.
    pub kind: EventKind,
    /// Count in user mode (CPL 3).
    pub user: bool,
    /// Count in kernel mode (CPL 0).
    pub kernel: bool,
    /// Precision level 0-3 (`:p` count); 1 or more asks for PEBS.
    pub precise: u8,
}

impl Event {
    /// An event counting in both modes, not precise.
    pub const fn new(kind: EventKind) -> Self {
        Event {
            kind,
            user: true,
            kernel: true,
            precise: 0,
        }
    }
}

/// Why an event name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventError {
    /// Not a known name nor a raw `r<hex>` code.
    UnknownName,
    /// A raw code that is not hexadecimal or is longer than 64 bits.
    BadRawCode,
    /// A raw code sets bits the driver owns (USR, OS, INT, EN, ANY) or
    /// reserved bits.
    RawReservedBits(u64),
    /// An unknown modifier character.
    BadModifier(char),
    /// More than three `p` modifiers.
    TooPrecise,
    /// More events in one list than a run samples (8, one counter each).
    TooMany,
    /// A `/term/` other than `period=N` or `freq=N` (N above 0), or an
    /// unterminated one.
    BadTerm,
}

impl core::fmt::Display for EventError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EventError::UnknownName => write!(
                f,
                "unknown event (known: cycles, instructions, ref-cycles, branches, branch-misses, \
                 cache-references, cache-misses, mem-loads, mem-stores, r<hex>)"
            ),
            EventError::BadRawCode => {
                write!(f, "raw event must be r followed by up to 16 hex digits")
            }
            EventError::RawReservedBits(b) => {
                write!(f, "raw event sets bits {b:#x} that cannot be set by hand")
            }
            EventError::BadModifier(c) => write!(f, "unknown event modifier '{c}' (use u, k, p)"),
            EventError::TooPrecise => write!(f, "at most three 'p' modifiers"),
            EventError::TooMany => write!(f, "at most 8 events in one run"),
            EventError::BadTerm => write!(
                f,
                "bad event term (NAME/period=N/ or NAME/freq=N/, N above 0, then modifiers)"
            ),
        }
    }
}

/// Bits of a raw code a user may set: event \[7:0\], umask \[15:8\], edge \[18\],
/// inv \[23\], cmask \[31:24\], and AMD's event \[11:8\] at \[35:32\] and host/guest
/// only at \[41:40\].
pub const RAW_ALLOWED: u64 =
    0xFF | 0xFF00 | 1 << 18 | 1 << 23 | 0xFF << 24 | 0xF << 32 | 0b11 << 40;

/// Names in the table, for help texts.
pub const NAMES: [&str; 9] = [
    "cycles",
    "instructions",
    "ref-cycles",
    "branches",
    "branch-misses",
    "cache-references",
    "cache-misses",
    "mem-loads",
    "mem-stores",
];

/// Parse `name[:modifiers]`, e.g. `cycles`, `instructions:u`, `mem-loads:pp`,
/// `r01c2:k`.
pub fn parse(spec: &str) -> Result<Event, EventError> {
    let (name, mods) = match spec.split_once(':') {
        Some((n, m)) => (n, m),
        None => (spec, ""),
    };
    let kind = match name {
        "cycles" | "cpu-cycles" => EventKind::Cycles,
        "instructions" => EventKind::Instructions,
        "ref-cycles" => EventKind::RefCycles,
        "branches" | "branch-instructions" => EventKind::Branches,
        "branch-misses" => EventKind::BranchMisses,
        "cache-references" => EventKind::CacheReferences,
        "cache-misses" => EventKind::CacheMisses,
        "mem-loads" => EventKind::MemLoads,
        "mem-stores" => EventKind::MemStores,
        raw if raw.starts_with('r') && raw.len() > 1 => {
            let hex = &raw[1..];
            if hex.len() > 16 {
                return Err(EventError::BadRawCode);
            }
            let v = u64::from_str_radix(hex, 16).map_err(|_| EventError::BadRawCode)?;
            if v & !RAW_ALLOWED != 0 {
                return Err(EventError::RawReservedBits(v & !RAW_ALLOWED));
            }
            EventKind::Raw(v)
        }
        _ => return Err(EventError::UnknownName),
    };
    let mut ev = Event::new(kind);
    let (mut u, mut k) = (false, false);
    for c in mods.chars() {
        match c {
            'u' => u = true,
            'k' => k = true,
            'p' => {
                if ev.precise == 3 {
                    return Err(EventError::TooPrecise);
                }
                ev.precise += 1;
            }
            other => return Err(EventError::BadModifier(other)),
        }
    }
    if u || k {
        ev.user = u;
        ev.kernel = k;
    }
    Ok(ev)
}

/// An event's own sampling, from perf's `NAME/period=N/` or
/// `NAME/freq=N/` term (else the run's `-c` / `-F`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventSampling {
    /// A sample every N events.
    Period(u64),
    /// N samples per second.
    Freq(u32),
}

/// Parses one event as perf writes it: `NAME[:MODS]` ([`parse`]) or
/// `NAME/TERM[,TERM]/[MODS]` with the terms `period=N` and `freq=N`, which
/// give the event its own sampling (the last one wins).
pub fn parse_spec(spec: &str) -> Result<(Event, Option<EventSampling>), EventError> {
    let Some((name, rest)) = spec.split_once('/') else {
        return parse(spec).map(|e| (e, None));
    };
    let (terms, mods) = rest.split_once('/').ok_or(EventError::BadTerm)?;
    let mut sampling = None;
    for term in terms.split(',').filter(|t| !t.is_empty()) {
        let (key, value) = term.split_once('=').ok_or(EventError::BadTerm)?;
        let n: u64 = value.parse().map_err(|_| EventError::BadTerm)?;
        if n == 0 {
            return Err(EventError::BadTerm);
        }
        sampling = Some(match key {
            "period" => EventSampling::Period(n),
            "freq" => EventSampling::Freq(u32::try_from(n).map_err(|_| EventError::BadTerm)?),
            _ => return Err(EventError::BadTerm),
        });
    }
    let mods = mods.strip_prefix(':').unwrap_or(mods);
    let ev = if mods.is_empty() {
        parse(name)?
    } else {
        // `NAME:MODS` is what `parse` takes.
        let mut buf = [0u8; 64];
        let n = name.len() + 1 + mods.len();
        let b = buf.get_mut(..n).ok_or(EventError::UnknownName)?;
        b[..name.len()].copy_from_slice(name.as_bytes());
        b[name.len()] = b':';
        b[name.len() + 1..].copy_from_slice(mods.as_bytes());
        parse(core::str::from_utf8(b).map_err(|_| EventError::UnknownName)?)?
    };
    Ok((ev, sampling))
}

/// Splits a comma-separated event list, keeping the commas between an
/// event's `/terms/` (`cycles/period=10,freq=5/u,instructions`).
pub fn split_list(list: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(list);
    core::iter::from_fn(move || {
        let s = rest?;
        let mut in_terms = false;
        for (i, c) in s.char_indices() {
            match c {
                '/' => in_terms = !in_terms,
                ',' if !in_terms => {
                    rest = Some(&s[i + 1..]);
                    return Some(&s[..i]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(s)
    })
}

/// Bit index in CPUID.0xA:EBX ("event not available") for the architectural
/// events, where the event has one.
pub fn arch_event_bit(kind: EventKind) -> Option<u32> {
    Some(match kind {
        EventKind::Cycles => 0,
        EventKind::Instructions => 1,
        EventKind::RefCycles => 2,
        EventKind::CacheReferences => 3,
        EventKind::CacheMisses => 4,
        EventKind::Branches => 5,
        EventKind::BranchMisses => 6,
        _ => return None,
    })
}

/// Memory-event kind of an event (drives PEBS memory-field decoding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemEvent {
    /// Not a memory event.
    None,
    /// Load latency.
    Load,
    /// Store address.
    Store,
}

/// How an event is counted on a given vendor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    /// Event-select bits (event, umask, edge, inv, cmask) for a GP counter.
    pub evtsel: u64,
    /// The Intel fixed counter that counts it, if any.
    pub fixed: Option<u8>,
    /// General-purpose counters allowed (bit per counter).
    pub gp_mask: u32,
    /// Memory-event kind.
    pub mem: MemEvent,
    /// The event is only meaningful with PEBS.
    pub needs_pebs: bool,
}

/// Encode `kind` for `vendor`; `None` if the vendor has no such event.
pub fn encode(kind: EventKind, vendor: Vendor) -> Option<Encoding> {
    let gp = |evtsel: u64| Encoding {
        evtsel,
        fixed: None,
        gp_mask: u32::MAX,
        mem: MemEvent::None,
        needs_pebs: false,
    };
    let fixed = |evtsel: u64, n: u8| Encoding {
        fixed: Some(n),
        ..gp(evtsel)
    };
    match vendor {
        Vendor::Amd => Some(match kind {
            EventKind::Cycles => gp(0x76),
            EventKind::Instructions => gp(0xC0),
            EventKind::Branches => gp(0xC2),
            EventKind::BranchMisses => gp(0xC3),
            EventKind::CacheReferences => gp(0xFF60),
            EventKind::CacheMisses => gp(0x0964),
            EventKind::Raw(v) => gp(v),
            EventKind::RefCycles | EventKind::MemLoads | EventKind::MemStores => return None,
        }),
        Vendor::Intel | Vendor::Other => Some(match kind {
            EventKind::Instructions => fixed(0x00C0, 0),
            EventKind::Cycles => fixed(0x003C, 1),
            // Linux schedules ref-cycles only on fixed counter 2 (its
            // pseudo-encoding 0x0300), never on a general-purpose counter.
            EventKind::RefCycles => Encoding {
                gp_mask: 0,
                ..fixed(0x013C, 2)
            },
            EventKind::Branches => gp(0x00C4),
            EventKind::BranchMisses => gp(0x00C5),
            EventKind::CacheReferences => gp(0x4F2E),
            EventKind::CacheMisses => gp(0x412E),
            // MEM_TRANS_RETIRED.LOAD_LATENCY (with MSR_PEBS_LD_LAT_THRESHOLD).
            EventKind::MemLoads => Encoding {
                mem: MemEvent::Load,
                needs_pebs: true,
                ..gp(0x01CD)
            },
            // MEM_INST_RETIRED.ALL_STORES (Haswell and later); the driver
            // puts the model's own precise-store event in (`st_event`).
            EventKind::MemStores => Encoding {
                mem: MemEvent::Store,
                needs_pebs: true,
                ..gp(0x82D0)
            },
            EventKind::Raw(v) => gp(v & 0xFFFF_FFFF),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_modifiers() {
        assert_eq!(parse("cycles").unwrap(), Event::new(EventKind::Cycles));
        let e = parse("instructions:u").unwrap();
        assert_eq!(
            (e.kind, e.user, e.kernel, e.precise),
            (EventKind::Instructions, true, false, 0)
        );
        let e = parse("mem-loads:ppk").unwrap();
        assert_eq!(
            (e.kind, e.user, e.kernel, e.precise),
            (EventKind::MemLoads, false, true, 2)
        );
        for n in NAMES {
            assert!(parse(n).is_ok(), "{n}");
        }
    }

    #[test]
    fn raw_codes() {
        assert_eq!(parse("r01c2").unwrap().kind, EventKind::Raw(0x01C2));
        assert_eq!(parse("r4f2e:u").unwrap().kind, EventKind::Raw(0x4F2E));
        assert_eq!(parse("rzz"), Err(EventError::BadRawCode));
        assert_eq!(parse("r12345678901234567"), Err(EventError::BadRawCode));
        // INT (bit 20) and EN (bit 22) belong to the driver.
        assert_eq!(
            parse("r5000c0"),
            Err(EventError::RawReservedBits(0x50_0000))
        );
    }

    #[test]
    fn errors() {
        assert_eq!(parse("cycle"), Err(EventError::UnknownName));
        assert_eq!(parse("r"), Err(EventError::UnknownName));
        assert_eq!(parse("cycles:x"), Err(EventError::BadModifier('x')));
        assert_eq!(parse("cycles:pppp"), Err(EventError::TooPrecise));
    }

    #[test]
    fn encodings_per_vendor() {
        let i = encode(EventKind::Instructions, Vendor::Intel).unwrap();
        assert_eq!((i.evtsel, i.fixed), (0xC0, Some(0)));
        assert_eq!(
            encode(EventKind::Cycles, Vendor::Intel).unwrap().fixed,
            Some(1)
        );
        assert_eq!(
            encode(EventKind::BranchMisses, Vendor::Intel)
                .unwrap()
                .evtsel,
            0xC5
        );
        let m = encode(EventKind::MemLoads, Vendor::Intel).unwrap();
        assert!(m.needs_pebs && m.mem == MemEvent::Load);
        assert_eq!(encode(EventKind::Cycles, Vendor::Amd).unwrap().evtsel, 0x76);
        assert_eq!(encode(EventKind::RefCycles, Vendor::Amd), None);
        assert_eq!(
            encode(EventKind::Raw(0x1_0000_00C0), Vendor::Amd)
                .unwrap()
                .evtsel,
            0x1_0000_00C0
        );
    }

    #[test]
    fn terms_give_an_event_its_own_sampling() {
        let (e, s) = parse_spec("cycles/period=100000/u").unwrap();
        assert_eq!((e.kind, e.user, e.kernel), (EventKind::Cycles, true, false));
        assert_eq!(s, Some(EventSampling::Period(100_000)));
        let (e, s) = parse_spec("r01c2/freq=4000/pp").unwrap();
        assert_eq!((e.kind, e.precise), (EventKind::Raw(0x01C2), 2));
        assert_eq!(s, Some(EventSampling::Freq(4000)));
        assert_eq!(parse_spec("instructions:k").unwrap().1, None);
        assert_eq!(parse_spec("branches//").unwrap().1, None);
        for bad in [
            "cycles/period=0/",
            "cycles/period=x/",
            "cycles/name=foo/",
            "cycles/period=10",
            "cycles/freq=99999999999/",
        ] {
            assert_eq!(parse_spec(bad).unwrap_err(), EventError::BadTerm, "{bad}");
        }
        assert_eq!(
            parse_spec("cycels/period=1/").unwrap_err(),
            EventError::UnknownName
        );
        let list: Vec<&str> =
            split_list("cycles/period=10,freq=5/u,instructions,r01c2:p").collect();
        assert_eq!(
            list,
            ["cycles/period=10,freq=5/u", "instructions", "r01c2:p"]
        );
        assert_eq!(split_list("").collect::<Vec<_>>(), [""]);
    }
}
