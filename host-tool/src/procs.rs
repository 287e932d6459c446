//! The programs' side of a run's log: their output lines (`[NAME] LINE`,
//! `[NAME:err] LINE`), routed to the host's stdout and stderr as they
//! arrive, and how each process ended (`perch: NAME (pid P) exited with
//! status S`, `perch: NAME (pid P) killed by SIGNAME: REASON`), the
//! console formats of `docs/programs.md`.

/// How a process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// exit / exit_group with this status.
    Exited(i64),
    /// Killed by a signal.
    Killed {
        /// The signal's name (`SIGSEGV`).
        signal: String,
        /// Why (`page fault writing 0x0 at rip 0x401234`).
        reason: String,
    },
}

/// One process's end, as the runtime reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessEnd {
    /// Its name.
    pub name: String,
    /// Its pid.
    pub pid: u32,
    /// How it ended.
    pub ending: Ending,
    /// Whether perch started it (a program of the command line or the
    /// manifest), rather than a program's fork.
    pub started: bool,
}

/// Where a log line goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed<'a> {
    /// A program's stdout line (tag removed when one program runs).
    Stdout(&'a str),
    /// A program's stderr line (tag removed when one program runs).
    Stderr(&'a str),
    /// A line of the runtime's own.
    Log,
}

/// The line with its leading level word (`INFO `) removed.
fn text_of(log: &str) -> &str {
    match log.split_once(' ') {
        Some((level, rest)) if level.bytes().all(|b| b.is_ascii_uppercase()) => rest,
        _ => log,
    }
}

/// Parses an end line of the runtime's console.
pub fn parse_end(log: &str) -> Option<ProcessEnd> {
    let rest = text_of(log).strip_prefix("perch: ")?;
    let (name, rest) = rest.split_once(" (pid ")?;
    let (pid, rest) = rest.split_once(") ")?;
    let pid = pid.parse().ok()?;
    let ending = if let Some(s) = rest.strip_prefix("exited with status ") {
        Ending::Exited(s.trim().parse().ok()?)
    } else {
        let r = rest.strip_prefix("killed by ")?;
        let (signal, reason) = r.split_once(": ").unwrap_or((r, ""));
        Ending::Killed {
            signal: signal.to_owned(),
            reason: reason.to_owned(),
        }
    };
    Some(ProcessEnd {
        name: name.to_owned(),
        pid,
        ending,
        started: false,
    })
}

/// The pid in a `perch: started NAME (pid P): ...` line of the runtime's
/// console, which names a process perch asked for.
fn parse_started(log: &str) -> Option<u32> {
    let rest = text_of(log).strip_prefix("perch: started ")?;
    let (_, rest) = rest.split_once(" (pid ")?;
    let (pid, _) = rest.split_once("):")?;
    pid.parse().ok()
}

/// Routes the log lines of a run whose processes perch knows.
#[derive(Clone, Debug, Default)]
pub struct ProcessLog {
    names: Vec<String>,
    /// The pids of the processes perch started.
    started: Vec<u32>,
    /// The ends seen so far, in order.
    pub ends: Vec<ProcessEnd>,
}

impl ProcessLog {
    /// For a run of processes with these names.
    pub fn new(names: Vec<String>) -> ProcessLog {
        ProcessLog {
            names,
            started: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// Where `log` (an [`Item::Log`](crate::model::Item::Log) text) goes;
    /// notes a process's end.
    pub fn route<'a>(&mut self, log: &'a str) -> Routed<'a> {
        let text = text_of(log);
        if let Some(rest) = text.strip_prefix('[')
            && let Some((tag, line)) = rest.split_once("] ")
        {
            let (name, err) = match tag.strip_suffix(":err") {
                Some(n) => (n, true),
                None => (tag, false),
            };
            if self.names.iter().any(|n| n == name) {
                let single = self.names.len() == 1;
                let shown = if single {
                    line
                } else {
                    // The whole `[NAME] LINE`.
                    text
                };
                return if err {
                    Routed::Stderr(shown)
                } else {
                    Routed::Stdout(shown)
                };
            }
        }
        if let Some(pid) = parse_started(log) {
            self.started.push(pid);
        } else if let Some(mut end) = parse_end(log)
            && self.names.contains(&end.name)
        {
            // A runtime that says nothing of what it started (an older
            // one) forks nothing either.
            end.started = self.started.is_empty() || self.started.contains(&end.pid);
            self.ends.push(end);
        }
        Routed::Log
    }

    /// The processes perch started that were killed by a signal (a forked
    /// child killed by a signal is its parent's business, as under perf).
    pub fn crashed(&self) -> impl Iterator<Item = &ProcessEnd> {
        self.ends
            .iter()
            .filter(|e| e.started && matches!(e.ending, Ending::Killed { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lines_are_routed_and_untagged_for_one_program() {
        let mut one = ProcessLog::new(vec!["app".into()]);
        assert_eq!(
            one.route("INFO [app] hello world"),
            Routed::Stdout("hello world")
        );
        assert_eq!(one.route("INFO [app:err] oops"), Routed::Stderr("oops"));
        assert_eq!(one.route("INFO [app] "), Routed::Stdout(""));
        assert_eq!(one.route("INFO [other] x"), Routed::Log);
        assert_eq!(
            one.route("INFO perch: boot archive: 3 entries"),
            Routed::Log
        );
        let mut two = ProcessLog::new(vec!["a".into(), "b".into()]);
        assert_eq!(two.route("INFO [b] x y"), Routed::Stdout("[b] x y"));
        assert_eq!(two.route("INFO [a:err] z"), Routed::Stderr("[a:err] z"));
    }

    #[test]
    fn ends_are_parsed_from_the_console_lines() {
        // With no `started` line, every end is a started process's.
        let mut old = ProcessLog::new(vec!["app".into()]);
        old.route("INFO perch: app (pid 1) killed by SIGSEGV: page fault");
        assert_eq!(old.crashed().count(), 1);
        let mut log = ProcessLog::new(vec!["app".into(), "crash".into()]);
        assert_eq!(
            log.route("INFO perch: started app (pid 1): /bin/app (x86-64), entry 0x401000"),
            Routed::Log
        );
        log.route("INFO perch: started crash (pid 2): /bin/crash (i386), entry 0x8049000");
        log.route("INFO perch: app (pid 1) exited with status 3");
        log.route(
            "INFO perch: crash (pid 2) killed by SIGSEGV: page fault writing 0x0 at rip 0x401234",
        );
        log.route("INFO perch: stranger (pid 3) exited with status 0");
        assert_eq!(
            log.ends,
            [
                ProcessEnd {
                    name: "app".into(),
                    pid: 1,
                    ending: Ending::Exited(3),
                    started: true,
                },
                ProcessEnd {
                    name: "crash".into(),
                    pid: 2,
                    ending: Ending::Killed {
                        signal: "SIGSEGV".into(),
                        reason: "page fault writing 0x0 at rip 0x401234".into()
                    },
                    started: true,
                }
            ]
        );
        assert_eq!(log.crashed().count(), 1);
        // A child that app forked, killed by a signal, is not a crash of
        // the run.
        log.route("INFO perch: app (pid 4) killed by SIGTERM: sent by itself");
        assert!(!log.ends[2].started);
        assert_eq!(log.crashed().count(), 1);
        assert_eq!(
            parse_end("INFO perch: x (pid y) exited with status 0"),
            None
        );
    }
}
