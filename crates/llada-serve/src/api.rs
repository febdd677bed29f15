//! The OpenAI request bodies (`/v1/completions`, `/v1/chat/completions`), parsed and checked
//! into a [`Job`]'s options, and the response bodies.
//!
//! Invariants: a body is refused (400, naming the field) when it is not JSON, when a known
//! field has the wrong type or an impossible value; unknown fields are ignored (clients send
//! extras). Nothing in a body names a file: `model` is looked up among the served names only.

use crate::error::ApiError;
use llada::SamplingChoice;
use llada_decode::strategy::{Strategy, StrategyOptions};
use llada_formats::tokenizer::Message;
use serde::Deserialize;
use serde_json::{json, Value};

/// The most tokens one request may ask for (beyond it the context ends it anyway).
pub const MAX_TOKENS_CAP: i64 = 1 << 20;

/// A string or a list of strings (`prompt`, `stop`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    /// Diffusion models: one event per denoising step with the canvas.
    #[serde(default)]
    pub denoising: bool,
}

/// The fields both endpoints share.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<OneOrMany>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    // Diffusion models.
    pub steps: Option<i64>,
    pub gen_length: Option<i64>,
    pub block_length: Option<i64>,
    pub threshold: Option<f64>,
    pub strategy: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: OneOrMany,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: Common,
}

/// A chat message's content: text, or OpenAI's list of parts (text parts only).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: Common,
}

