//! A served model's worker: one OS thread that owns the engine and runs **continuous
//! batching** — every active sequence's rows (a prompt chunk, or its one next token) go into
//! one shared forward pass ([`llada_model::Model::forward_many`]), new requests join between
//! passes, finished and cancelled ones leave and free their KV cache.
//!
//! Invariants: at most `parallel` sequences are active; `pending` counts queued plus active
//! jobs and a submit past `parallel + queue` is refused (503); a job whose client went away
//! (its receiver dropped) is removed before the next pass; every job gets exactly one final
//! message (`Done` or `Error`). Diffusion and speculative requests run whole, one at a time,
//! between batches (their decoders own their passes).

use crate::api::{Options, Usage};
use crate::error::ApiError;
use crate::metrics::Metrics;
use llada::{
    DraftSource, Engine, EngineOptions, Event, Mode, Prompt, Speculative, Stats, TreeShape,
};
use llada_decode::ar::{ArSequence, ArStep};
use llada_decode::{GenerateConfig, StopReason};
use llada_formats::tokenizer::Message;
use llada_model::{ForwardRequest, LogitRows, SeqPass};
use llada_runtime::KvCache;
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Prompt rows all sequences together may prefill in one pass (bounds the pause a joining
/// prompt causes the others' streams).
const PREFILL_ROWS_PER_PASS: usize = 256;

/// What a job asks for.
pub enum Input {
    Raw(String),
    Chat(Vec<Message>),
}

/// What a job's client receives.
#[derive(Debug)]
pub enum Out {
    /// Newly final text.
    Text(String),
    /// A diffusion step's canvas (when asked for).
    Canvas(Value),
    Done(Finish),
    Error(ApiError),
}

#[derive(Debug, Clone)]
pub struct Finish {
    /// OpenAI's `finish_reason`: `stop` or `length`.
    pub reason: &'static str,
    pub usage: Usage,
}

/// One request.
pub struct Job {
    pub input: Input,
    pub opts: Options,
    pub tx: UnboundedSender<Out>,
}

/// How a model is served.
#[derive(Clone)]
pub struct ModelSpec {
    /// What `Engine::load` resolves: an alias, a shipped name, a file or directory.
    pub source: String,
    pub engine: EngineOptions,
    /// Drafter for speculative decoding of every request (`--draft`).
    pub draft: Option<String>,
    pub parallel: usize,
    pub queue: usize,
}

/// The handle requests are submitted through.
pub struct Worker {
    tx: mpsc::Sender<Job>,
    pending: Arc<AtomicUsize>,
    limit: usize,
}

impl Worker {
    /// Start the worker thread; the model loads there (requests queue meanwhile).
    /// `kind` is set once the model has loaded (`diffusion` or `autoregressive`).
    pub fn spawn(
        name: &str,
        spec: ModelSpec,
        metrics: Arc<Metrics>,
        kind: Arc<OnceLock<&'static str>>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let pending = Arc::new(AtomicUsize::new(0));
        let limit = spec.parallel + spec.queue;
        let p = pending.clone();
        let label = name.to_string();
        std::thread::Builder::new()
            .name(format!("serve-{name}"))
            .spawn(move || run(&label, spec, rx, p, metrics, kind))?;
        Ok(Self { tx, pending, limit })
    }

    /// Queue `job`, or refuse it when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let before = self.pending.fetch_add(1, Ordering::SeqCst);
        if before >= self.limit {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::busy());
        }
        self.tx.send(job).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            ApiError::internal("the model's worker has stopped")
        })
    }
}

/// The worker thread: load, then serve until every handle is dropped.
fn run(
    name: &str,
    spec: ModelSpec,
    rx: mpsc::Receiver<Job>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    kind: Arc<OnceLock<&'static str>>,
) {
    let loaded = Engine::load(&spec.source, &spec.engine).and_then(|e| {
        let draft = match &spec.draft {
            Some(d) if !e.is_diffusion() => Some(e.load_draft(d, None)?),
            _ => None,
        };
        Ok((e, draft))
    });
    let (engine, draft) = match loaded {
        Ok(x) => x,
        Err(e) => {
            let err = ApiError::internal(format!("model {name} failed to load: {e}"));
            tracing::error!("{}", err.message);
            for job in rx {
                let _ = job.tx.send(Out::Error(err.clone()));
                pending.fetch_sub(1, Ordering::SeqCst);
            }
            return;
        }
    };
    tracing::info!("model {name} loaded from {}", engine.path().display());
    let _ = kind.set(if engine.is_diffusion() {
        "diffusion"
    } else {
        "autoregressive"
    });
    let mut b = Batcher {
        engine: &engine,
        draft: draft.as_ref(),
        parallel: spec.parallel.max(1),
        active: vec![],
        waiting: VecDeque::new(),
        pending,
        metrics,
    };
    b.serve(rx);
}

