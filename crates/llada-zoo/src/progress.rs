//! How the zoo's long routines report while they run. The library draws nothing: a front-end
//! implements [`Progress`] (the CLI with progress bars on stderr); [`Silent`] ignores it all.

/// What a long routine reports: its length in steps, steps done, what runs now, lines for the
/// user, and counted phases of its own (a labelling pass over windows).
pub trait Progress: Sync {
    /// The work is now `n` steps long.
    fn set_len(&self, _n: u64) {}
    /// `n` more steps are done.
    fn inc(&self, _n: u64) {}
    /// `k` steps are done.
    fn set_pos(&self, _k: u64) {}
    /// What runs now (shown beside the bar).
    fn status(&self, _msg: &str) {}
    /// A line for the user (printed above any bar).
    fn note(&self, _line: &str) {}
    /// The work is over (the bar goes away).
    fn finish(&self) {}
    /// A phase over `n` windows named `what` ("labelling", "soft labels", …), reported on its
    /// own; it ends with [`Progress::finish`].
    fn windows(&self, _what: &'static str, _n: u64) -> Box<dyn Progress + '_> {
        Box::new(Silent)
    }
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}
