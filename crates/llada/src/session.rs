//! [`Session`]: generation in every mode through one call, and conversations whose KV cache
//! persists between turns.
//!
//! Invariant: `cache` holds the KV rows of exactly `cached` (ids in order). An autoregressive
//! run reuses the longest common prefix of `cached` and its prompt, so a conversation's next
//! turn prefills only what changed — the new turn, and whatever of the last answer the
//! template renders differently from the ids generated. Speculative and diffusion runs use
//! caches of their own and leave this one as it was.

use crate::draft::DraftSource;
use crate::engine::{Engine, Prompt};
use crate::error::{invalid, Result};
use llada_decode::diffusion::{generate_with, DiffusionOutput, StepView};
use llada_decode::speculative::ahasd::{self, AsyncConfig};
use llada_decode::speculative::drafter::TreeShape;
use llada_decode::speculative::prune::ExitProbe;
use llada_decode::speculative::{SpecConfig, SpecOutput};
use llada_decode::strategy::{DiffusionLanes, StrategyOptions};
use llada_decode::{GenerateConfig, GenerateOutput, SamplingParams};
use llada_formats::tokenizer::Message;
use llada_runtime::KvCache;

/// How to decode.
pub enum Mode<'a> {
    /// Autoregressive, one token per pass.
    Ar,
    /// A drafter proposes token trees the model verifies: the same output as [`Mode::Ar`]
    /// (greedy: token for token; sampling: the same distribution).
    Speculative(Speculative<'a>),
    /// Diffusion denoising (LLaDA, Dream models).
    Diffusion(Diffusion),
}

/// Speculative decoding's options.
pub struct Speculative<'a> {
    pub draft: &'a DraftSource,
    pub shape: TreeShape,
    /// Early-exit verification pruning with this probe ([`DraftSource::probe`]).
    pub early_exit: Option<ExitProbe>,
    /// The AHASD pipeline (chains on asynchronous lanes; greedy) instead of tree verification.
    pub ahasd: Option<Ahasd>,
}

/// AHASD's options.
#[derive(Debug, Clone, Copy)]
pub struct Ahasd {
    /// Lock-step drafting (the pipeline's synchronous baseline).
    pub synchronous: bool,
    pub edc: bool,
    pub tvc: bool,
    /// TVC even where it competes with the verifier.
    pub tvc_shared: bool,
    /// Tokens per draft batch.
    pub batch: usize,
}

/// Diffusion decoding's options.
#[derive(Debug, Clone, Default)]
pub struct Diffusion {
    pub options: StrategyOptions,
    /// A one-thread pool of its own for revision's sparse lane.
    pub sparse_pool: bool,
}

/// Options of one generation (autoregressive and speculative; diffusion takes the answer
/// length from [`StrategyOptions`] and ends answers at the first stop id).
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Greedy by default; the CLI's defaults are llama.cpp's (see its `--help`).
    pub sampling: SamplingParams,
    /// Stop strings (the text is cut before them).
    pub stop: Vec<String>,
    /// Stop at the tokenizer's EOS / end-of-turn ids.
    pub stop_at_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop: vec![],
            stop_at_eos: true,
        }
    }
}

/// What a run reports, by mode.
#[derive(Debug, Clone)]
pub enum Stats {
    Ar(GenerateOutput),
    Speculative(SpecOutput),
    Diffusion(DiffusionOutput),
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub text: String,
    /// The generated ids (diffusion: up to the first stop id).
    pub tokens: Vec<u32>,
    pub prompt_ids: Vec<u32>,
    /// Prompt ids whose KV rows came from the session's cache (not prefilled again).
    pub cached_prompt_tokens: usize,
    pub stats: Stats,
}

/// Something a generation shows as it runs.
pub enum Event<'a> {
    /// Newly final text (autoregressive: piece by piece; other modes: the whole answer).
    Text(&'a str),
    /// A diffusion step's canvas.
    Step(&'a StepView<'a>),
    /// Before anything else: characters of the prompt the model reads as its unknown token
    /// (characters it cannot represent at all are an error instead).
    Unknown(&'a [char]),
}

/// A conversation with an [`Engine`]: its history and its KV cache.
pub struct Session<'e> {
    engine: &'e Engine,
    cache: KvCache,
    cached: Vec<u32>,
    history: Vec<Message>,
}

impl<'e> Session<'e> {
    pub(crate) fn new(engine: &'e Engine) -> Self {
        Self {
            engine,
            cache: engine.model().new_cache(),
            cached: vec![],
            history: vec![],
        }
    }

    /// The conversation so far (system, user and assistant messages).
    pub fn history(&self) -> &[Message] {
        &self.history
    }
    /// Start the conversation over, keeping its system message (the cache stays: the next
    /// turn reuses what it still shares).
    pub fn reset(&mut self) {
        self.history.retain(|m| m.role == "system");
    }
    /// Set (or with `None` remove) the system message.
    pub fn set_system(&mut self, system: Option<&str>) {
        self.history.retain(|m| m.role != "system");
        if let Some(s) = system {
            self.history.insert(0, Message::new("system", s));
        }
    }
    /// How many ids the session's KV cache holds.
    pub fn cached_tokens(&self) -> usize {
        self.cached.len()
    }

