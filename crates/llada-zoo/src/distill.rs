//! Distillation: the target's labels of training windows — its argmax (hard labels) and its
//! renormalised top k (soft labels) after every prefix — over corpus windows or windows it
//! writes itself, computed by one worker per thread and cached in little-endian binary files
//! under `data/` (formats at [`label_windows`] and [`record_features`]); the target's final
//! features for the feature drafter.

use crate::error::{bail, Context, Error, Result};
use crate::forward::{argmax_rows, causal_argmax, causal_logits, causal_top_k, top_k_rows};
use crate::progress::Progress;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;

/// `name` with every character but ASCII letters and digits replaced by `_` (cache file names).
pub(crate) fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The target that labels distillation windows, one one-thread lane per worker, and the
/// phase of `progress` that counts them.
///
/// Windows are labelled by independent workers (one per thread, each on its own one-thread
/// lane) rather than by one lane over every thread: a greedy decode is a chain of one-row
/// passes that one thread keeps busy less than fully, and measured on SmolLM2-135M two
/// one-thread decodes side by side produce ≈ 1.5x the tokens per second of one two-thread
/// decode (`llada generate --threads 1|2`, 183 + 184 vs 240 tok/s). Each window's result is
/// the same whichever worker computes it.
struct Labeller<'p> {
    model: Model,
    lanes: Vec<Lane>,
    bar: Box<dyn Progress + 'p>,
}

impl<'p> Labeller<'p> {
    fn load(
        target: &str,
        n: usize,
        what: &'static str,
        progress: &'p dyn Progress,
    ) -> Result<Self> {
        let tpath = llada::models::resolve(target, false)?;
        let model = Model::load(&tpath, &LoadOptions::default())
            .with_context(|| format!("loading the distillation target {}", tpath.display()))?;
        let lanes = (0..llada::engine::default_threads().clamp(1, n.max(1)))
            .map(|i| Lane::new(&format!("label{i}"), 1))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            model,
            lanes,
            bar: progress.windows(what, n as u64),
        })
    }

    /// `f(model, lane, k)` for every window `k < n`, spread over the workers (each takes the
    /// next window not yet taken: windows of unequal cost — a `mixed` source's corpus and
    /// generated windows alternate — keep every worker busy to the end), results in window
    /// order; the first error stops the rest.
    fn map<T: Send>(
        &self,
        n: usize,
        f: impl Fn(&Model, &Lane, usize) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let parts: Vec<Result<Vec<(usize, T)>>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .lanes
                .iter()
                .map(|lane| {
                    let (f, failed, next) = (&f, &failed, &next);
                    s.spawn(move || {
                        let mut out = Vec::new();
                        loop {
                            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if k >= n || failed.load(std::sync::atomic::Ordering::Relaxed) {
                                break;
                            }
                            match f(&self.model, lane, k) {
                                Ok(v) => out.push((k, v)),
                                Err(e) => {
                                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                            self.bar.inc(1);
                        }
                        Ok(out)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Invalid("a labelling worker panicked".into()))
                    })
                })
                .collect()
        });
        self.bar.finish();
        let mut all: Vec<(usize, T)> = Vec::with_capacity(n);
        for p in parts {
            all.extend(p?);
        }
        all.sort_by_key(|(k, _)| *k);
        Ok(all.into_iter().map(|(_, v)| v).collect())
    }
}

/// A label cache's little-endian u32 words (`None`: unreadable).
pub(crate) fn read_words(path: &std::path::Path) -> Option<Vec<u32>> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

pub(crate) fn write_words(path: &std::path::Path, w: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::create_dir_all("data")?;
    llada_formats::atomic::write(path, &bytes)?;
    Ok(())
}

/// Tokens of a `generated` distillation window's corpus prefix.
pub const GEN_PREFIX: usize = 32;

/// Where distillation windows come from (`--distill-source`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source {
    Corpus,
    Generated,
    /// Corpus windows and windows the target writes, this fraction of them written.
    Mixed(f64),
}

