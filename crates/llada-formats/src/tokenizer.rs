//! Tokenizers and chat templates.
//!
//! Both sources end as one `tokenizers::Tokenizer`: an HF `tokenizer.json` is loaded as is; the
//! byte-level BPE embedded in GGUF metadata (`tokenizer.ggml.tokens`, `.merges`, `.token_type`,
//! `.pre`) is turned into the equivalent `tokenizer.json` document, with the pre-tokenizer that
//! llama.cpp associates with the `tokenizer.ggml.pre` name.

use crate::error::FormatError;
use crate::gguf::{GgufFile, Value};
use serde_json::json;
use std::path::{Path, PathBuf};

/// A chat template family.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\n…<|im_end|>\n` (SmolLM2, Qwen2, Dream), with the system prompt the
    /// model's own template inserts when the conversation has none.
    ChatMl { default_system: Option<String> },
    /// LLaDA's Llama-3-style template:
    /// `<|startoftext|><|start_header_id|>role<|end_header_id|>\n\n…<|eot_id|>`.
    Llama3 { bos: String },
    /// No template: the prompt is used as is.
    Raw,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

impl ChatTemplate {
    /// Guess the family from a Jinja template string (GGUF `tokenizer.chat_template` or
    /// `tokenizer_config.json`'s `chat_template`).
    pub fn detect(jinja: &str) -> Self {
        if jinja.contains("<|im_start|>") {
            // The SmolLM2 and Qwen templates embed their default system prompt as a literal;
            // Qwen2.5's first `<|im_start|>system` opens its tools branch (Jinja follows), so
            // the first occurrence followed by a literal up to `<|im_end|>` is the one.
            let default_system = ["<|im_start|>system\\n", "<|im_start|>system\n"]
                .iter()
                .flat_map(|pat| jinja.match_indices(pat).map(move |(i, _)| (i, pat.len())))
                .filter_map(|(i, len)| {
                    let rest = &jinja[i + len..];
                    let s = rest.get(..rest.find("<|im_end|>")?)?;
                    (!s.contains("{{") && !s.contains("{%") && !s.contains('\'') && !s.is_empty())
                        .then(|| (i, s.to_string()))
                })
                .min_by_key(|(i, _)| *i)
                .map(|(_, s)| s);
            ChatTemplate::ChatMl { default_system }
        } else if jinja.contains("<|start_header_id|>") {
            ChatTemplate::Llama3 {
                bos: if jinja.contains("<|startoftext|>") {
                    "<|startoftext|>".into()
                } else {
                    "<|begin_of_text|>".into()
                },
            }
        } else {
            ChatTemplate::Raw
        }
    }

    /// Render a conversation, ending with the assistant header when `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let mut s = String::new();
        match self {
            ChatTemplate::ChatMl { default_system } => {
                if let (Some(sys), Some(first)) = (default_system, messages.first()) {
                    if first.role != "system" {
                        s.push_str(&format!("<|im_start|>system\n{sys}<|im_end|>\n"));
                    }
                }
                for m in messages {
                    s.push_str(&format!(
                        "<|im_start|>{}\n{}<|im_end|>\n",
                        m.role, m.content
                    ));
                }
                if add_generation_prompt {
                    s.push_str("<|im_start|>assistant\n");
                }
            }
            ChatTemplate::Llama3 { bos } => {
                s.push_str(bos);
                for m in messages {
                    s.push_str(&format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role, m.content
                    ));
                }
                if add_generation_prompt {
                    s.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            ChatTemplate::Raw => {
                for m in messages {
                    s.push_str(&m.content);
                }
            }
        }
        s
    }
}

/// A tokenizer plus the special ids and chat template generation needs.
#[derive(Clone)]
pub struct Tokenizer {
    pub inner: tokenizers::Tokenizer,
    /// Ids that end generation (EOS, end-of-turn).
    pub stop_ids: Vec<u32>,
    pub bos_id: Option<u32>,
    pub template: ChatTemplate,
    /// The file it was loaded from (`tokenizer.json` or the GGUF file), for error messages.
    pub path: PathBuf,
}

