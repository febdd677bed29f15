//! The facade's one error type. Every message is meant for the user: it names the file, model,
//! option or characters at fault and, where there is one, what to do.

use llada_model::ModelError;

/// What can go wrong in [`crate::Engine`] and [`crate::Session`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Loading or running the model (corrupt files, bad requests, context overflow, …).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Invalid decoding options, or an unusable draft head or probe file.
    #[error(transparent)]
    Decode(#[from] llada_decode::DecodeError),
    /// A model name that resolves to nothing (the message says where it looked).
    #[error("{0}")]
    NotFound(String),
    /// Downloading, verifying or unpacking a model into the cache.
    #[error("{0}")]
    Fetch(String),
    /// An invalid option, a prompt the model cannot take, or options of another mode.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Context for fetch steps: the failure becomes an [`Error::Fetch`] that says what was being
/// done.
pub(crate) trait FetchContext<T> {
    fn context(self, what: &str) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: std::fmt::Display> FetchContext<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| Error::Fetch(format!("{what}: {e}")))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Fetch(format!("{}: {e}", what())))
    }
}

impl<T> FetchContext<T> for Option<T> {
    fn context(self, what: &str) -> Result<T> {
        self.ok_or_else(|| Error::Fetch(what.to_string()))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| Error::Fetch(what()))
    }
}

/// `return Err(Error::Fetch(format!(…)))`.
macro_rules! fetch_bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Fetch(format!($($arg)*)))
    };
}
pub(crate) use fetch_bail;

/// `return Err(Error::Invalid(format!(…)))`.
macro_rules! invalid {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Invalid(format!($($arg)*)))
    };
}
pub(crate) use invalid;