/// A sequence being decoded in the shared passes.
struct Seq {
    job: Job,
    prompt: Vec<u32>,
    cache: KvCache,
    /// Prompt ids already in the cache.
    fed: usize,
    ar: ArSequence,
    /// The row to feed next, once the prompt is in.
    next: Option<(u32, u32)>,
    passes: usize,
}

struct Batcher<'e> {
    engine: &'e Engine,
    draft: Option<&'e DraftSource>,
    parallel: usize,
    active: Vec<Seq>,
    waiting: VecDeque<Job>,
    pending: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Batcher<'_> {
    fn serve(&mut self, rx: mpsc::Receiver<Job>) {
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                match rx.recv() {
                    Ok(j) => self.waiting.push_back(j),
                    Err(_) => return,
                }
            }
            self.waiting.extend(rx.try_iter());
            self.drop_cancelled();
            self.admit();
            self.metrics.set_load(self.waiting.len(), self.active.len());
            if !self.active.is_empty() {
                self.pass();
            }
            self.metrics.set_load(self.waiting.len(), self.active.len());
        }
    }

    /// A job leaves: one fewer pending.
    fn finish(&self, job: &Job, out: Out) {
        match &out {
            Out::Done(f) => self.metrics.done(&f.usage),
            Out::Error(_) => self.metrics.failed(),
            _ => {}
        }
        let _ = job.tx.send(out);
        self.pending.fetch_sub(1, Ordering::SeqCst);
    }

    /// Remove jobs whose client has gone (their KV caches are freed with them).
    fn drop_cancelled(&mut self) {
        let pending = &self.pending;
        let metrics = &self.metrics;
        let gone = |tx: &UnboundedSender<Out>| {
            let closed = tx.is_closed();
            if closed {
                pending.fetch_sub(1, Ordering::SeqCst);
                metrics.cancelled();
            }
            !closed
        };
        self.waiting.retain(|j| gone(&j.tx));
        self.active.retain(|s| gone(&s.job.tx));
    }

    /// Start waiting jobs: batched ones while slots are free; a whole-run job (diffusion,
    /// speculative) when nothing else is active.
    fn admit(&mut self) {
        let whole = self.engine.is_diffusion() || self.draft.is_some();
        while !self.waiting.is_empty() {
            if whole {
                if !self.active.is_empty() {
                    return;
                }
                let Some(job) = self.waiting.pop_front() else {
                    return;
                };
                let out = self.run_whole(&job);
                self.finish(&job, out);
                continue;
            }
            if self.active.len() >= self.parallel {
                return;
            }
            let Some(job) = self.waiting.pop_front() else {
                return;
            };
            match self.start(&job) {
                Ok((prompt, ar)) => self.active.push(Seq {
                    cache: self.engine.model().new_cache(),
                    job,
                    prompt,
                    fed: 0,
                    ar,
                    next: None,
                    passes: 0,
                }),
                Err(e) => self.finish(&job, Out::Error(e)),
            }
        }
    }

    /// A batched job's prompt ids and decoding state.
    fn start(&self, job: &Job) -> Result<(Vec<u32>, ArSequence), ApiError> {
        let (ids, _) = self.engine.encode(&prompt_of(&job.input))?;
        let o = &job.opts;
        let cfg = GenerateConfig {
            max_tokens: o.max_tokens,
            sampling: o.sampling.resolve(false)?,
            stop_strings: o.stop.clone(),
            stop_at_eos: true,
            ..Default::default()
        };
        let ar = ArSequence::new(self.engine.model(), &ids, &cfg)?;
        Ok((ids, ar))
    }

    /// One shared forward pass over the active sequences, then each one's next token.
    fn pass(&mut self) {
        let t0 = Instant::now();
        // Each sequence's rows: a prompt chunk (within the pass's prefill budget) or its next
        // token. Sequences left without rows this pass wait for the next.
        let mut budget = PREFILL_ROWS_PER_PASS;
        let mut rows: Vec<(usize, Vec<u32>, Vec<u32>, bool)> = vec![];
        for (i, s) in self.active.iter().enumerate() {
            if s.fed < s.prompt.len() {
                let n = (s.prompt.len() - s.fed).min(budget);
                if n == 0 {
                    continue;
                }
                budget -= n;
                let end = s.fed + n;
                let pos = (s.fed as u32..end as u32).collect();
                rows.push((i, s.prompt[s.fed..end].to_vec(), pos, end == s.prompt.len()));
            } else if let Some((t, p)) = s.next {
                rows.push((i, vec![t], vec![p], true));
            }
        }
        let n_rows: usize = rows.iter().map(|r| r.1.len()).sum();
        let mut caches: Vec<Option<&mut KvCache>> =
            self.active.iter_mut().map(|s| Some(&mut s.cache)).collect();
        let mut passes: Vec<SeqPass> = rows
            .iter()
            .map(|(i, toks, pos, last)| {
                let mut req = ForwardRequest::causal_append(toks, pos);
                if !last {
                    req.logits = LogitRows::None;
                }
                SeqPass {
                    req,
                    cache: caches[*i].take().expect("one row set per sequence"),
                }
            })
            .collect();
        let model = self.engine.model();
        let out = self.engine.lane().run(|| model.forward_many(&mut passes));
        drop(passes);
        self.metrics.pass(t0.elapsed().as_secs_f64(), n_rows);
        let outs = match out {
            Ok(o) => o,
            Err(e) => {
                let err = ApiError::from(e);
                for s in std::mem::take(&mut self.active) {
                    self.finish(&s.job, Out::Error(err.clone()));
                }
                return;
            }
        };
        let tok = model.tokenizer.as_ref();
        // The prompt rows are in; each sequence whose last row has logits samples its next
        // token — in parallel on the lane's threads (a top-k selection over the vocabulary per
        // sequence is too much for this thread alone at 32 sequences).
        let mut work: Vec<(usize, &mut Seq, Vec<f32>)> = vec![];
        let mut by_index: Vec<Option<&mut Seq>> = self.active.iter_mut().map(Some).collect();
        for ((i, toks, _, last), o) in rows.iter().zip(outs) {
            let Some(s) = by_index[*i].take() else {
                continue;
            };
            s.passes += 1;
            if s.fed < s.prompt.len() {
                s.fed += toks.len();
            }
            if *last {
                work.push((*i, s, o.logits));
            }
        }
        let steps: Vec<(usize, ArStep)> = self.engine.lane().run(|| {
            work.par_iter_mut()
                .map(|(i, s, logits)| (*i, s.ar.advance(logits, tok)))
                .collect()
        });
        drop(work);
        let mut ended = vec![];
        for (i, step) in steps {
            let s = &mut self.active[i];
            let ArStep {
                text, feed, stop, ..
            } = step;
            s.next = feed;
            if !text.is_empty() && s.job.tx.send(Out::Text(text)).is_err() {
                continue; // The client went away: removed before the next pass.
            }
            if let Some(r) = stop {
                ended.push((i, r));
            }
        }
        ended.sort_unstable_by_key(|e| e.0);
        for (i, r) in ended.into_iter().rev() {
            let s = self.active.swap_remove(i);
            let usage = Usage {
                prompt: s.prompt.len(),
                completion: s.ar.tokens.len(),
                passes: s.passes,
                ..Default::default()
            };
            self.finish(
                &s.job,
                Out::Done(Finish {
                    reason: finish_reason(r),
                    usage,
                }),
            );
        }
    }

    /// A diffusion or speculative request, run whole on the engine.
    fn run_whole(&self, job: &Job) -> Out {
        match self.whole(job) {
            Ok(f) => Out::Done(f),
            Err(e) => Out::Error(e),
        }
    }

    fn whole(&self, job: &Job) -> Result<Finish, ApiError> {
        let e = self.engine;
        let o = &job.opts;
        let spec;
        let mode = match self.draft {
            _ if e.is_diffusion() => Mode::Diffusion(llada::Diffusion {
                options: o.diffusion.clone(),
                sparse_pool: false,
            }),
            Some(d) => {
                spec = Speculative {
                    draft: d,
                    shape: TreeShape::default(),
                    early_exit: None,
                    ahasd: None,
                };
                Mode::Speculative(spec)
            }
            None => Mode::Ar,
        };
        let gen = llada::GenerateOptions {
            max_tokens: o.max_tokens,
            sampling: o.sampling.resolve(e.is_diffusion())?,
            stop: o.stop.clone(),
            stop_at_eos: true,
        };
        let tok = e.tokenizer()?;
        let mut session = e.session();
        let mut frames = Frames::new(job, e.is_diffusion() && o.denoising, o.diffusion.gen_length);
        let g = session.generate_streaming(&prompt_of(&job.input), &mode, &gen, |ev| match ev {
            Event::Text(t) => frames.flush() && job.tx.send(Out::Text(t.to_string())).is_ok(),
            Event::Step(v) => frames.step(canvas(v, tok)),
            _ => !job.tx.is_closed(),
        })?;
        frames.flush();
        // A whole answer ends by length when it used all its room (its own stop otherwise).
        let by_length = |room: usize| {
            if g.tokens.len() >= room {
                "length"
            } else {
                "stop"
            }
        };
        let (passes, drafted, accepted, reason) = match &g.stats {
            Stats::Ar(a) => (a.forward_passes, None, None, finish_reason(a.stop_reason)),
            Stats::Speculative(s) => (
                s.verify_passes,
                Some(s.tree_nodes),
                Some(s.accepted),
                by_length(o.max_tokens),
            ),
            Stats::Diffusion(d) => (
                d.forward_passes,
                None,
                None,
                by_length(o.diffusion.gen_length),
            ),
        };
        Ok(Finish {
            reason,
            usage: Usage {
                prompt: g.prompt_ids.len(),
                completion: g.tokens.len(),
                drafted,
                accepted,
                passes,
            },
        })
    }
}