    /// Generate after `prompt`; the conversation history is not touched.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        mode: &Mode,
        opts: &GenerateOptions,
    ) -> Result<Generation> {
        self.generate_streaming(prompt, mode, opts, |_| true)
    }

    /// [`Self::generate`], showing `on_event` the text as it becomes final (and diffusion's
    /// steps); `on_event` returns `false` to stop.
    pub fn generate_streaming(
        &mut self,
        prompt: &Prompt,
        mode: &Mode,
        opts: &GenerateOptions,
        mut on_event: impl FnMut(Event) -> bool,
    ) -> Result<Generation> {
        let (ids, unknown) = self.engine.encode(prompt)?;
        if !unknown.is_empty() {
            on_event(Event::Unknown(&unknown));
        }
        match mode {
            Mode::Diffusion(d) => self.diffusion(ids, d, &mut on_event),
            _ if self.engine.is_diffusion() => invalid!(
                "{} is a diffusion model ({:?}): decode it with the diffusion mode",
                self.engine.path().display(),
                self.engine.model().config.arch
            ),
            Mode::Ar => self.ar(ids, opts, &mut on_event),
            Mode::Speculative(s) => self.speculative(ids, s, opts, &mut on_event),
        }
    }

    /// One turn of the conversation: `user` is added to the history, the whole history is the
    /// prompt (chat template), and the answer is added to the history.
    pub fn chat(
        &mut self,
        user: &str,
        mode: &Mode,
        opts: &GenerateOptions,
        on_event: impl FnMut(Event) -> bool,
    ) -> Result<Generation> {
        self.history.push(Message::new("user", user));
        let history = self.history.clone();
        let out = self.generate_streaming(&Prompt::Chat(&history), mode, opts, on_event);
        match &out {
            Ok(g) => self.history.push(Message::new("assistant", g.text.trim())),
            Err(_) => {
                self.history.pop();
            }
        }
        out
    }

    fn config(&self, opts: &GenerateOptions) -> GenerateConfig {
        GenerateConfig {
            max_tokens: opts.max_tokens,
            sampling: opts.sampling,
            stop_strings: opts.stop.clone(),
            stop_at_eos: opts.stop_at_eos,
            ..Default::default()
        }
    }

    fn ar(
        &mut self,
        ids: Vec<u32>,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(Event) -> bool,
    ) -> Result<Generation> {
        // Keep the longest prefix the cache shares with this prompt.
        let shared = self
            .cached
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        self.cache.truncate(shared);
        self.cached.truncate(shared);
        let e = self.engine;
        let cfg = self.config(opts);
        let out =
            llada_decode::generate_in(e.model(), e.lane(), &mut self.cache, &ids, &cfg, |t| {
                on_event(Event::Text(t))
            });
        // Whatever happened, the cache now holds a prefix of prompt + generated ids.
        let all: Vec<u32> = match &out {
            Ok(o) => ids.iter().chain(&o.tokens).copied().collect(),
            Err(_) => ids.clone(),
        };
        let n = self.cache.len().min(all.len());
        self.cache.truncate(n);
        self.cached = all[..n].to_vec();
        let out = out?;
        Ok(Generation {
            text: out.text.clone(),
            tokens: out.tokens.clone(),
            prompt_ids: ids,
            cached_prompt_tokens: out.cached_prompt_tokens,
            stats: Stats::Ar(out),
        })
    }

    fn speculative(
        &mut self,
        ids: Vec<u32>,
        s: &Speculative,
        opts: &GenerateOptions,
        on_event: &mut dyn FnMut(Event) -> bool,
    ) -> Result<Generation> {
        let e = self.engine;
        let target = e.model();
        if let Some(p) = &s.early_exit {
            if p.layer + 1 >= target.config.n_layers {
                invalid!(
                    "the probe exits after layer {}, the target has {} layers: retrain it for this target",
                    p.layer,
                    target.config.n_layers
                );
            }
        }
        // AHASD runs the draft on a lane of its own, beside the verifier. A tree step drafts
        // and then verifies, so its draft model runs on the dense lane, on every core.
        let draft_lane = if s.ahasd.is_some() {
            e.draft_lane()?
        } else {
            e.lane()
        };
        let sparse = e.sparse_lane()?;
        let mut d = s
            .draft
            .drafter(target, draft_lane, opts.sampling.temperature)?;
        let stop_ids = if opts.stop_at_eos {
            e.model().stop_ids()
        } else {
            vec![]
        };
        let out = match &s.ahasd {
            Some(a) => {
                if s.early_exit.is_some() {
                    invalid!(
                        "early exit prunes tree verification; the AHASD pipeline verifies chains"
                    );
                }
                if a.batch == 0 {
                    invalid!("an AHASD draft batch must be at least 1 token");
                }
                let o = ahasd::generate(
                    target,
                    e.lane(),
                    draft_lane,
                    d.as_mut(),
                    &ids,
                    &AsyncConfig {
                        max_tokens: opts.max_tokens,
                        batch: a.batch,
                        max_verify: 16,
                        edc: a.edc,
                        tvc: a.tvc,
                        tvc_on_shared: a.tvc_shared,
                        synchronous: a.synchronous,
                        stop_ids: stop_ids.clone(),
                        sampling: opts.sampling,
                    },
                )?;
                SpecOutput {
                    tokens: o.tokens,
                    verify_passes: o.verify_passes,
                    accepted: o.accepted,
                    draft_s: o.draft_busy_s,
                    verify_s: o.verify_busy_s,
                    prefill_s: o.prefill_s,
                    total_s: o.total_s,
                    tvc_gated: o.tvc_gated,
                    preverified: o.preverified,
                    ..Default::default()
                }
            }
            None => {
                // Stop strings end the run at the step that completes one (the text is cut
                // where an autoregressive run would have stopped, below).
                let tok = e.tokenizer()?;
                let mut stream = llada_decode::ar::TextStream::new();
                let mut shown = String::new();
                let mut on_step = |new: &[u32]| {
                    if opts.stop.is_empty() {
                        return true;
                    }
                    let before = shown.len();
                    for &t in new {
                        shown.push_str(&stream.push(tok, t));
                    }
                    llada_decode::ar::find_stop(&shown, before, &opts.stop).is_none()
                };
                llada_decode::speculative::generate_with(
                    target,
                    e.lane(),
                    Some(sparse),
                    d.as_mut(),
                    &ids,
                    &SpecConfig {
                        max_tokens: opts.max_tokens,
                        sampling: opts.sampling,
                        shape: s.shape.clone(),
                        stop_ids: stop_ids.clone(),
                        exit: s.early_exit.clone(),
                        probe_log: None,
                        fixed_cost: None,
                    },
                    &mut on_step,
                )?
            }
        };
        // Stop ids are emitted by the decoders and end the run: keep them out of the text.
        let tokens = out.tokens.clone();
        self.whole(
            ids,
            &tokens,
            (&stop_ids, &opts.stop),
            Stats::Speculative(out),
            on_event,
        )
    }

    /// A generation whose answer came whole (speculative, diffusion): `tokens` up to the first
    /// of `stop`, decoded and shown to `on_event` as one piece of text. With stop strings, the
    /// text ends before the first one and the tokens at the one that completed it, as an
    /// autoregressive run would have stopped.
    fn whole(
        &self,
        prompt_ids: Vec<u32>,
        tokens: &[u32],
        (stop, stop_strings): (&[u32], &[String]),
        stats: Stats,
        on_event: &mut dyn FnMut(Event) -> bool,
    ) -> Result<Generation> {
        let mut end = tokens
            .iter()
            .position(|t| stop.contains(t))
            .unwrap_or(tokens.len());
        let tok = self.engine.tokenizer()?;
        let mut text = tok.decode(&tokens[..end]);
        if !stop_strings.is_empty() {
            let mut stream = llada_decode::ar::TextStream::new();
            let mut shown = String::new();
            for (i, &t) in tokens[..end].iter().enumerate() {
                let before = shown.len();
                shown.push_str(&stream.push(tok, t));
                let cut = llada_decode::ar::find_stop(&shown, before, stop_strings);
                if let Some(c) = cut {
                    shown.truncate(c);
                    text = shown;
                    end = i + 1;
                    break;
                }
            }
        }
        on_event(Event::Text(&text));
        Ok(Generation {
            text,
            tokens: tokens[..end].to_vec(),
            prompt_ids,
            cached_prompt_tokens: 0,
            stats,
        })
    }

    fn diffusion(
        &mut self,
        ids: Vec<u32>,
        d: &Diffusion,
        on_event: &mut dyn FnMut(Event) -> bool,
    ) -> Result<Generation> {
        let e = self.engine;
        if !e.is_diffusion() {
            invalid!(
                "{} is not a diffusion model: decode it with the autoregressive or speculative mode",
                e.path().display()
            );
        }
        let cfg = d.options.config()?;
        // The engine's lanes: the dense one, and the sparse one where revision asks for a pool
        // of its own ([`DiffusionLanes::new`] says when).
        let sparse = if DiffusionLanes::wants_sparse_pool(&cfg, d.sparse_pool) {
            Some(e.sparse_lane()?)
        } else {
            None
        };
        let mut observe = |v: &StepView| {
            on_event(Event::Step(v));
        };
        let out = generate_with(e.model(), e.lane(), sparse, &ids, &cfg, Some(&mut observe))?;
        let tokens = out.tokens.clone();
        self.whole(
            ids,
            &tokens,
            (&e.model().stop_ids(), &[]),
            Stats::Diffusion(out),
            on_event,
        )
    }
}
