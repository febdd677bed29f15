//! The tokenizer of an HF directory as GGUF metadata, as `convert_hf_to_gguf.py`'s
//! `_set_vocab_gpt2` writes it: `tokenizer.ggml.model = "gpt2"`, the pre-tokenizer's name,
//! one token string per id up to the model's vocabulary size (`[PADn]`, type unused, for ids
//! the tokenizer lacks), token types (normal 1, control 3 for special added tokens,
//! user-defined 4 for the others), the merges as `"a b"` strings, the special token ids
//! (`tokenizer_config.json`'s tokens, else `config.json`'s `*_token_id`), `add_bos_token` /
//! `add_eos_token` and the chat template.
//!
//! Byte-level BPE tokenizers are written as they are. A WordLevel vocabulary (the zoo's
//! character-level models, the test fixtures) is written with its tokens in GPT-2's byte-level
//! alphabet and no merges, pre-tokenizer `default`: each single-character token encodes text
//! exactly as the WordLevel model does; longer tokens remain an id → string table.
//! The pre-tokenizer name is recognised from `tokenizer.json`'s own pre-tokenizer (the names our
//! GGUF tokenizer and llama.cpp both know); anything else is refused with an error.

use crate::ConvertError;
use llada_formats::gguf::Value;
use serde_json::Value as J;
use std::collections::BTreeMap;
use std::path::Path;

const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types.
const NORMAL: i32 = 1;
const UNUSED: i32 = 5;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// GPT-2's `bytes_to_unicode`: the character byte `b` is written as.
fn byte_char(b: u8) -> char {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b as u32) {
        return char::from(b);
    }
    let n = (0..b as u32).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// A string in GPT-2's byte-level alphabet.
