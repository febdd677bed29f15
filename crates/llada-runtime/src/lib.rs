//! Runtime: where work runs and what it leaves behind.
//!
//! * [`lane`]: a lane is a named worker pool (dense lane for batched forward passes, sparse lane
//!   for small irregular work, draft lane for speculative drafters); decoders submit work to lanes.
//! * [`kv`]: the KV cache, slot-addressed so rows can be overwritten (revision) and truncated
//!   (rollback).
//! * [`trace`]: the operator trace (op, shapes, bytes, lane, start/end) that benches read (and
//!   that a hardware simulator would replay).
pub mod kv;
pub mod lane;
pub mod trace;

pub use kv::{KvCache, KvError};
pub use lane::Lane;
pub use trace::{OpRecord, Tracer};