impl Tokenizer {
    /// Encode text (special tokens in the text are recognised, none are added). Errors name
    /// the tokenizer's file.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("{}: tokenizer: {e}", self.path.display()))
    }
    /// Encode a user's prompt, refusing characters the vocabulary cannot represent: a
    /// character that becomes a special token other than an unknown token (a word-level
    /// vocabulary whose unknown token is its end-of-text token), or that no token covers (a
    /// BPE without byte fallback drops it), is an error naming the characters. Characters
    /// mapped to a real unknown token (`<unk>`, `[UNK]`) are returned beside the ids, for a
    /// warning.
    pub fn encode_prompt(&self, text: &str) -> Result<(Vec<u32>, Vec<char>), String> {
        let enc = self
            .inner
            .encode_char_offsets(text, false)
            .map_err(|e| format!("{}: tokenizer: {e}", self.path.display()))?;
        let chars: Vec<char> = text.chars().collect();
        let special: std::collections::HashMap<u32, String> = self
            .inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        let mut covered = vec![false; chars.len()];
        let (mut refused, mut warned) = (vec![], vec![]);
        for (&id, &(a, b)) in enc.get_ids().iter().zip(enc.get_offsets()) {
            let (a, b) = (a.min(chars.len()), b.min(chars.len()));
            covered[a..b].iter_mut().for_each(|c| *c = true);
            let Some(content) = special.get(&id) else {
                continue;
            };
            let source: String = chars[a..b].iter().collect();
            if source == *content || a == b {
                continue;
            }
            if content.to_lowercase().contains("unk") {
                warned.extend(source.chars());
            } else {
                refused.extend(source.chars());
            }
        }
        refused.extend(
            chars
                .iter()
                .zip(&covered)
                .filter(|(c, cov)| !**cov && !c.is_whitespace())
                .map(|(c, _)| *c),
        );
        if !refused.is_empty() {
            refused.sort_unstable();
            refused.dedup();
            let list: Vec<String> = refused.iter().map(|c| format!("{c:?}")).collect();
            return Err(format!(
                "{}: the prompt has characters this model's vocabulary cannot represent: {} \
                 (they would be read as another token or dropped); leave them out",
                self.path.display(),
                list.join(" ")
            ));
        }
        warned.sort_unstable();
        warned.dedup();
        Ok((enc.get_ids().to_vec(), warned))
    }
    /// The largest token id the tokenizer can produce (vocabulary and added tokens), `None`
    /// for an empty vocabulary.
    pub fn max_token_id(&self) -> Option<u32> {
        self.inner.get_vocab(true).into_values().max()
    }
    /// The largest id of the base vocabulary (added tokens left out), `None` when it is empty.
    pub fn max_base_token_id(&self) -> Option<u32> {
        self.inner.get_vocab(false).into_values().max()
    }
    /// Decode ids, keeping special tokens out of the text.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, true).unwrap_or_default()
    }
    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
    /// Id of a token string.
    pub fn token_id(&self, tok: &str) -> Option<u32> {
        self.inner.token_to_id(tok)
    }

    /// Load `tokenizer.json` (plus `tokenizer_config.json`'s template when present).
    ///
    /// A `tokenizer_config.json` that is present must be valid: a broken one would otherwise
    /// silently change the chat template the prompts are wrapped in.
    pub fn from_hf_dir(
        dir: &Path,
        eos: &[u32],
        default_template: ChatTemplate,
    ) -> Result<Self, FormatError> {
        let p = dir.join("tokenizer.json");
        crate::gguf::require_regular_file(&p)?;
        let inner = tokenizers::Tokenizer::from_file(&p).map_err(|e| FormatError::Tokenizer {
            path: p.clone(),
            what: e.to_string(),
        })?;
        if inner.get_vocab_size(true) == 0 {
            return Err(FormatError::Tokenizer {
                path: p,
                what: "the vocabulary is empty".into(),
            });
        }
        let template =
            chat_template(&dir.join("tokenizer_config.json"))?.unwrap_or(default_template);
        let mut stop_ids = eos.to_vec();
        for t in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>"] {
            if let Some(id) = inner.token_to_id(t) {
                if !stop_ids.contains(&id) {
                    stop_ids.push(id);
                }
            }
        }
        Ok(Self {
            inner,
            stop_ids,
            bos_id: None,
            template,
            path: p,
        })
    }

    /// Build the tokenizer embedded in a GGUF file (byte-level BPE, `tokenizer.ggml.model = gpt2`).
    pub fn from_gguf(g: &GgufFile) -> Result<Self, FormatError> {
        let path = &g.path;
        let terr = |what: String| FormatError::Tokenizer {
            path: path.clone(),
            what,
        };
        let model = g.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(terr(format!(
                "tokenizer model '{model}' is not supported (only byte-level BPE, 'gpt2')"
            )));
        }
        let tokens = g
            .get("tokenizer.ggml.tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| FormatError::metadata(path, "tokenizer.ggml.tokens", " is missing"))?;
        if tokens.is_empty() {
            return Err(FormatError::metadata(
                path,
                "tokenizer.ggml.tokens",
                ": the vocabulary is empty",
            ));
        }
        // Special token ids: absent, or an integer id inside the vocabulary.
        let n_tokens = tokens.len();
        let id = |k: &str| -> Result<Option<u32>, FormatError> {
            let Some(v) = g.get(k) else {
                return Ok(None);
            };
            let v = v.as_u64().ok_or_else(|| {
                FormatError::metadata(path, k, format!(": {v:?} is not a token id"))
            })?;
            match u32::try_from(v) {
                Ok(id) if (id as usize) < n_tokens => Ok(Some(id)),
                _ => Err(FormatError::metadata(
                    path,
                    k,
                    format!(": token id {v} is outside the vocabulary ({n_tokens} tokens)"),
                )),
            }
        };
        let eos = id("tokenizer.ggml.eos_token_id")?;
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let eot = id("tokenizer.ggml.eot_token_id")?;
        let eom = id("tokenizer.ggml.eom_token_id")?;
        let merges = g
            .get("tokenizer.ggml.merges")
            .and_then(Value::as_array)
            .ok_or_else(|| FormatError::metadata(path, "tokenizer.ggml.merges", " is missing"))?;
        let types = g.get("tokenizer.ggml.token_type").and_then(Value::as_array);
        let mut vocab = serde_json::Map::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            let t = t
                .as_str()
                .ok_or_else(|| terr(format!("token {i} is not a string")))?;
            vocab.insert(t.to_string(), json!(i));
            let ty = types
                .and_then(|ts| ts.get(i))
                .and_then(Value::as_u64)
                .unwrap_or(1);
            // 3 = control, 4 = user-defined: matched whole in the input text.
            if ty == 3 || ty == 4 {
                added.push(
                    json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": ty == 3}),
                );
            }
        }
        let merges: Vec<serde_json::Value> = merges
            .iter()
            .map(|m| m.as_str().map(|s| json!(s)))
            .collect::<Option<_>>()
            .ok_or_else(|| terr("a merge is not a string".into()))?;
        let pre = g
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
        let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
        const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        let pre_tok = match pre {
            // SmolLM: digits one by one, then GPT-2's regex (llama.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM).
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            "qwen2" => {
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]})
            }
            "llama-bpe" | "llama3" => {
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]})
            }
            "gpt2" | "gpt-2" | "default" => byte_level(true),
            other => return Err(terr(format!("pre-tokenizer '{other}' is not supported"))),
        };
        let doc = json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added, "normalizer": null, "pre_tokenizer": pre_tok,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": merges}
        });
        // The document goes before the tokenizer parses its text: at SmolLM2's 49 k tokens and
        // merges the two together were ≈ 20 MB of the load's peak RSS.
        let text = doc.to_string();
        drop(doc);
        let inner: tokenizers::Tokenizer = text
            .parse()
            .map_err(|e: tokenizers::Error| terr(e.to_string()))?;
        drop(text);
        let mut stop_ids: Vec<u32> = eos.into_iter().collect();
        for v in eot.into_iter().chain(eom) {
            if !stop_ids.contains(&v) {
                stop_ids.push(v);
            }
        }
        for t in ["<|im_end|>", "<|eot_id|>"] {
            if let Some(v) = inner.token_to_id(t) {
                if !stop_ids.contains(&v) {
                    stop_ids.push(v);
                }
            }
        }
        let template = g
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .map(ChatTemplate::detect)
            .unwrap_or(ChatTemplate::Raw);
        Ok(Self {
            inner,
            stop_ids,
            bos_id: bos,
            template,
            path: path.clone(),
        })
    }
}

