//! One file per subcommand: each parses its options, calls the library and prints.

pub mod chat;
pub mod fetch;
pub mod generate;
pub mod info;