impl Source {
    /// `--distill-source` and `--distill-generated`.
    pub fn parse(s: &str, generated: Option<f64>) -> Result<Self> {
        Ok(match (s, generated) {
            ("mixed", g) => {
                let g = g.unwrap_or(0.5);
                if !(g > 0.0 && g < 1.0) {
                    bail!("--distill-generated must be in (0, 1), got {g}");
                }
                Self::Mixed(g)
            }
            (_, Some(_)) => bail!("--distill-generated needs --distill-source mixed"),
            ("generated", None) => Self::Generated,
            _ => Self::Corpus,
        })
    }

    /// The caches' name stem (`distill-mix` for every other window written, as before the
    /// fraction could be chosen; `distill-mix25` for a quarter).
    pub fn kind(self) -> String {
        match self {
            Self::Corpus => "distill".into(),
            Self::Generated => "distill-gen".into(),
            Self::Mixed(0.5) => "distill-mix".into(),
            Self::Mixed(g) => format!("distill-mix{}", (100.0 * g).round()),
        }
    }

    /// How window `k` is made: `None`, a corpus window; `Some(chat)`, written by the target
    /// from the window's first [`GEN_PREFIX`] tokens, inside a chat request when `chat`.
    /// Mixed: window `k` is written when `⌊(k + 1)·g⌋ > ⌊k·g⌋` (evenly spread; with g = ½ the
    /// odd windows), and the written ones alternate raw text and chat requests.
    pub fn generated(self, k: usize) -> Option<bool> {
        match self {
            Self::Corpus => None,
            Self::Generated => Some(k % 2 == 1),
            Self::Mixed(g) => {
                let before = (k as f64 * g).floor();
                (((k + 1) as f64 * g).floor() > before).then_some(before as usize % 2 == 1)
            }
        }
    }

    /// `n` windows of `t` tokens spread evenly over the training split (full token ids): the
    /// corpus windows themselves, or the prefixes the target continues (whatever the source).
    pub fn windows(train: &[u32], n: usize, t: usize) -> Result<Vec<Vec<u32>>> {
        if n == 0 || train.len() < t + 1 {
            bail!("--distill-windows must be > 0 and the corpus longer than a window");
        }
        let stride = ((train.len() - t) / n).max(1);
        Ok((0..n)
            .map(|k| (k * stride).min(train.len() - t))
            .map(|s| train[s..s + t].to_vec())
            .collect())
    }
}

/// Labelled distillation windows: inputs and the target's argmax after every prefix.
pub type Hard = Vec<(Vec<u32>, Vec<u32>)>;
/// The target's `k` most likely next tokens after every prefix (full ids, position-major) with
/// their probabilities renormalised over those `k`.
pub type Soft = Vec<(Vec<u32>, Vec<f32>)>;

/// Windows of `t` tokens for `llada train-feature-draft`, made as distillation windows are
/// (`source` as `--distill-source`: `corpus`, `generated` or `mixed`, every other one written):
/// spread over the training split, those the source says written by the target greedily
/// from their first 32 tokens (cached with their labels in `data/`, as distillation's).
pub fn feature_windows(
    target: &str,
    train: &[u32],
    n: usize,
    t: usize,
    source: &str,
    progress: &dyn Progress,
) -> Result<Vec<Vec<u32>>> {
    let source = Source::parse(source, None)?;
    let windows = Source::windows(train, n, t)?;
    if source == Source::Corpus {
        return Ok(windows);
    }
    let (hard, _) = label_windows(
        target,
        &windows,
        t,
        source,
        0,
        std::path::Path::new("data"),
        progress,
    )?;
    Ok(hard.into_iter().map(|(x, _)| x).collect())
}

const FEATURE_MAGIC: u32 = 0x5446_4453;