/// Parse a body, refusing what is not JSON or has a field of the wrong type.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad("body", format!("the body is not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::bad(
            "body",
            "the body is empty: send a JSON object",
        ));
    }
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::bad("body", format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("body", "the body must be a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad("body", format!("invalid request: {e}")))
}

/// How a request decodes, checked.
#[derive(Debug, Clone)]
pub struct Options {
    pub max_tokens: usize,
    pub sampling: SamplingChoice,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub denoising: bool,
    /// Diffusion models: the strategy options (answer length from `gen_length`/`max_tokens`).
    pub diffusion: StrategyOptions,
}

fn in_range(name: &str, v: f64, lo: f64, hi: f64) -> Result<f32, ApiError> {
    if !(v.is_finite() && v >= lo && v <= hi) {
        return Err(ApiError::bad(
            name,
            format!("{name} {v}: must be in [{lo}, {hi}]"),
        ));
    }
    Ok(v as f32)
}

fn positive(name: &str, v: i64, hi: i64) -> Result<usize, ApiError> {
    if v < 1 || v > hi {
        return Err(ApiError::bad(
            name,
            format!("{name} {v}: must be in [1, {hi}]"),
        ));
    }
    Ok(v as usize)
}

impl Common {
    /// The checked options; `default_max` when the request gives no `max_tokens`.
    pub fn options(&self, default_max: usize) -> Result<Options, ApiError> {
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(v) => positive("max_tokens", v, MAX_TOKENS_CAP)?,
            None => default_max,
        };
        if let Some(n) = self.n.filter(|&n| n != 1) {
            return Err(ApiError::bad(
                "n",
                format!("n {n}: only 1 choice per request"),
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if let Some(v) = v.filter(|&v| v != 0.0) {
                return Err(ApiError::bad(
                    name,
                    format!("{name} {v}: not supported (use repeat_penalty)"),
                ));
            }
        }
        let sampling = SamplingChoice {
            temperature: self
                .temperature
                .map(|t| in_range("temperature", t, 0.0, 2.0))
                .transpose()?,
            top_p: self
                .top_p
                .map(|p| in_range("top_p", p, 0.0, 1.0))
                .transpose()?,
            top_k: self
                .top_k
                .map(|k| {
                    if k < 0 {
                        Err(ApiError::bad("top_k", format!("top_k {k}: must be ≥ 0")))
                    } else {
                        Ok(k as usize)
                    }
                })
                .transpose()?,
            min_p: self
                .min_p
                .map(|p| in_range("min_p", p, 0.0, 1.0))
                .transpose()?,
            repeat_penalty: self
                .repeat_penalty
                .map(|p| in_range("repeat_penalty", p, 0.01, 100.0))
                .transpose()?,
            repeat_last_n: None,
            seed: self.seed,
        };
        let stop = match &self.stop {
            None => vec![],
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(|s| s.is_empty() || s.len() > 256) {
            return Err(ApiError::bad(
                "stop",
                "stop: at most 4 strings, each 1 to 256 bytes",
            ));
        }
        let so = self.stream_options.as_ref();
        Ok(Options {
            max_tokens,
            sampling,
            stop,
            stream: self.stream,
            include_usage: so.is_some_and(|o| o.include_usage),
            denoising: so.is_some_and(|o| o.denoising),
            diffusion: self.diffusion(max_tokens, self.max_tokens.is_some())?,
        })
    }

    /// Diffusion options: `gen_length` (else `max_tokens` if given, else 64), `steps`,
    /// `block_length`, `threshold`, `strategy` (default `vanilla`, as `llada generate`).
    fn diffusion(&self, max_tokens: usize, max_given: bool) -> Result<StrategyOptions, ApiError> {
        let strategy = match &self.strategy {
            None => Strategy::Vanilla,
            Some(s) => Strategy::parse(s).ok_or_else(|| {
                let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
                ApiError::bad(
                    "strategy",
                    format!("strategy {s:?}: one of {}", names.join(", ")),
                )
            })?,
        };
        let mut o = StrategyOptions {
            strategy,
            ..Default::default()
        };
        o.gen_length = match self.gen_length {
            Some(g) => positive("gen_length", g, 4096)?,
            None if max_given => max_tokens.min(4096),
            None => 64,
        };
        match self.block_length {
            Some(b) => o.block_length = positive("block_length", b, 4096)?,
            // One block when the default does not divide the answer.
            None if !o.gen_length.is_multiple_of(o.block_length) => o.block_length = o.gen_length,
            None => {}
        }
        o.block_length = o.block_length.min(o.gen_length);
        if let Some(s) = self.steps {
            o.steps = Some(positive("steps", s, 4096)?);
        }
        if let Some(t) = self.threshold {
            o.threshold = Some(in_range("threshold", t, 0.0, 1.0)?);
        }
        if let Some(t) = self.temperature {
            o.temperature = t as f32;
        }
        if let Some(s) = self.seed {
            o.seed = s;
        }
        // The combination is checked where the model is known to be a diffusion model.
        Ok(o)
    }
}

impl CompletionRequest {
    /// The prompt text (one prompt per request).
    pub fn prompt(&self) -> Result<&str, ApiError> {
        if self.echo {
            return Err(ApiError::bad("echo", "echo is not supported"));
        }
        match &self.prompt {
            OneOrMany::One(s) => Ok(s),
            OneOrMany::Many(v) if v.len() == 1 => Ok(&v[0]),
            OneOrMany::Many(v) => Err(ApiError::bad(
                "prompt",
                format!("{} prompts: send one prompt per request", v.len()),
            )),
        }
    }
}

impl ChatRequest {
    /// The conversation, checked: roles system/user/assistant, text content.
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad("messages", "messages is empty"));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                if !matches!(
                    m.role.as_str(),
                    "system" | "user" | "assistant" | "developer"
                ) {
                    return Err(ApiError::bad(
                        "messages",
                        format!("messages[{i}].role {:?}: system, user or assistant", m.role),
                    ));
                }
                let role = if m.role == "developer" {
                    "system"
                } else {
                    &m.role
                };
                let text = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut t = String::new();
                        for p in parts {
                            match (&*p.kind, &p.text) {
                                ("text", Some(x)) => t.push_str(x),
                                _ => {
                                    return Err(ApiError::bad(
                                        "messages",
                                        format!(
                                        "messages[{i}]: content part of type {:?}: text parts only",
                                        p.kind
                                    ),
                                    ))
                                }
                            }
                        }
                        t
                    }
                };
                Ok(Message::new(role, &text))
            })
            .collect()
    }
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
    /// Speculative decoding: draft tokens proposed and accepted.
    pub drafted: Option<usize>,
    pub accepted: Option<usize>,
    /// Forward passes the generation took.
    pub passes: usize,
}

impl Usage {
    pub fn json(&self) -> Value {
        let mut u = json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "forward_passes": self.passes,
        });
        if let (Some(d), Some(a)) = (self.drafted, self.accepted) {
            u["drafted_tokens"] = json!(d);
            u["accepted_tokens"] = json!(a);
        }
        u
    }
}
