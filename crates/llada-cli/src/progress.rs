//! The zoo's progress reports ([`llada_zoo::Progress`]) drawn on stderr: a bar per long
//! routine ([`Bar`]), and a bar per labelling phase over windows that also prints a line every
//! 32 windows when stderr is not a terminal (where the bar is not drawn).

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A progress bar on stderr; lines for the user are printed above it.
pub(crate) struct Bar(pub(crate) ProgressBar);

impl Bar {
    /// A bar of `len` steps in the default style.
    pub(crate) fn new(len: u64) -> Self {
        Self(crate::progress_bar(len))
    }
    /// A bar of `len` steps drawn with `template` (indicatif's syntax).
    pub(crate) fn styled(len: u64, template: &str) -> Self {
        let pb = ProgressBar::new(len);
        pb.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self(pb)
    }
    /// No bar of its own: lines, and the bars of labelling phases.
    pub(crate) fn lines() -> Self {
        Self(ProgressBar::hidden())
    }
}

impl llada_zoo::Progress for Bar {
    fn set_len(&self, n: u64) {
        self.0.set_length(n);
    }
    fn inc(&self, n: u64) {
        self.0.inc(n);
    }
    fn set_pos(&self, k: u64) {
        self.0.set_position(k);
    }
    fn status(&self, msg: &str) {
        self.0.set_message(msg.to_string());
    }
    fn note(&self, line: &str) {
        self.0.suspend(|| eprintln!("{line}"));
    }
    fn finish(&self) {
        self.0.finish_and_clear();
    }
    fn windows(&self, what: &'static str, n: u64) -> Box<dyn llada_zoo::Progress + '_> {
        Box::new(WindowsBar::new(what, n))
    }
}

/// A labelling phase: a bar over `n` windows (lines every 32 windows when stderr is not a
/// terminal), left drawn when done.
struct WindowsBar {
    pb: ProgressBar,
    done: AtomicUsize,
    what: &'static str,
}

impl WindowsBar {
    fn new(what: &'static str, n: u64) -> Self {
        let pb = ProgressBar::new(n);
        pb.set_style(
            ProgressStyle::with_template(&format!(
                "{what} {{bar:30}} {{pos}}/{{len}} windows [{{elapsed_precise}} < {{eta_precise}}]"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self {
            pb,
            done: AtomicUsize::new(0),
            what,
        }
    }
}

impl llada_zoo::Progress for WindowsBar {
    /// Windows are done.
    fn inc(&self, n: u64) {
        self.pb.inc(n);
        let i = self.done.fetch_add(n as usize, Ordering::Relaxed);
        if (i + 1).is_multiple_of(32) && !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            let n = self.pb.length().unwrap_or(0);
            eprintln!("{}: {}/{n} windows", self.what, i + 1);
        }
    }
    fn note(&self, line: &str) {
        self.pb.suspend(|| eprintln!("{line}"));
    }
    fn finish(&self) {
        self.pb.finish();
    }
}