/// The target's final feature at every position of `windows` (`n·t × d`, one causal pass per
/// window, one worker per thread) and its argmax there, for `llada train-feature-draft`.
/// Cached in `data/features-TARGET-NxT.bin` (magic, n, t, d, the windows' tokens, the
/// argmaxes, the features as f32 bits), used only if it holds exactly these windows.
pub fn record_features(
    target: &str,
    windows: &[Vec<u32>],
    what: &'static str,
    progress: &dyn Progress,
) -> Result<(Vec<f32>, Vec<u32>)> {
    let n = windows.len();
    let t = windows.first().map_or(0, Vec::len);
    if windows.iter().any(|w| w.len() != t) {
        bail!("feature windows must have one length");
    }
    let cache =
        std::path::Path::new("data").join(format!("features-{}-{n}x{t}.bin", file_stem(target)));
    if let Some(w) = read_words(&cache) {
        let d = w.get(3).copied().unwrap_or(0) as usize;
        let ok = w.len() == 4 + 2 * n * t + n * t * d
            && w[..3] == [FEATURE_MAGIC, n as u32, t as u32]
            && w[4..4 + n * t].iter().eq(windows.iter().flatten());
        if ok {
            progress.note(&format!("{what}: {} (cached)", cache.display()));
            let best = w[4 + n * t..4 + 2 * n * t].to_vec();
            let feats = w[4 + 2 * n * t..]
                .iter()
                .map(|&b| f32::from_bits(b))
                .collect();
            return Ok((feats, best));
        }
    }
    let l = Labeller::load(target, n, what, progress)?;
    let per = l.map(n, |model, lane, i| {
        let out = causal_logits(model, lane, &windows[i])?;
        Ok((out.features.clone(), argmax_rows(&out, t)))
    })?;
    let d = per.first().map_or(0, |p| p.0.len() / t.max(1));
    let mut feats = Vec::with_capacity(n * t * d);
    let mut best = Vec::with_capacity(n * t);
    for (f, b) in per {
        feats.extend(f);
        best.extend(b);
    }
    let mut w: Vec<u32> = vec![FEATURE_MAGIC, n as u32, t as u32, d as u32];
    w.extend(windows.iter().flatten());
    w.extend(&best);
    w.extend(feats.iter().map(|v| v.to_bits()));
    write_words(&cache, &w)?;
    Ok((feats, best))
}

const HARD_MAGIC: u32 = 0x4c4c_4453;
const SOFT_MAGIC: u32 = 0x4b4c_4453;

