//! The full-screen view of `perch top` (ratatui on crossterm): the status
//! and command lines, the ranking as a table that fills the screen, the
//! target's last log lines; keys `q` (or Esc, Ctrl-C) to stop, `p`/`P` to
//! step through the commands. The terminal is taken at the first frame and
//! given back at the end (or when the view is dropped), after which the
//! last table is printed as plain text.

use std::collections::VecDeque;
use std::io::{Stdout, Write};
use std::time::Duration;

use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Row as TRow, Table};

use super::{Display, Frame, Key};
use crate::error::HostError;

/// Log lines kept for the bottom of the screen.
const LOG_LINES: usize = 3;

/// The full-screen display on stdout (a terminal).
pub struct Tui {
    terminal: Option<Terminal<CrosstermBackend<Stdout>>>,
    logs: VecDeque<String>,
    /// Rows of the plain table printed after the view closes.
    entries: usize,
}

impl std::fmt::Debug for Tui {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tui")
            .field("open", &self.terminal.is_some())
            .finish()
    }
}

fn io_err(what: &str) -> impl FnOnce(std::io::Error) -> HostError + '_ {
    move |e| HostError::io(what.to_owned(), e)
}

impl Tui {
    /// A view that takes the terminal at its first frame; after it closes,
    /// the last `entries` rows are printed as a plain table.
    pub fn new(entries: usize) -> Tui {
        Tui {
            terminal: None,
            logs: VecDeque::new(),
            entries,
        }
    }

    fn open(&mut self) -> Result<&mut Terminal<CrosstermBackend<Stdout>>, HostError> {
        if self.terminal.is_none() {
            restore_on_panic();
            enable_raw_mode().map_err(io_err("switching the terminal to raw mode"))?;
            let mut out = std::io::stdout();
            if let Err(e) = crossterm::execute!(out, EnterAlternateScreen) {
                let _ = disable_raw_mode();
                return Err(HostError::io("entering the alternate screen", e));
            }
            match Terminal::new(CrosstermBackend::new(out)) {
                Ok(mut t) => {
                    let _ = t.hide_cursor();
                    let _ = t.clear();
                    self.terminal = Some(t);
                }
                Err(e) => {
                    restore(None);
                    return Err(HostError::io("starting the terminal view", e));
                }
            }
        }
        // Just set.
        self.terminal.as_mut().ok_or_else(|| {
            HostError::io("starting the terminal view", std::io::Error::other("gone"))
        })
    }

    fn close(&mut self) {
        if let Some(t) = self.terminal.take() {
            restore(Some(t));
        }
    }
}

/// Makes a panic give the terminal back before its message is printed
/// (once per process).
fn restore_on_panic() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore(None);
            previous(info);
        }));
    });
}

/// Gives the terminal back: normal screen, cursor, cooked mode.
fn restore(t: Option<Terminal<CrosstermBackend<Stdout>>>) {
    if let Some(mut t) = t {
        let _ = t.show_cursor();
    }
    let _ = crossterm::execute!(std::io::stdout(), LeaveAlternateScreen);
    let _ = disable_raw_mode();
}

impl Drop for Tui {
    fn drop(&mut self) {
        self.close();
    }
}

