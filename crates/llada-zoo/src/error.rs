//! The zoo's one error type. Messages are the user's: they name the option, file or model at
//! fault; [`Error::Context`] adds what was being done, shown before its cause in `{:#}` chains.

/// What can go wrong in the zoo's training, labelling, evaluation and benchmarks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An invalid option or input (the message names it and the accepted values).
    #[error("{0}")]
    Invalid(String),
    /// Loading or running a model.
    #[error(transparent)]
    Model(#[from] llada_model::ModelError),
    /// Resolving a model by name, loading a drafter (the facade).
    #[error(transparent)]
    Facade(#[from] llada::Error),
    /// Reading a model file or checkpoint.
    #[error(transparent)]
    Format(#[from] llada_formats::FormatError),
    /// Training, tokenizing corpora (llada-train reports with anyhow).
    #[error(transparent)]
    Train(#[from] anyhow::Error),
    /// Tensor work on candle (checkpoints written for a draft to start from, the matmul table).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// `source`, while doing `what`.
    #[error("{what}")]
    Context {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `.context(…)` and `.with_context(…)` for results (wrapping the error in
/// [`Error::Context`]) and options (`None` becomes [`Error::Invalid`] with the message).
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| Error::Context {
            what: what().into(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.ok_or_else(|| Error::Invalid(what.into()))
    }
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.ok_or_else(|| Error::Invalid(what().into()))
    }
}

/// `return Err(Error::Invalid(format!(…)))`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Invalid(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// A message error (`String` errors of the decoders' file formats and tokenizers).
pub(crate) fn msg(e: impl std::fmt::Display) -> Error {
    Error::Invalid(e.to_string())
}