/// Labels `inputs` (from [`Source::windows`]) with the target: every window's argmax labels
/// and, with `k > 0`, its top-`k` soft labels, in one pass per window — a corpus window is one
/// causal forward (both labels from the same logits), a generated one a greedy decode from its
/// prefix (see [`generate_window`]) plus one causal forward for the soft labels.
///
/// Cached in `DIR/KIND-TARGET-NxT.bin` (magic, n, t, inputs, labels as little-endian u32) and
/// `DIR/KIND-softK-TARGET-NxT.bin` (magic, n, t, k, inputs, ids, probabilities as f32 bits);
/// a cache is used only if its inputs are these windows (a generated window: if it starts with
/// its prefix, or is a chat request), and soft labels alone are added to cached hard ones.
pub fn label_windows(
    target: &str,
    inputs: &[Vec<u32>],
    t: usize,
    source: Source,
    k: usize,
    dir: &std::path::Path,
    progress: &dyn Progress,
) -> Result<(Hard, Soft)> {
    let n = inputs.len();
    let stem = file_stem(target);
    let kind = source.kind();
    let hard_cache = dir.join(format!("{kind}-{stem}-{n}x{t}.bin"));
    let soft_cache = dir.join(format!("{kind}-soft{k}-{stem}-{n}x{t}.bin"));
    let p = GEN_PREFIX.min(t);
    let same_source = |i: usize, x: &[u32]| match source.generated(i) {
        None => x == inputs[i].as_slice(),
        Some(chat) => chat || x[..p] == inputs[i][..p],
    };
    let cached = read_hard(&hard_cache, n, t)
        .filter(|w| w.iter().enumerate().all(|(i, (x, _))| same_source(i, x)));
    if let Some(hard) = cached {
        progress.note(&format!(
            "distillation labels: {} (cached)",
            hard_cache.display()
        ));
        if k == 0 {
            return Ok((hard, vec![]));
        }
        if let Some(soft) = read_soft(&soft_cache, &hard, k) {
            progress.note(&format!("soft labels: {} (cached)", soft_cache.display()));
            return Ok((hard, soft));
        }
        let l = Labeller::load(target, n, "soft labels", progress)?;
        let soft = l.map(n, |model, lane, i| causal_top_k(model, lane, &hard[i].0, k))?;
        write_soft(&soft_cache, &hard, &soft, k)?;
        return Ok((hard, soft));
    }
    if hard_cache.exists() {
        progress.note(&format!(
            "{} does not match these windows: relabelling",
            hard_cache.display()
        ));
    }
    let l = Labeller::load(target, n, "labelling", progress)?;
    let out = l.map(n, |model, lane, i| {
        let x = &inputs[i];
        match source.generated(i) {
            None => {
                let out = causal_logits(model, lane, x)?;
                let y = argmax_rows(&out, t);
                let soft = (k > 0).then(|| top_k_rows(&out, t, k));
                Ok(((x.clone(), y), soft))
            }
            Some(chat) => {
                let (x, y) = generate_window(model, lane, &x[..p], chat, t)?;
                let soft = match k {
                    0 => None,
                    _ => Some(causal_top_k(model, lane, &x, k)?),
                };
                Ok(((x, y), soft))
            }
        }
    })?;
    let (hard, soft): (Hard, Vec<_>) = out.into_iter().unzip();
    let soft: Soft = soft.into_iter().flatten().collect();
    let mut w: Vec<u32> = vec![HARD_MAGIC, n as u32, t as u32];
    w.extend(hard.iter().flat_map(|(x, _)| x.iter().copied()));
    w.extend(hard.iter().flat_map(|(_, y)| y.iter().copied()));
    write_words(&hard_cache, &w)?;
    if k > 0 {
        write_soft(&soft_cache, &hard, &soft, k)?;
    }
    Ok((hard, soft))
}

/// A hard-label cache's windows, if it holds `n` windows of `t` tokens.
fn read_hard(path: &std::path::Path, n: usize, t: usize) -> Option<Hard> {
    let w = read_words(path)?;
    if w.len() != 3 + 2 * n * t || w[0] != HARD_MAGIC || w[1] as usize != n || w[2] as usize != t {
        return None;
    }
    let (xs, ys) = w[3..].split_at(n * t);
    Some(
        xs.chunks(t)
            .map(<[u32]>::to_vec)
            .zip(ys.chunks(t).map(<[u32]>::to_vec))
            .collect(),
    )
}

/// A soft-label cache's labels, if they are top-`k` labels of exactly these windows.
fn read_soft(path: &std::path::Path, windows: &Hard, k: usize) -> Option<Soft> {
    let n = windows.len();
    let t = windows.first().map_or(0, |w| w.0.len());
    let w = read_words(path)?;
    let head = [SOFT_MAGIC, n as u32, t as u32, k as u32];
    if w.len() != 4 + n * t * (1 + 2 * k) || w[..4] != head {
        return None;
    }
    let (xs, rest) = w[4..].split_at(n * t);
    let (cs, ps) = rest.split_at(n * t * k);
    if !xs.chunks(t).zip(windows).all(|(x, w)| x == w.0.as_slice()) {
        return None;
    }
    Some(
        cs.chunks(t * k)
            .zip(ps.chunks(t * k))
            .map(|(c, p)| (c.to_vec(), p.iter().map(|&b| f32::from_bits(b)).collect()))
            .collect(),
    )
}

