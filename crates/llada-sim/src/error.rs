//! Typed errors of the simulator: every bad input (trace line, profile key, shape name) names
//! where it came from; nothing in the crate panics on input.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SimError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("trace line {line}: {msg}")]
    Trace { line: usize, msg: String },
    #[error("trace: {0}")]
    EmptyTrace(String),
    #[error("profile {name}: {msg}")]
    Profile { name: String, msg: String },
    #[error("unknown profile '{0}' (built in: {1})")]
    UnknownProfile(String, String),
    #[error("unknown model shape '{0}' (known: {1})")]
    UnknownShape(String, String),
    #[error("{0}")]
    Schedule(String),
    #[error("output {path}: {msg}")]
    Output { path: String, msg: String },
}

pub type Result<T> = std::result::Result<T, SimError>;
