//! Execution lanes.
//!
//! A lane owns a rayon thread pool whose threads carry the lane's name (visible in traces).
//! Work submitted with [`Lane::run`] executes on the lane's threads and every parallel kernel
//! inside it uses only that lane's threads, so a dense lane and a sparse lane can run
//! concurrently on disjoint cores. Where the cores are too few for a pool each, two lanes'
//! work runs concurrently on one pool with [`Lane::join`] (each still traced under its own
//! lane name).

use crate::trace::{set_thread_lane, thread_lane};
use std::sync::mpsc;

/// A named worker pool.
pub struct Lane {
    name: String,
    pool: rayon::ThreadPool,
}

/// A pending result of [`Lane::submit`].
pub struct Pending<T>(mpsc::Receiver<T>);

impl<T> Pending<T> {
    /// Wait for the result; `None` if the work panicked.
    pub fn wait(self) -> Option<T> {
        self.0.recv().ok()
    }
    /// The result if it is ready.
    pub fn try_get(&self) -> Option<T> {
        self.0.try_recv().ok()
    }
}

impl Lane {
    /// A lane named `name` with `threads` worker threads (at least one).
    pub fn new(name: &str, threads: usize) -> std::io::Result<Self> {
        let lane_name = name.to_string();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name({
                let n = name.to_string();
                move |i| format!("llada-{n}-{i}")
            })
            .start_handler(move |_| set_thread_lane(&lane_name))
            .build()
            .map_err(std::io::Error::other)?;
        Ok(Self {
            name: name.to_string(),
            pool,
        })
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
    /// Run `f` on this lane and wait for it.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.pool.install(f)
    }
    /// Run `a` and `b` concurrently on this lane's threads and wait for both (rayon's
    /// work-stealing join: another of the lane's threads takes `b` as soon as it is free, and
    /// a thread that finishes early helps with the other's parallel kernels). `b`'s operators
    /// are traced under the lane name `b_lane`.
    ///
    /// This is how two lanes share cores without oversubscribing them: on a machine with
    /// fewer cores than the two lanes' pools have threads, a separate pool's thread preempts a
    /// worker of this one, and every parallel kernel of `a` then waits for the preempted
    /// worker's chunk (measured on 2 cores: the dense pass ≈ 1.5x slower beside a one-thread
    /// sparse pool, more than the sparse work itself).
    pub fn join<A, B, RA, RB>(&self, a: A, b: B, b_lane: &str) -> (RA, RB)
    where
        A: FnOnce() -> RA + Send,
        B: FnOnce() -> RB + Send,
        RA: Send,
        RB: Send,
    {
        self.pool.install(|| {
            rayon::join(a, || {
                let prev = thread_lane();
                set_thread_lane(b_lane);
                let r = b();
                set_thread_lane(&prev);
                r
            })
        })
    }
    /// Start `f` on this lane without waiting.
    pub fn submit<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Pending<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.pool.spawn(move || {
            let _ = tx.send(f());
        });
        Pending(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_run_on_their_own_threads() {
        let dense = Lane::new("dense", 2).unwrap();
        let sparse = Lane::new("sparse", 1).unwrap();
        assert_eq!(dense.run(crate::trace::thread_lane), "dense");
        assert_eq!(dense.run(rayon::current_num_threads), 2);
        let (a, b) = dense.join(
            || (crate::trace::thread_lane(), rayon::current_num_threads()),
            || (crate::trace::thread_lane(), rayon::current_num_threads()),
            "sparse",
        );
        assert_eq!((a, b), (("dense".into(), 2), ("sparse".into(), 2)));
        assert_eq!(
            dense.run(crate::trace::thread_lane),
            "dense",
            "tag restored"
        );
        let p = sparse.submit(|| (crate::trace::thread_lane(), rayon::current_num_threads()));
        assert_eq!(p.wait(), Some(("sparse".to_string(), 1)));
    }
}