fn write_soft(path: &std::path::Path, windows: &Hard, soft: &Soft, k: usize) -> Result<()> {
    let t = windows.first().map_or(0, |w| w.0.len());
    let mut w: Vec<u32> = vec![SOFT_MAGIC, windows.len() as u32, t as u32, k as u32];
    w.extend(windows.iter().flat_map(|(x, _)| x.iter().copied()));
    w.extend(soft.iter().flat_map(|(c, _)| c.iter().copied()));
    w.extend(soft.iter().flat_map(|(_, p)| p.iter().map(|v| v.to_bits())));
    write_words(path, &w)
}

/// Soft labels (full ids) into a reduced vocabulary's rows: ids that share a row (the "other"
/// row) have their probabilities added, and each position keeps `k` entries (padding: row 0
/// with probability 0).
pub fn merge_soft_rows(row: &[u32], other: u32, k: usize, classes: &mut [u32], probs: &mut [f32]) {
    for (c, p) in classes.chunks_mut(k).zip(probs.chunks_mut(k)) {
        let mut merged: Vec<(u32, f32)> = Vec::with_capacity(k);
        for (&id, &q) in c.iter().zip(p.iter()) {
            let r = row.get(id as usize).copied().unwrap_or(other);
            match merged.iter_mut().find(|(m, _)| *m == r) {
                Some(e) => e.1 += q,
                None => merged.push((r, q)),
            }
        }
        merged.resize(k, (0, 0.0));
        for (j, (r, q)) in merged.into_iter().enumerate() {
            c[j] = r;
            p[j] = q;
        }
    }
}

