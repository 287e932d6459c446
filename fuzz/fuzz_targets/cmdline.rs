//! The runtime's command-line parser (`kcore::cmdline::parse`; a thin
//! call, so the target follows the parser if it moves): arbitrary lines,
//! often made of its own keys and values. Never panics; every issue it
//! reports names text of the line; unknown keys are ignored (the line
//! without their items gives the same configuration and no unknown key).

#![no_main]

use arbitrary::{Arbitrary, Result, Unstructured};
use kcore::cmdline::{Issue, parse};
use libfuzzer_sys::fuzz_target;

const KEYS: [&str; 16] = [
    "selftest", "freq", "pmu", "console", "ring", "duration", "crash", "event", "max_rate",
    "cpu_pct", "sample", "slice", "sim", "quiet", "", "=",
];
const VALUES: [&str; 16] = [
    "auto",
    "sim",
    "off",
    "wire",
    "text",
    "0",
    "1",
    "4000",
    "18446744073709551616",
    "cycles",
    "instructions:u",
    "r01c2:pp",
    "full",
    "minimal",
    "spr",
    "-1",
];

#[derive(Debug)]
struct Line(String);

impl<'a> Arbitrary<'a> for Line {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        if u.ratio(1, 4)? {
            return Ok(Line(u.arbitrary()?));
        }
        let mut s = String::new();
        for _ in 0..u.int_in_range(0..=12)? {
            s.push_str(u.choose(&KEYS)?);
            if u.ratio(3, 4)? {
                s.push('=');
                if u.ratio(3, 4)? {
                    s.push_str(u.choose(&VALUES)?);
                } else {
                    s.push_str(u.arbitrary()?);
                }
            }
            s.push(*u.choose(&[' ', '\t', ' ', '\n'])?);
        }
        Ok(Line(s))
    }
}

fuzz_target!(|line: Line| {
    let line = line.0;
    let mut issues = Vec::new();
    let cfg = parse(&line, |i| issues.push(i));
    for i in &issues {
        let text = match i {
            Issue::UnknownKey(k) => k,
            Issue::BadValue { key, .. } => key,
            Issue::BadEvent { value, .. } => value,
            Issue::BadNet { value, .. } => value,
        };
        assert!(line.contains(text), "issue {i} names text of the line");
        let _ = i.to_string();
    }
    let _ = cfg.console_mode();
    let unknown: Vec<&str> = issues
        .iter()
        .filter_map(|i| match i {
            Issue::UnknownKey(k) => Some(*k),
            _ => None,
        })
        .collect();
    let known: Vec<&str> = line
        .split_ascii_whitespace()
        .filter(|item| !unknown.contains(&item.split_once('=').map_or(*item, |(k, _)| k)))
        .collect();
    let known = known.join(" ");
    let mut again = Vec::new();
    assert_eq!(parse(&known, |i| again.push(i)), cfg);
    assert!(!again.iter().any(|i| matches!(i, Issue::UnknownKey(_))));
});