/// The control characters of a target line made visible, so they cannot
/// move the cursor.
fn printable(line: &str) -> String {
    line.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn draw(f: &mut ratatui::Frame<'_>, frame: &Frame, logs: &VecDeque<String>) {
    let header = 3 + frame.notes.len().min(2) as u16;
    let [top, table, bottom] = Layout::vertical([
        Constraint::Length(header),
        Constraint::Min(2),
        Constraint::Length(logs.len().min(LOG_LINES) as u16),
    ])
    .areas(f.area());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut head = vec![
        Line::styled(format!("perch top: {}", frame.status()), bold),
        Line::raw(format!("commands: {}", frame.command_line())),
        Line::raw(format!(
            "showing: {}   (p/P: next/previous command, q: stop and write perf.data)",
            frame.filter.label()
        )),
    ];
    head.extend(
        frame
            .notes
            .iter()
            .take(2)
            .map(|n| Line::raw(format!("note: {n}"))),
    );
    f.render_widget(Paragraph::new(head), top);
    let shown = table.height.saturating_sub(1) as usize;
    let rows: Vec<TRow<'_>> = frame
        .rows
        .iter()
        .take(shown)
        .map(|r| {
            TRow::new(vec![
                Cell::from(format!("{:>7.2}%", r.share)),
                Cell::from(format!("{:>9}", r.samples)),
                Cell::from(r.command.clone()),
                Cell::from(r.dso.clone()),
                Cell::from(format!(
                    "{} {}",
                    if r.kernel { "[k]" } else { "[.]" },
                    r.symbol
                )),
            ])
        })
        .collect();
    let width = |f: &dyn Fn(&super::Row) -> usize, min: usize| {
        frame
            .rows
            .iter()
            .take(shown)
            .map(f)
            .chain([min])
            .max()
            .unwrap_or(min) as u16
    };
    let widths = [
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(width(&|r| r.command.chars().count(), 7)),
        Constraint::Length(width(&|r| r.dso.chars().count(), 13)),
        Constraint::Fill(1),
    ];
    let t = Table::new(rows, widths)
        .header(
            TRow::new(vec![
                Cell::from("Overhead"),
                Cell::from("  Samples"),
                Cell::from("Command"),
                Cell::from("Shared Object"),
                Cell::from("Symbol"),
            ])
            .style(bold),
        )
        .column_spacing(2);
    f.render_widget(t, table);
    let dim = Style::default().add_modifier(Modifier::DIM);
    f.render_widget(
        Paragraph::new(
            logs.iter()
                .map(|l| Line::styled(l.clone(), dim))
                .collect::<Vec<_>>(),
        ),
        bottom,
    );
}

impl Display for Tui {
    fn draw(&mut self, frame: &Frame) -> Result<(), HostError> {
        let logs = &self.logs;
        let t = match self.terminal.as_mut() {
            Some(t) => t,
            None => {
                self.open()?;
                return self.draw(frame);
            }
        };
        let r = t.draw(|f| draw(f, frame, logs)).map(|_| ());
        // A view that cannot draw gives the terminal back (the run goes on).
        r.map_err(|e| {
            self.close();
            HostError::io("drawing the view", e)
        })
    }

    fn key(&mut self) -> Result<Option<Key>, HostError> {
        self.open()?;
        let r = read_key();
        if r.is_err() {
            self.close();
        }
        r
    }

    fn log(&mut self, line: &str) -> bool {
        if self.logs.len() == LOG_LINES {
            self.logs.pop_front();
        }
        self.logs.push_back(printable(line));
        true
    }

    fn finish(&mut self, frame: &Frame) -> Result<(), HostError> {
        self.close();
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(frame.render_table(self.entries).as_bytes());
        let _ = out.flush();
        Ok(())
    }
}

/// The next key of the view waiting on the terminal, if any.
fn read_key() -> Result<Option<Key>, HostError> {
    while event::poll(Duration::ZERO).map_err(io_err("reading the keyboard"))? {
        let ev = event::read().map_err(io_err("reading the keyboard"))?;
        let key = match ev {
            Event::Key(k) if k.kind != KeyEventKind::Release => match k.code {
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                    Some(Key::Quit)
                }
                KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => Some(Key::Quit),
                KeyCode::Char('p') | KeyCode::Tab => Some(Key::NextFilter),
                KeyCode::Char('P') | KeyCode::BackTab => Some(Key::PrevFilter),
                _ => None,
            },
            Event::Resize(..) => Some(Key::Redraw),
            _ => None,
        };
        if key.is_some() {
            return Ok(key);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::{Counters, Row};
    use ratatui::backend::TestBackend;

    #[test]
    fn the_screen_shows_the_status_and_the_ranking_in_order() {
        let frame = Frame {
            totals: Counters {
                samples: 10,
                ..Default::default()
            },
            rows: vec![
                Row {
                    share: 60.0,
                    samples: 6,
                    period: 6,
                    command: "demo64".into(),
                    dso: "demo64".into(),
                    kernel: false,
                    symbol: "demo_checksum_blocks".into(),
                },
                Row {
                    share: 40.0,
                    samples: 4,
                    period: 4,
                    command: "demosys".into(),
                    dso: crate::top::RUNTIME_DSO.into(),
                    kernel: true,
                    symbol: "getrandom".into(),
                },
            ],
            ..Default::default()
        };
        let mut logs = VecDeque::new();
        logs.push_back(printable("[demo64] hi\x1b[2J"));
        let mut t = Terminal::new(TestBackend::new(100, 12)).expect("test backend");
        t.draw(|f| draw(f, &frame, &logs)).expect("draws");
        let screen: Vec<String> = t
            .backend()
            .buffer()
            .content()
            .chunks(100)
            .map(|l| l.iter().map(|c| c.symbol()).collect::<String>())
            .collect();
        let text = screen.join("\n");
        assert!(
            screen[0].starts_with("perch top: 0.0 s: 10 samples"),
            "{text}"
        );
        let a = screen
            .iter()
            .position(|l| l.contains("[.] demo_checksum_blocks") && l.contains("60.00%"))
            .unwrap_or_else(|| panic!("no first row:\n{text}"));
        let b = screen
            .iter()
            .position(|l| l.contains("[k] getrandom") && l.contains("[runtime]"))
            .unwrap_or_else(|| panic!("no second row:\n{text}"));
        assert!(a < b, "{text}");
        assert!(screen[11].contains("[demo64] hi?[2J"), "{text}");
    }
}