/// A `t`-token window — `prefix` (as raw text, or inside a chat request) continued by the
/// target's own greedy tokens — and its labels, the target's argmax after every position. Past
/// the prompt the argmax *is* the next greedy token (one more is generated for the last
/// label), so only the prompt needs a labelling pass.
fn generate_window(
    model: &Model,
    lane: &Lane,
    prefix: &[u32],
    chat: bool,
    t: usize,
) -> Result<(Vec<u32>, Vec<u32>)> {
    let prompt = if chat {
        let tok = model
            .tokenizer
            .as_ref()
            .context("the target has no tokenizer")?;
        let text = format!("Continue this passage:\n{}", tok.decode(prefix));
        let msg = llada_formats::tokenizer::Message::new("user", &text);
        let ids = tok
            .encode(&tok.template.render(&[msg], true))
            .map_err(crate::error::msg)?;
        ids[..ids.len().min(t - 1)].to_vec()
    } else {
        prefix.to_vec()
    };
    let cfg = llada_decode::ar::GenerateConfig {
        max_tokens: t + 1 - prompt.len(),
        stop_at_eos: false,
        ..Default::default()
    };
    let g = llada_decode::ar::generate(model, lane, &prompt, &cfg, |_| true)?;
    let mut y = causal_argmax(model, lane, &prompt[..prompt.len() - 1])?;
    let mut x = prompt;
    x.extend_from_slice(&g.tokens);
    if x.len() != t + 1 {
        bail!("the target produced {} of {t} window tokens", x.len() - 1);
    }
    y.extend_from_slice(&x[y.len() + 1..]);
    x.truncate(t);
    Ok((x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids sharing the "other" row pool their probability; positions keep k entries.
    #[test]
    fn soft_labels_merge_into_reduced_rows() {
        // Reduced vocabulary {5, 7} over 10 ids: rows 0, 1; everything else row 2.
        let row = llada_train::prose::row_map(&[5, 7], 10);
        let mut c = vec![7, 3, 9, 5, 5, 7];
        let mut p = vec![0.5, 0.3, 0.2, 0.6, 0.0, 0.4];
        merge_soft_rows(&row, 2, 3, &mut c, &mut p);
        assert_eq!(c, vec![1, 2, 0, 0, 1, 0]);
        assert_eq!(p, vec![0.5, 0.5, 0.0, 0.6, 0.4, 0.0]);
    }

    /// Mixed windows: corpus windows keep their tokens, generated ones their prefix and the
    /// target's greedy continuation; the fused pass's argmax labels equal a separate forward's
    /// and the top of its soft labels; a second call reads the caches, and soft labels made
    /// afresh for cached windows (a separate pass) equal the fused ones.
    /// `--distill-generated`: ½ is the old every-other-window rule (its caches stay valid),
    /// other fractions write that share of windows, evenly spread, half of them chat requests.
    #[test]
    fn mixed_sources_write_their_fraction_of_windows() {
        let half = Source::parse("mixed", None).unwrap();
        assert_eq!(half.kind(), "distill-mix");
        for k in 0..64 {
            assert_eq!(
                half.generated(k),
                (k % 2 == 1).then_some(k % 4 == 3),
                "window {k}"
            );
        }
        let quarter = Source::parse("mixed", Some(0.25)).unwrap();
        assert_eq!(quarter.kind(), "distill-mix25");
        let written: Vec<bool> = (0..64).filter_map(|k| quarter.generated(k)).collect();
        assert_eq!(written.len(), 16);
        assert_eq!(written.iter().filter(|&&chat| chat).count(), 8);
        // Evenly spread: one written window in every four.
        for block in 0..16 {
            let n = (4 * block..4 * block + 4)
                .filter(|&k| quarter.generated(k).is_some())
                .count();
            assert_eq!(n, 1, "block {block}");
        }
        for (src, g) in [
            ("mixed", 0.0),
            ("mixed", 1.0),
            ("corpus", 0.25),
            ("generated", 0.5),
        ] {
            assert!(Source::parse(src, Some(g)).is_err(), "{src} {g}");
        }
        assert!(matches!(Source::parse("corpus", None), Ok(Source::Corpus)));
    }

    #[test]
    fn mixed_windows_are_labelled_in_one_pass_and_cached() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = root.join("tests/fixtures/hf-llama");
        let target = target.to_str().unwrap();
        let dir = std::env::temp_dir().join(format!("llada-label-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = GEN_PREFIX + 8;
        let train: Vec<u32> = (0..400u32).map(|i| (i * 7 + i / 3) % 50 + 3).collect();
        let inputs = Source::windows(&train, 3, t).unwrap();
        let (hard, soft) = label_windows(
            target,
            &inputs,
            t,
            Source::Mixed(0.5),
            3,
            &dir,
            &crate::Silent,
        )
        .unwrap();
        assert_eq!((hard.len(), soft.len()), (3, 3));
        assert_eq!(hard[0].0, inputs[0]);
        assert_eq!(hard[2].0, inputs[2]);
        assert_eq!(hard[1].0[..GEN_PREFIX], inputs[1][..GEN_PREFIX]);
        let model = Model::load(std::path::Path::new(target), &LoadOptions::default()).unwrap();
        let lane = Lane::new("test", 1).unwrap();
        for (w, ((x, y), (c, p))) in hard.iter().zip(&soft).enumerate() {
            assert_eq!(y, &causal_argmax(&model, &lane, x).unwrap(), "window {w}");
            for j in 0..t {
                assert_eq!(c[j * 3], y[j], "window {w} position {j}");
                let z: f32 = p[j * 3..j * 3 + 3].iter().sum();
                assert!((z - 1.0).abs() < 1e-5);
            }
        }
        // The generated window continues greedily: past the prefix, each label is the next token.
        for j in GEN_PREFIX..t - 1 {
            assert_eq!(hard[1].1[j], hard[1].0[j + 1]);
        }
        let again = label_windows(
            target,
            &inputs,
            t,
            Source::Mixed(0.5),
            3,
            &dir,
            &crate::Silent,
        )
        .unwrap();
        assert_eq!((&again.0, &again.1), (&hard, &soft));
        let stem = file_stem(target);
        std::fs::remove_file(dir.join(format!("distill-mix-soft3-{stem}-3x{t}.bin"))).unwrap();
        let fresh = label_windows(
            target,
            &inputs,
            t,
            Source::Mixed(0.5),
            3,
            &dir,
            &crate::Silent,
        )
        .unwrap();
        assert_eq!((&fresh.0, &fresh.1), (&hard, &soft));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
