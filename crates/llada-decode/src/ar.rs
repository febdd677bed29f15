//! Autoregressive generation: chunked prefill, then one token per forward pass with the KV cache,
//! streaming decoded text and stopping on EOS ids, stop strings, the token budget or the context.

use crate::sampling::Sampler;
use crate::SamplingParams;
use llada_formats::tokenizer::Tokenizer;
use llada_model::{ForwardRequest, Model, ModelError};
use llada_runtime::Lane;
use serde::Serialize;
use std::time::Instant;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateConfig {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Extra stop strings (the text is cut before them).
    pub stop_strings: Vec<String>,
    /// Stop at the tokenizer's EOS / end-of-turn ids.
    pub stop_at_eos: bool,
    /// Prompt tokens per prefill pass.
    pub prefill_chunk: usize,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        Self {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            stop_strings: vec![],
            stop_at_eos: true,
            prefill_chunk: 512,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    StopString,
    MaxTokens,
    Context,
    Cancelled,
}

/// Result of a generation.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateOutput {
    pub text: String,
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV rows were already in the cache (not prefilled again).
    pub cached_prompt_tokens: usize,
    pub generated_tokens: usize,
    pub forward_passes: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub total_s: f64,
    pub stop_reason: StopReason,
}

/// Incremental detokenizer: emits only text that is final (no dangling partial UTF-8).
pub struct TextStream {
    ids: Vec<u32>,
    emitted: usize,
}

impl Default for TextStream {
    fn default() -> Self {
        Self::new()
    }
}

impl TextStream {
    pub fn new() -> Self {
        Self {
            ids: vec![],
            emitted: 0,
        }
    }
    /// Add a token; return the newly final text.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.ids.push(id);
        let text = tok.decode(&self.ids);
        if text.ends_with('\u{FFFD}')
            || text.len() < self.emitted
            || !text.is_char_boundary(self.emitted)
        {
            return String::new();
        }
        let new = text[self.emitted..].to_string();
        self.emitted = text.len();
        new
    }
}

/// Generate after `prompt` (token ids). `on_text` receives each newly final piece of text and
/// returns `false` to cancel. Work runs on `lane`.
pub fn generate(
    model: &Model,
    lane: &Lane,
    prompt: &[u32],
    cfg: &GenerateConfig,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerateOutput, ModelError> {
    generate_in(model, lane, &mut model.new_cache(), prompt, cfg, on_text)
}

/// [`generate`] into `cache`, which holds the KV rows of a prefix of `prompt` (of
/// `cache.len()` tokens, at most all but the last; a longer cache is cut to that): only the
/// rest of the prompt is prefilled — a conversation's next turn costs its new tokens only.
/// Afterwards the cache holds the prompt and every generated token that was fed back (all but
/// the last one sampled when the budget or a stop string ended the run).
pub fn generate_in(
    model: &Model,
    lane: &Lane,
    cache: &mut llada_runtime::KvCache,
    prompt: &[u32],
    cfg: &GenerateConfig,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerateOutput, ModelError> {
    let t0 = Instant::now();
    let ctx = model.config.max_ctx;
    if prompt.is_empty() {
        return Err(ModelError::BadRequest("the prompt is empty".into()));
    }
    if prompt.len() >= ctx {
        return Err(ModelError::ContextOverflow {
            pos: prompt.len() as u32,
            ctx,
        });
    }
    cfg.sampling.validate()?;
    let tok = model.tokenizer.as_ref();
    let stop_ids: Vec<u32> = if cfg.stop_at_eos {
        model.stop_ids()
    } else {
        vec![]
    };
    let mut sampler = Sampler::new(cfg.sampling);
    let mut passes = 0;

    // Prefill what the cache lacks, in chunks.
    let cached = cache.len().min(prompt.len() - 1);
    cache.truncate(cached);
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut logits = Vec::new();
    let chunk_len = cfg.prefill_chunk.max(1);
    for (c, chunk) in prompt[cached..].chunks(chunk_len).enumerate() {
        let start = cached + c * chunk_len;
        let pos = &positions[start..start + chunk.len()];
        let out = lane.run(|| model.forward(&ForwardRequest::causal_append(chunk, pos), cache))?;
        passes += 1;
        logits = out.logits;
    }
    let prefill_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut tokens = Vec::new();
    let mut stream = TextStream::new();
    let mut text = String::new();
    let mut reason = StopReason::MaxTokens;
    let mut cancelled = false;
    // What the repetition penalty looks back over: the prompt, then every sampled token.
    let mut history = prompt.to_vec();
    while tokens.len() < cfg.max_tokens {
        let next = sampler.sample_after(&logits, &history);
        history.push(next);
        if stop_ids.contains(&next) {
            reason = StopReason::Eos;
            break;
        }
        tokens.push(next);
        if let Some(t) = tok {
            let piece = stream.push(t, next);
            if !piece.is_empty() {
                let before = text.len();
                text.push_str(&piece);
                if let Some(cut) = cfg
                    .stop_strings
                    .iter()
                    .filter_map(|s| {
                        text[before.saturating_sub(s.len())..]
                            .find(s.as_str())
                            .map(|i| i + before.saturating_sub(s.len()))
                    })
                    .min()
                {
                    let visible = cut.saturating_sub(before);
                    on_text(&piece[..visible.min(piece.len())]);
                    text.truncate(cut);
                    reason = StopReason::StopString;
                    break;
                }
                if !on_text(&piece) {
                    cancelled = true;
                }
            }
        }
        if cancelled {
            reason = StopReason::Cancelled;
            break;
        }
        if tokens.len() >= cfg.max_tokens {
            break;
        }
        let pos = (prompt.len() + tokens.len() - 1) as u32;
        if pos as usize >= ctx {
            reason = StopReason::Context;
            break;
        }
        let out =
            lane.run(|| model.forward(&ForwardRequest::causal_append(&[next], &[pos]), cache))?;
        passes += 1;
        logits = out.logits;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    Ok(GenerateOutput {
        generated_tokens: tokens.len(),
        text,
        tokens,
        prompt_tokens: prompt.len(),
        cached_prompt_tokens: cached,
        forward_passes: passes,
        prefill_s,
        decode_s,
        total_s: t0.elapsed().as_secs_f64(),
        stop_reason: reason,
    })
}