fn byte_level(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

fn unsupported(path: &Path, what: impl Into<String>) -> ConvertError {
    ConvertError::Unsupported {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// The llama.cpp pre-tokenizer name of a byte-level BPE `pre_tokenizer`.
fn pre_name(pre: &J, path: &Path) -> Result<&'static str, ConvertError> {
    let ty = |v: &J| v.get("type").and_then(J::as_str).unwrap_or("").to_string();
    let regex = |v: &J| {
        v.pointer("/pattern/Regex")
            .and_then(J::as_str)
            .map(String::from)
    };
    let use_regex = |v: &J| v.get("use_regex").and_then(J::as_bool).unwrap_or(true);
    let parts: Vec<&J> = match ty(pre).as_str() {
        "Sequence" => pre
            .get("pretokenizers")
            .and_then(J::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        _ => vec![pre],
    };
    let kinds: Vec<String> = parts.iter().map(|p| ty(p)).collect();
    let k: Vec<&str> = kinds.iter().map(String::as_str).collect();
    match k.as_slice() {
        ["ByteLevel"] if use_regex(parts[0]) => Ok("gpt-2"),
        ["Digits", "ByteLevel"]
            if parts[0].get("individual_digits") == Some(&J::Bool(true)) && use_regex(parts[1]) =>
        {
            Ok("smollm")
        }
        ["Split", "ByteLevel"] if !use_regex(parts[1]) => match regex(parts[0]).as_deref() {
            Some(LLAMA3) => Ok("llama-bpe"),
            Some(QWEN2) => Ok("qwen2"),
            _ => Err(unsupported(
                path,
                "the pre-tokenizer's split pattern is none llama.cpp names here \
                 (known: GPT-2, SmolLM, Llama-3, Qwen2)",
            )),
        },
        _ => Err(unsupported(
            path,
            format!("pre-tokenizer {k:?} is not a byte-level BPE one this converter knows"),
        )),
    }
}

/// A special token's id: `tokenizer_config.json`'s `{kind}_token` (a string or
/// `{"content": …}`) looked up in the vocabulary, else `config.json`'s `{kind}_token_id`.
fn special_id(kind: &str, tcfg: &J, config: &J, ids: &BTreeMap<String, u32>) -> Option<u32> {
    let tok = tcfg.get(format!("{kind}_token"));
    let content = tok.and_then(|t| t.as_str().or_else(|| t.get("content")?.as_str()));
    content.and_then(|c| ids.get(c).copied()).or_else(|| {
        config
            .get(format!("{kind}_token_id"))
            .and_then(J::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    })
}

/// The tokenizer keys of `dir` for a model of `vocab` tokens; `add_bos` forces
/// `add_bos_token` (LLaDA's converter does).
pub fn tokenizer_kv(
    dir: &Path,
    config: &J,
    vocab: usize,
    add_bos: Option<bool>,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let path = dir.join("tokenizer.json");
    let text = llada_formats::hf::read_text(&path)?;
    let tj: J = serde_json::from_str(&text)
        .map_err(|e| unsupported(&path, format!("invalid JSON: {e}")))?;
    let tcfg_path = dir.join("tokenizer_config.json");
    let tcfg: J = if tcfg_path.exists() {
        serde_json::from_str(&llada_formats::hf::read_text(&tcfg_path)?)
            .map_err(|e| unsupported(&tcfg_path, format!("invalid JSON: {e}")))?
    } else {
        J::Null
    };
    let model = tj.get("model").unwrap_or(&J::Null);
    let model_ty = model.get("type").and_then(J::as_str).unwrap_or("");
    let word_level = match model_ty {
        "BPE" => false,
        "WordLevel" => true,
        other => {
            return Err(unsupported(
                &path,
                format!("tokenizer model '{other}' (supported: byte-level BPE, WordLevel)"),
            ))
        }
    };
    let pre = if word_level {
        "default"
    } else {
        pre_name(tj.get("pre_tokenizer").unwrap_or(&J::Null), &path)?
    };
    // id → (token, type)
    let mut table: Vec<Option<(String, i32)>> = vec![None; vocab];
    let mut ids = BTreeMap::new();
    let mut put = |tok: &str, id: u64, ty: i32| -> Result<(), ConvertError> {
        let slot = usize::try_from(id)
            .ok()
            .and_then(|i| table.get_mut(i))
            .ok_or_else(|| {
                unsupported(
                    &path,
                    format!("token '{tok}' has id {id}, outside the model's {vocab} tokens"),
                )
            })?;
        ids.insert(tok.to_string(), id as u32);
        *slot = Some((tok.to_string(), ty));
        Ok(())
    };
    let base = model
        .get("vocab")
        .and_then(J::as_object)
        .ok_or_else(|| unsupported(&path, "model.vocab is missing"))?;
    for (tok, id) in base {
        let id = id
            .as_u64()
            .ok_or_else(|| unsupported(&path, format!("token '{tok}' has no integer id")))?;
        let t = if word_level {
            byte_level(tok)
        } else {
            tok.clone()
        };
        put(&t, id, NORMAL)?;
    }
    for a in tj
        .get("added_tokens")
        .and_then(J::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(tok), Some(id)) = (
            a.get("content").and_then(J::as_str),
            a.get("id").and_then(J::as_u64),
        ) else {
            return Err(unsupported(&path, "an added token lacks its content or id"));
        };
        let special = a.get("special").and_then(J::as_bool).unwrap_or(false);
        put(tok, id, if special { CONTROL } else { USER_DEFINED })?;
    }
    let (tokens, types): (Vec<Value>, Vec<Value>) = table
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let (s, ty) = t.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED));
            (Value::String(s), Value::I32(ty))
        })
        .unzip();
    let merges: Vec<Value> = match model.get("merges").and_then(J::as_array) {
        None => vec![],
        Some(m) => m
            .iter()
            .map(|m| match m {
                J::String(s) => Some(Value::String(s.clone())),
                J::Array(p) => match p.as_slice() {
                    [J::String(a), J::String(b)] => Some(Value::String(format!("{a} {b}"))),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(|| unsupported(&path, "a merge is neither \"a b\" nor [a, b]"))?,
    };
    let mut kv = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
    ];
    for kind in ["bos", "eos", "unk", "sep", "pad", "mask"] {
        if let Some(id) = special_id(kind, &tcfg, config, &ids).filter(|&i| (i as usize) < vocab) {
            let key = match kind {
                "pad" => "tokenizer.ggml.padding_token_id".to_string(),
                "sep" => "tokenizer.ggml.seperator_token_id".to_string(),
                k => format!("tokenizer.ggml.{k}_token_id"),
            };
            kv.push((key, Value::U32(id)));
        }
    }
    let flag = |k: &str| tcfg.get(k).and_then(J::as_bool);
    if let Some(b) = add_bos.or(flag("add_bos_token")) {
        kv.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(b)));
    }
    if let Some(b) = flag("add_eos_token") {
        kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(b)));
    }
    let template = match tcfg.get("chat_template") {
        Some(J::String(s)) => Some(s.clone()),
        Some(J::Array(list)) => {
            let t = |e: &J| e.get("template").and_then(J::as_str).map(String::from);
            list.iter()
                .find(|e| e.get("name").and_then(J::as_str) == Some("default"))
                .and_then(t)
                .or_else(|| list.first().and_then(t))
        }
        _ => None,
    };
    if let Some(t) = template {
        kv.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(kv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_alphabet() {
        assert_eq!(byte_level(" a\n!"), "Ġa\u{10a}!");
        assert_eq!(byte_char(0), '\u{100}');
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(173), '\u{143}');
    }
}
