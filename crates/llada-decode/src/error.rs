//! The decoders' error type for what is not a forward-pass error ([`llada_model::ModelError`]):
//! invalid options and unusable head or probe files. Messages are meant for the user.

use llada_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// An option out of range, or options that exclude each other.
    #[error("{0}")]
    Invalid(String),
    /// A head or probe file that cannot be read, written, parsed or used with this target
    /// (the message names the file).
    #[error("{0}")]
    File(String),
}

/// A decoder asked to run with invalid options: a bad request of the forward pass's caller.
impl From<DecodeError> for ModelError {
    fn from(e: DecodeError) -> Self {
        ModelError::BadRequest(e.to_string())
    }
}
