//! The weight stream of a forward pass under a memory budget: how a pass receives its streamed
//! units ([`PassStream`]).
//!
//! A store keeps one **read-ahead stream** ([`Ahead`]) for as long as it lives: a reader thread
//! and a builder thread loop over the streamed units of pass after pass, and rendezvous
//! channels hold them at most two units ahead of the pass that consumes them. So when a pass
//! ends, the first units of the next pass are read and repacked while the caller does whatever
//! comes between two passes — a speculative decoder's drafting, which is when Lever loads the
//! target's first layers — instead of the next pass starting on an empty pipeline. The memory
//! held is that of a pass's pipeline ([`crate::store::Plan::staging_bytes`]), between passes
//! too.
//!
//! Invariants: a pass takes the units of one pass, in order: every message carries its index
//! in the pass, and a pass that starts while the stream is mid-pass (its predecessor stopped on
//! an error) first drops the rest of that pass. An error ends the read-ahead stream (the next
//! pass starts a new one). Only one pass at a time uses it: a second concurrent pass (AHASD's
//! pre-verification beside the verifier) streams through a pipeline of its own, as every pass
//! did before, inside its own thread scope. Dropping the store stops and joins the threads.

use crate::store::{StoreCore, Unit, WeightStore};
use crate::{ModelConfig, ModelError};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

/// One unit of the stream: its index in the pass and the unit (or the error reading it).
type Msg = (usize, Result<Unit, ModelError>);

/// The persistent read-ahead stream of a store.
pub(crate) struct Ahead {
    rx: Option<Receiver<Msg>>,
    /// Index of the next unit a pass expects (0: a pass boundary).
    next: usize,
    /// Units per pass.
    units: usize,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Ahead {
    fn start(core: &Arc<StoreCore>, c: &ModelConfig) -> std::io::Result<Self> {
        let order = core.order(c);
        let units = order.len();
        let (tx, rx): (SyncSender<Msg>, Receiver<Msg>) = std::sync::mpsc::sync_channel(0);
        let (stx, srx) = std::sync::mpsc::sync_channel(0);
        let (rcore, rc) = (core.clone(), c.clone());
        let reader = std::thread::Builder::new()
            .name("llada-storage".into())
            .spawn(move || {
                llada_runtime::trace::set_thread_lane("storage");
                loop {
                    for (i, &u) in order.iter().enumerate() {
                        let r = rcore.read(&rc, u);
                        let failed = r.is_err();
                        if stx.send((i, r)).is_err() || failed {
                            return;
                        }
                    }
                }
            })?;
        let (bcore, bc) = (core.clone(), c.clone());
        let builder = std::thread::Builder::new()
            .name("llada-storage-build".into())
            .spawn(move || {
                llada_runtime::trace::set_thread_lane("storage_build");
                for (i, r) in srx {
                    let r = r.and_then(|staged| bcore.build(&bc, staged));
                    let failed = r.is_err();
                    if tx.send((i, r)).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Self {
            rx: Some(rx),
            next: 0,
            units,
            threads: vec![reader, builder],
        })
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        // Closing the channel stops the builder at its next send, and the reader at its next
        // (each after at most the unit in hand).
        self.rx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How one pass receives its streamed units.
pub(crate) enum PassStream<'s> {
    /// The store's read-ahead stream, held for the pass.
    Ahead {
        core: &'s StoreCore,
        guard: MutexGuard<'s, Option<Ahead>>,
    },
    /// A pipeline of this pass's own (the read-ahead stream is busy with another pass).
    Scoped {
        core: &'s StoreCore,
        rx: Receiver<Result<Unit, ModelError>>,
    },
}

impl WeightStore {
    /// The stream of one pass: the read-ahead stream when no other pass holds it (started on
    /// first use, or again after an error), else a pipeline of the pass's own in `scope`.
    pub(crate) fn open<'s, 'e: 's>(
        &'e self,
        scope: &'s std::thread::Scope<'s, 'e>,
        c: &'e ModelConfig,
    ) -> PassStream<'s> {
        let core: &StoreCore = &self.core;
        if let Ok(mut guard) = self.ahead.try_lock() {
            if guard.is_none() {
                *guard = Ahead::start(&self.core, c).ok();
            }
            if let Some(a) = guard.as_mut() {
                // A pass starts at unit 0: what an interrupted pass left is dropped.
                a.next = 0;
                return PassStream::Ahead { core, guard };
            }
        }
        PassStream::Scoped {
            core,
            rx: core.start(scope, c),
        }
    }
}

impl PassStream<'_> {
    /// Receive the pass's next unit, accounting the wait.
    pub(crate) fn next(&mut self) -> Result<Unit, ModelError> {
        let t = Instant::now();
        let (core, r) = match self {
            PassStream::Scoped { core, rx } => (*core, core_recv(rx)),
            PassStream::Ahead { core, guard } => (*core, ahead_recv(guard)),
        };
        core.stats
            .wait_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

fn core_recv(rx: &Receiver<Result<Unit, ModelError>>) -> Result<Unit, ModelError> {
    rx.recv()
        .map_err(|_| ModelError::Other("the weight prefetch thread stopped".into()))?
}

/// The next unit of the pass from the read-ahead stream. A pass that starts mid-stream drops
/// the rest of the interrupted pass first; an error ends the stream (dropped here, restarted by
/// the next pass).
fn ahead_recv(guard: &mut MutexGuard<'_, Option<Ahead>>) -> Result<Unit, ModelError> {
    let r = (|| {
        let a = guard
            .as_mut()
            .ok_or_else(|| ModelError::Other("the weight stream is closed".into()))?;
        let rx =
            a.rx.as_ref()
                .ok_or_else(|| ModelError::Other("the weight stream is closed".into()))?;
        loop {
            let (i, r) = rx
                .recv()
                .map_err(|_| ModelError::Other("the weight prefetch thread stopped".into()))?;
            if a.next == 0 && i != 0 {
                continue; // the rest of an interrupted pass
            }
            if i != a.next {
                return Err(ModelError::Other(format!(
                    "weight stream out of order: unit {i}, expected {}",
                    a.next
                )));
            }
            a.next = (i + 1) % a.units.max(1);
            return r;
        }
    })();
    if r.is_err() {
        **guard = None;
    }
    r
}
