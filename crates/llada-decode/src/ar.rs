//! Autoregressive generation: chunked prefill, then one token per forward pass with the KV cache,
//! streaming decoded text and stopping on EOS ids, stop strings, the token budget or the context.
//!
//! [`ArSequence`] is one sequence's token-by-token state (sampling, stop rules, the text
//! stream): [`generate_in`] drives one through its own passes, a server drives many through
//! shared passes ([`llada_model::Model::forward_many`]); both decide every token the same way.

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
    let mut seq = ArSequence::new(model, prompt, cfg)?;
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
    let reason = loop {
        let step = seq.advance(&logits, model.tokenizer.as_ref());
        let cancelled = !step.text.is_empty() && !on_text(&step.text);
        if cancelled && step.stop != Some(StopReason::StopString) {
            break StopReason::Cancelled;
        }
        let (tok, pos) = match (step.feed, step.stop) {
            (_, Some(r)) => break r,
            (Some(f), None) => f,
            (None, None) => break StopReason::MaxTokens,
        };
        let out =
            lane.run(|| model.forward(&ForwardRequest::causal_append(&[tok], &[pos]), cache))?;
        passes += 1;
        logits = out.logits;
    };
    let decode_s = t1.elapsed().as_secs_f64();
    Ok(GenerateOutput {
        generated_tokens: seq.tokens.len(),
        text: seq.text,
        tokens: seq.tokens,
        prompt_tokens: prompt.len(),
        cached_prompt_tokens: cached,
        forward_passes: passes,
        prefill_s,
        decode_s,
        total_s: t0.elapsed().as_secs_f64(),
        stop_reason: reason,
    })
}

/// One autoregressive sequence between passes: it reads the logits of its last row, samples
/// the next token and says what to feed back, or why it ends.
///
/// Invariants: `tokens` are the generated ids (stop ids excluded); `text` is their final text
/// cut before the first stop string; the sampler's history is the prompt then every sampled id.
pub struct ArSequence {
    sampler: Sampler,
    history: Vec<u32>,
    stop_ids: Vec<u32>,
    stop_strings: Vec<String>,
    stream: TextStream,
    prompt_len: usize,
    max_tokens: usize,
    ctx: usize,
    /// The generated ids.
    pub tokens: Vec<u32>,
    /// Their text so far.
    pub text: String,
    /// Bytes of `text` already handed out as final: the rest could still begin a stop string,
    /// and is held back until the next token decides (or the sequence ends).
    shown: usize,
}

/// What one [`ArSequence::advance`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct ArStep {
    /// The sampled id (`None` only when the sequence had already ended).
    pub token: Option<u32>,
    /// Newly final text.
    pub text: String,
    /// The `(token, position)` row to feed to the next pass, unless the sequence ends.
    pub feed: Option<(u32, u32)>,
    /// Why the sequence ends, if it does.
    pub stop: Option<StopReason>,
}

impl ArSequence {
    /// A sequence after `prompt` (checked: non-empty, inside the context; the sampling
    /// parameters valid).
    pub fn new(model: &Model, prompt: &[u32], cfg: &GenerateConfig) -> Result<Self, ModelError> {
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
        Ok(Self {
            sampler: Sampler::new(cfg.sampling),
            history: prompt.to_vec(),
            stop_ids: if cfg.stop_at_eos {
                model.stop_ids()
            } else {
                vec![]
            },
            stop_strings: cfg.stop_strings.clone(),
            stream: TextStream::new(),
            prompt_len: prompt.len(),
            max_tokens: cfg.max_tokens,
            ctx,
            tokens: vec![],
            text: String::new(),
            shown: 0,
        })
    }

