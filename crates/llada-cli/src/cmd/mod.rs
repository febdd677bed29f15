//! One file per subcommand: each parses its options, calls the library and prints.

pub mod chat;
pub mod convert;
pub mod decoding;
pub mod eval;
pub mod fetch;
pub mod generate;
pub mod info;
pub mod quantize;
pub mod serve;
pub mod sim;
pub mod synth;
pub mod train;
pub mod train_feature_draft;
pub mod train_probe;
pub mod train_self_draft;