/// The chat template of an HF `tokenizer_config.json`: `None` when the file or its
/// `chat_template` is absent; an error when the file is unreadable or not JSON, or the template
/// is neither a string nor HF's list of named templates (`[{"name", "template"}, …]`, whose
/// `default` entry — else the first — is the one used).
fn chat_template(cfg: &std::path::Path) -> Result<Option<ChatTemplate>, FormatError> {
    if !cfg.exists() {
        return Ok(None);
    }
    let bad = |what: String| FormatError::Tokenizer {
        path: cfg.to_path_buf(),
        what,
    };
    let text = std::fs::read_to_string(cfg).map_err(|e| FormatError::io(cfg, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let Some(t) = v.get("chat_template").filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    if let Some(s) = t.as_str() {
        return Ok(Some(ChatTemplate::detect(s)));
    }
    fn template(e: &serde_json::Value) -> Option<&str> {
        e.get("template").and_then(|x| x.as_str())
    }
    let named = t.as_array().and_then(|list| {
        list.iter()
            .find(|e| e.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(template)
            .or_else(|| list.first().and_then(template))
    });
    match named {
        Some(s) => Ok(Some(ChatTemplate::detect(s))),
        None => Err(bad(
            "'chat_template' is neither a template string nor a list of named templates".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A present `tokenizer_config.json` must be valid; its template may be a string or HF's
    /// list of named templates.
    #[test]
    fn tokenizer_config_templates() {
        let dir = std::env::temp_dir().join(format!("llada-tokcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("tokenizer_config.json");
        assert!(chat_template(&f).unwrap().is_none());
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}{% endfor %}";
        for (text, ok) in [
            ("{}".to_string(), Some(None)),
            (r#"{"chat_template": null}"#.to_string(), Some(None)),
            (
                serde_json::json!({ "chat_template": chatml }).to_string(),
                Some(Some(ChatTemplate::detect(chatml))),
            ),
            (
                serde_json::json!({"chat_template": [{"name": "tool_use", "template": "x"},
                    {"name": "default", "template": chatml}]})
                .to_string(),
                Some(Some(ChatTemplate::detect(chatml))),
            ),
            ("garbage".to_string(), None),
            (r#"{"chat_template": 3}"#.to_string(), None),
        ] {
            std::fs::write(&f, &text).unwrap();
            match (chat_template(&f), ok) {
                (Ok(got), Some(want)) => assert_eq!(got, want, "{text}"),
                (Err(e), None) => assert!(e.to_string().contains("tokenizer_config.json"), "{e}"),
                (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn chatml_inserts_default_system() {
        let j = "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are helpful<|im_end|>\\n' }}{% endif %}<|im_start|>";
        // Qwen2.5's: a tools branch first, whose system turn continues in Jinja.
        let qwen = "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}";
        assert_eq!(
            ChatTemplate::detect(qwen),
            ChatTemplate::ChatMl {
                default_system: Some(
                    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.".into()
                )
            }
        );
        let t = ChatTemplate::detect(j);
        assert_eq!(
            t,
            ChatTemplate::ChatMl {
                default_system: Some("You are helpful".into())
            }
        );
        let s = t.render(&[Message::new("user", "Hi")], true);
        assert_eq!(
            s,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_template() {
        let t = ChatTemplate::Llama3 {
            bos: "<|startoftext|>".into(),
        };
        assert_eq!(
            t.render(&[Message::new("user", "2+2?")], true),
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }
}