    /// Sample from `logits` (the last row's) and decide: feed the token back, or stop (EOS,
    /// a stop string, the token budget, the context). `tok` decodes the text (none: no text).
    pub fn advance(&mut self, logits: &[f32], tok: Option<&Tokenizer>) -> ArStep {
        let mut step = ArStep {
            token: None,
            text: String::new(),
            feed: None,
            stop: None,
        };
        if self.tokens.len() >= self.max_tokens {
            step.stop = Some(StopReason::MaxTokens);
            return step;
        }
        let next = self.sampler.sample_after(logits, &self.history);
        self.history.push(next);
        step.token = Some(next);
        if self.stop_ids.contains(&next) {
            return self.end(step, StopReason::Eos);
        }
        self.tokens.push(next);
        if let Some(cut) = tok.and_then(|t| self.push_text(t, next, &mut step.text)) {
            self.text.truncate(cut);
            step.stop = Some(StopReason::StopString);
            return step;
        }
        if self.tokens.len() >= self.max_tokens {
            return self.end(step, StopReason::MaxTokens);
        }
        let pos = (self.prompt_len + self.tokens.len() - 1) as u32;
        if pos as usize >= self.ctx {
            return self.end(step, StopReason::Context);
        }
        step.feed = Some((next, pos));
        step
    }

    /// End the sequence for `why` (not a stop string): the held-back text is final now.
    fn end(&mut self, mut step: ArStep, why: StopReason) -> ArStep {
        step.text.push_str(&self.text[self.shown..]);
        self.shown = self.text.len();
        step.stop = Some(why);
        step
    }

    /// Decode `id` into the text; `piece` gets what became final. Returns where a stop string
    /// cuts the text, if one appeared (then `piece` ends before it).
    fn push_text(&mut self, tok: &Tokenizer, id: u32, piece_out: &mut String) -> Option<usize> {
        let piece = self.stream.push(tok, id);
        if piece.is_empty() {
            return None;
        }
        let before = self.text.len();
        self.text.push_str(&piece);
        let text = &self.text;
        let cut = find_stop(text, before, &self.stop_strings);
        // Final: up to the cut, else all but an ending that may still grow into a stop string.
        let upto = cut.unwrap_or_else(|| text.len() - held(text, &self.stop_strings));
        if upto > self.shown {
            piece_out.push_str(&text[self.shown..upto]);
            self.shown = upto;
        }
        cut
    }
}

/// Where the first of `stops` begins in `text`, among the occurrences that end past byte
/// `before` (the text up to `before` was searched already): the cut of a stop string that the
/// newest piece completed.
pub fn find_stop(text: &str, before: usize, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter_map(|s| {
            let from = char_floor(text, before.saturating_sub(s.len()));
            text[from..].find(s.as_str()).map(|i| i + from)
        })
        .min()
}

/// Bytes at the end of `text` that are a proper prefix of one of `stops` (the longest such
/// ending, on a char boundary): text that a later token could turn into a stop string.
fn held(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .map(|s| {
            (1..s.len().min(text.len() + 1))
                .rev()
                .find(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// The largest char boundary of `s` at or below byte `i` (a stop-string search window must
/// not start inside a multi-byte character).
fn char_floor(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::{char_floor, held};

    #[test]
    fn search_windows_start_on_char_boundaries() {
        let s = "x = \"é\"";
        // Byte 6 is inside 'é' (bytes 5–6): the window starts at 5.
        assert_eq!(char_floor(s, 6), 5);
        assert_eq!(char_floor(s, 5), 5);
        assert_eq!(char_floor(s, 0), 0);
    }

    #[test]
    fn text_that_may_begin_a_stop_string_is_held() {
        let stops = ["\n#".to_string(), "\nclass".to_string()];
        // "\n" may begin both: held; "\ncl" may begin "\nclass".
        assert_eq!(held("return x\n", &stops), 1);
        assert_eq!(held("return x\ncl", &stops), 3);
        assert_eq!(held("return x", &stops), 0);
        // A whole stop string is a cut, not a prefix to hold.
        assert_eq!(held("x\n#", &stops), 0);
        // Multi-byte: only whole characters of the stop string count.
        assert_eq!(held("a é", &["é!".to_string()]), 2);
        assert_eq!(held("", &stops), 0);
        assert_eq!(held("abc", &[]), 0);
    }
}
