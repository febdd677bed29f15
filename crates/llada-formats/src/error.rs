//! One error type for every format problem, always naming the file involved.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The I/O error's message is part of this one's (`err` is deliberately not the error's
    /// `source()`: `{:#}` chains — anyhow's — would print it twice).
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: not a GGUF file (magic {magic:02x?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, magic: Vec<u8> },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    BadVersion { path: PathBuf, version: u32 },
    #[error("{path}: file is truncated or corrupt: {what} at byte {offset} runs past the end ({len} bytes)")]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        len: u64,
    },
    #[error("{path}: corrupt: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("{path}: tensor '{tensor}' has unsupported type {ty}")]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        ty: String,
    },
    #[error("{path}: missing tensor '{tensor}'")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor '{tensor}' has shape {got:?}, the config implies {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: missing or invalid metadata '{key}'{detail}")]
    Metadata {
        path: PathBuf,
        key: String,
        detail: String,
    },
    #[error("{path}: unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArch {
        path: PathBuf,
        arch: String,
        supported: String,
    },
    #[error("{path}: tokenizer: {what}")]
    Tokenizer { path: PathBuf, what: String },
}

impl FormatError {
    pub fn io(path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            err,
        }
    }
    pub fn corrupt(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Self::Corrupt {
            path: path.into(),
            what: what.into(),
        }
    }
    pub fn metadata(
        path: impl Into<PathBuf>,
        key: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self::Metadata {
            path: path.into(),
            key: key.into(),
            detail: detail.into(),
        }
    }
}
