//! Character-level vocabulary for the synthetic-task models.
//!
//! Ids: 0 `<|endoftext|>` (EOS and padding), 1 `<|startoftext|>` (BOS), 2 `<|mask|>`, then one
//! token per character. Written as an HF `tokenizer.json` (WordLevel over single characters,
//! `Split` pre-tokenizer isolating every character, `Fuse` decoder) so the engine's normal
//! tokenizer path loads it.

use serde_json::json;

pub const EOS: u32 = 0;
pub const BOS: u32 = 1;
pub const MASK: u32 = 2;
pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|startoftext|>", "<|mask|>"];
/// Every character a task prompt or answer may contain.
pub const CHARS: &str = "0123456789abcdefghijklmnopqrstuvwxyz+=,;:?>| ";

/// The task vocabulary.
pub struct CharVocab;

impl CharVocab {
    pub fn size() -> usize {
        SPECIALS.len() + CHARS.chars().count()
    }
    /// Id of a character, `None` if outside the vocabulary.
    pub fn id(c: char) -> Option<u32> {
        CHARS
            .chars()
            .position(|x| x == c)
            .map(|p| (p + SPECIALS.len()) as u32)
    }
    /// Encode a string (panics on characters outside the vocabulary: task generators only
    /// produce vocabulary characters).
    pub fn encode(s: &str) -> Vec<u32> {
        s.chars()
            .map(|c| {
                Self::id(c).unwrap_or_else(|| panic!("character {c:?} not in the task vocabulary"))
            })
            .collect()
    }
    /// Decode ids, stopping at EOS and skipping other specials.
    pub fn decode(ids: &[u32]) -> String {
        let chars: Vec<char> = CHARS.chars().collect();
        ids.iter()
            .take_while(|&&i| i != EOS)
            .filter_map(|&i| chars.get((i as usize).wrapping_sub(SPECIALS.len())))
            .collect()
    }
    /// The `tokenizer.json` document.
    pub fn tokenizer_json() -> serde_json::Value {
        let mut vocab = serde_json::Map::new();
        let mut added = vec![];
        for (i, s) in SPECIALS.iter().enumerate() {
            vocab.insert(s.to_string(), json!(i));
            added.push(json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}));
        }
        for (i, c) in CHARS.chars().enumerate() {
            vocab.insert(c.to_string(), json!(i + SPECIALS.len()));
        }
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": false},
            "post_processor": null,
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<|endoftext|>"}
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let ids = CharVocab::encode("12+34=");
        assert_eq!(CharVocab::decode(&ids), "12+34=");
        let mut with_eos = ids.clone();
        with_eos.extend([EOS, 5, 6]);
        assert_eq!(CharVocab::decode(&with_eos), "12+34=");
        assert_eq!(CharVocab::size(), 3 + CHARS.len());
    }
}