/// The `denoising` events of a diffusion request: step 0 (every position masked) first, then
/// each step's canvas numbered, the last one marked `final` (it only makes the answer stable).
struct Frames<'j> {
    job: &'j Job,
    on: bool,
    step: usize,
    held: Option<Value>,
}

impl<'j> Frames<'j> {
    fn new(job: &'j Job, on: bool, gen_length: usize) -> Self {
        if on {
            let cell = json!({"id": null, "text": "", "state": "invisible", "revised": false});
            let c = json!({"step": 0, "canvas": vec![cell; gen_length]});
            let _ = job.tx.send(Out::Canvas(c));
        }
        Self {
            job,
            on,
            step: 0,
            held: None,
        }
    }
    /// A step's canvas: the one before it is sent (this one may be the last).
    fn step(&mut self, mut c: Value) -> bool {
        if !self.on {
            return !self.job.tx.is_closed();
        }
        self.step += 1;
        c["step"] = json!(self.step);
        match self.held.replace(c) {
            Some(prev) => self.job.tx.send(Out::Canvas(prev)).is_ok(),
            None => true,
        }
    }
    /// Send the last canvas, marked final.
    fn flush(&mut self) -> bool {
        match self.held.take() {
            Some(mut c) => {
                c["final"] = json!(true);
                self.job.tx.send(Out::Canvas(c)).is_ok()
            }
            None => true,
        }
    }
}

fn prompt_of(input: &Input) -> Prompt<'_> {
    match input {
        Input::Raw(t) => Prompt::Raw(t),
        Input::Chat(m) => Prompt::Chat(m),
    }
}

fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::MaxTokens | StopReason::Context => "length",
        _ => "stop",
    }
}

/// A diffusion step as the playground draws it: the answer's positions with their ids, text
/// pieces and states, and which were revised.
fn canvas(
    v: &llada_decode::diffusion::StepView,
    tok: &llada_formats::tokenizer::Tokenizer,
) -> Value {
    let n = v.states.len();
    let start = v.tokens.len() - n;
    let cells: Vec<Value> = (0..n)
        .map(|i| {
            let id = v.tokens[start + i];
            let masked = id == v.mask_id;
            json!({
                "id": id,
                "text": if masked { String::new() } else { tok.decode(&[id]) },
                "state": format!("{:?}", v.states[i]).to_lowercase(),
                "revised": v.revised.get(i).copied().unwrap_or(false),
            })
        })
        .collect();
    json!({ "canvas": cells })
}
