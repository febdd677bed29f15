//! The papers' experiments (filled below).
