//! Training the zoo's models: a [`TrainRequest`] (the options of `llada train`) checked and
//! turned into a preset's shape, its data — task rows, or prose with a reduced vocabulary and
//! the target's distillation labels — and a run of llada-train's trainer; the checkpoints a
//! draft starts from (the target's own layers, a checkpoint moved to a new vocabulary).

use crate::corpora::{check_max_scale, known_names, prose_files};
use crate::distill::{file_stem, label_windows, merge_soft_rows, Source};
use crate::error::{bail, Context, Result};
use crate::presets::{prose_preset, task_preset, DRAFT_VOCAB};
use crate::progress::Progress;
use llada_train::model::{Format, ModelSpec};
use llada_train::tasks::{MULTI_SUBTASKS, TASKS};
use llada_train::trainer::{TrainOptions, TrainState};
use std::path::PathBuf;

/// What to train and how: the options of `llada train` (their help text is the reference).
/// `None` takes the preset's default.
#[derive(Clone, Debug)]
pub struct TrainRequest {
    pub preset: String,
    /// Output directory (default: `models/PRESET`).
    pub out: Option<PathBuf>,
    pub steps: Option<usize>,
    pub batch: usize,
    pub batch_tokens: Option<usize>,
    pub lr: f64,
    pub beta2: f64,
    pub curriculum: Option<f64>,
    pub seed: u64,
    pub resume: bool,
    pub tasks: Vec<String>,
    pub max_scale: f64,
    pub rope_theta: Option<f64>,
    pub init_std: Option<f64>,
    /// Data-parallel shards per step.
    pub data_parallel: usize,
    pub layers: Option<usize>,
    pub d_model: Option<usize>,
    pub heads: Option<usize>,
    pub minutes: Option<f64>,
    pub distill: Option<String>,
    pub distill_windows: usize,
    /// `corpus`, `generated` or `mixed`.
    pub distill_source: String,
    pub distill_generated: Option<f64>,
    pub distill_soft: usize,
    pub distill_from: f64,
    pub distill_share: f64,
    pub init_from: Option<PathBuf>,
    pub target_layers: Vec<usize>,
    pub revocab: bool,
    pub structured_masks: Option<f64>,
    pub ar_warmup: Option<f64>,
    pub two_stream: Option<bool>,
    pub pad_answers: Option<usize>,
    /// `answer` or `hidden`.
    pub padding: String,
    pub eos_tail: Option<(f64, usize)>,
    pub bands: bool,
    pub adaptive_mix: f64,
    pub multi_tasks: Vec<String>,
    pub checkpoint_every: usize,
}

impl TrainRequest {
    /// Apply `--rope-theta` and `--init-std` to a preset's shape (every preset).
    fn override_spec(&self, spec: &mut ModelSpec) -> Result<()> {
        if let Some(t) = self.rope_theta {
            if !(t > 1.0 && t.is_finite()) {
                bail!("--rope-theta must be > 1");
            }
            spec.rope_theta = t;
        }
        if let Some(s) = self.init_std {
            if !(s > 0.0 && s < 1.0) {
                bail!("--init-std must be in (0, 1)");
            }
            spec.init_std = s;
        }
        if !self.target_layers.is_empty() && (self.layers.is_some() || self.d_model.is_some()) {
            bail!("--layers and --d-model do not combine with --target-layers (the draft takes the target's shapes)");
        }
        if let Some(l) = self.layers {
            if !(1..=64).contains(&l) {
                bail!("--layers must be in 1..=64");
            }
            spec.n_layers = l;
        }
        if let Some(d) = self.d_model {
            let hd = spec.head_dim();
            let group = spec.n_heads / spec.n_kv_heads.max(1);
            if d == 0 || d % (hd * group) != 0 || d > 4096 {
                bail!(
                    "--d-model must be a positive multiple of {} (head size {hd} × {group} query heads per KV head), at most 4096",
                    hd * group
                );
            }
            if self.init_std.is_none() {
                // The presets' ≈ 1/√d_model.
                spec.init_std *= (spec.d_model as f64 / d as f64).sqrt();
            }
            spec.ffn = spec.ffn * d / spec.d_model;
            spec.n_heads = d / hd;
            spec.n_kv_heads = spec.n_heads / group;
            spec.d_model = d;
        }
        if let Some(h) = self.heads {
            if !self.target_layers.is_empty() {
                bail!("--heads does not combine with --target-layers (the draft takes the target's shapes)");
            }
            let group = spec.n_heads / spec.n_kv_heads.max(1);
            if h == 0
                || !spec.d_model.is_multiple_of(h)
                || !(spec.d_model / h).is_multiple_of(2)
                || !h.is_multiple_of(group)
            {
                bail!(
                    "--heads must divide d_model {} into heads of an even size (RoPE) and be a multiple of {group} (query heads per KV head)",
                    spec.d_model
                );
            }
            spec.n_heads = h;
            spec.n_kv_heads = h / group;
        }
        Ok(())
    }

    /// The cards' 55-minute budget, for presets whose bare command re-trains a shipped model
    /// (`--minutes` overrides it).
    fn card_budget(&self, opts: &mut TrainOptions) {
        if self.minutes.is_none() {
            opts.time_budget_s = Some(55.0 * 60.0);
        }
    }

    /// The numeric options no run can use, refused before any work (the rest are checked
    /// where they are used, and [`TrainOptions::validate`] checks the assembled options).
    fn check_numbers(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!(
                "--lr {}: the learning rate must be a finite number > 0",
                self.lr
            );
        }
        if self.steps == Some(0) {
            bail!("--steps must be at least 1 (a run of 0 steps trains nothing)");
        }
        // 4 096 sequences of a task model's ≤ 512 tokens are 2 M tokens a step, a thousand
        // times the recipes' batches; beyond, a batch only allocates until the kernel kills it.
        if !(1..=4096).contains(&self.batch) {
            bail!("--batch {}: between 1 and 4096 sequences", self.batch);
        }
        if self.distill.is_some() && self.distill_windows == 0 {
            bail!("--distill-windows must be at least 1");
        }
        if self.checkpoint_every == 0 {
            bail!("--checkpoint-every must be at least 1");
        }
        if let Some(m) = self.minutes {
            if !(m.is_finite() && m > 0.0) {
                bail!("--minutes {m}: the time budget must be a finite number of minutes > 0");
            }
        }
        check_max_scale(self.max_scale)
    }

    /// Optimizer options from the flags (checked by [`TrainArgs::check_numbers`]), with the
    /// preset's default step count.
    fn options(&self, default_steps: usize, curriculum: f64) -> TrainOptions {
        let steps = self.steps.unwrap_or(default_steps);
        TrainOptions {
            steps,
            batch: self.batch,
            lr: self.lr,
            warmup: 100.min(steps / 10 + 1),
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            curriculum: self.curriculum.unwrap_or(curriculum),
            time_budget_s: self.minutes.map(|m| m * 60.0),
            init_from: self.init_from.clone(),
            data_parallel: self.data_parallel,
            beta2: self.beta2,
        }
    }
}

fn train_prose(
    a: &TrainRequest,
    out: &std::path::Path,
    progress: &dyn Progress,
) -> Result<TrainState> {
    use llada_train::prose::{train_bpe, Corpus};
    use llada_train::trainer::{train as train_with, ProseData};
    let files = prose_files()?;
    // With --distill, the data preparation (tokenizing, the target's labelling) counts
    // against --minutes: the budget is the whole command's.
    let started = std::time::Instant::now();
    let (tokenizer, eos) = if a.preset == "smollm2-draft" {
        let path = llada::models::resolve("smollm2", false)?;
        let g = llada_formats::gguf::GgufFile::open(&path)?;
        let t = llada_formats::tokenizer::Tokenizer::from_gguf(&g)?;
        let eos = t.token_id("<|endoftext|>").unwrap_or(0);
        (t.inner, eos)
    } else {
        progress.note(&format!(
            "training a 4096-token byte-level BPE on {} and {}",
            files[0].display(),
            files[1].display()
        ));
        (train_bpe(&files, 4096)?, 0)
    };
    let vocab = tokenizer.get_vocab_size(true);
    let (mut spec, steps) = prose_preset(&a.preset, vocab).context("prose preset")?;
    a.override_spec(&mut spec)?;
    let from_target = if a.target_layers.is_empty() {
        None
    } else {
        let target = a.distill.as_deref().unwrap_or("smollm2");
        let path = llada::models::resolve(target, false)?;
        let (c, tensors) = llada_model::load::export_layers_f32(&path, &a.target_layers)
            .with_context(|| format!("reading layers of {}", path.display()))?;
        if c.vocab != vocab {
            bail!(
                "{} has {} token ids, the draft's tokenizer {vocab}",
                path.display(),
                c.vocab
            );
        }
        spec.d_model = c.d_model;
        spec.n_layers = a.target_layers.len();
        spec.n_heads = c.n_heads;
        spec.n_kv_heads = c.n_kv_heads;
        spec.ffn = c.ffn;
        spec.rope_theta = c.rope_theta;
        spec.rms_eps = c.rms_eps;
        spec.tied = true;
        progress.note(&format!(
            "initialising from {} layers {:?} (d {}, {} heads / {} KV heads, MLP {})",
            path.display(),
            a.target_layers,
            c.d_model,
            c.n_heads,
            c.n_kv_heads,
            c.ffn
        ));
        Some((target.to_string(), tensors))
    };
    if a.preset == "smollm2-draft" {
        spec.eos_id = eos;
        spec.bos_id = tokenizer.token_to_id("<|im_start|>").unwrap_or(1);
        spec.mask_id = 0;
    }
    progress.note(&format!("tokenizing the corpora (vocab {vocab}) ..."));
    let mut corpus = Corpus::load(&files, &tokenizer, eos)?;
    let seq_len = 128;
    let (mut distill, mut distill_soft) = match &a.distill {
        Some(t) => {
            let source = Source::parse(&a.distill_source, a.distill_generated)?;
            let windows = Source::windows(&corpus.train, a.distill_windows, seq_len)?;
            let data = std::path::Path::new("data");
            label_windows(t, &windows, seq_len, source, a.distill_soft, data, progress)?
        }
        None => (vec![], vec![]),
    };
    let reduced_vocab = if a.preset == "smollm2-draft" && DRAFT_VOCAB < vocab {
        // The draft embeds and predicts only the most frequent ids (one shared row for the
        // rest): its head costs K·d instead of 49152·d MACs per token.
        // A fine-tune keeps its checkpoint's ids; otherwise the most frequent ids of the
        // corpus and, when distilling, of the target's own text (its chat template and modern
        // words are rare in Austen and the KJV: with corpus counts alone, 15 % of the tokens
        // of the target-written windows fell into the "other" row).
        let distill_text: Vec<u32> = distill
            .iter()
            .flat_map(|(x, y)| x.iter().chain(y))
            .copied()
            .collect();
        let (ids, cover) = match a.init_from.as_ref().filter(|_| !a.revocab) {
            Some(dir) => {
                let ids = checkpoint_ids(dir)?;
                let cover = llada_train::prose::apply_vocab(&mut corpus, &ids, vocab);
                (ids, cover)
            }
            None => llada_train::prose::reduce_vocab_with(
                &mut corpus,
                vocab,
                DRAFT_VOCAB,
                &distill_text,
            ),
        };
        let row = llada_train::prose::row_map(&ids, vocab);
        let (n, inside) = (
            distill_text.len(),
            distill_text
                .iter()
                .filter(|&&t| (row[t as usize] as usize) < ids.len())
                .count(),
        );
        progress.note(&format!(
            "reduced vocabulary: {} ids cover {:.2}% of the training tokens{}",
            ids.len(),
            100.0 * cover,
            if n > 0 {
                format!(
                    ", {:.2}% of the distillation text",
                    100.0 * inside as f64 / n as f64
                )
            } else {
                String::new()
            }
        ));
        spec.vocab = ids.len() + 1;
        Some((ids, vocab))
    } else {
        None
    };
    progress.note(&format!(
        "{} train / {} held-out tokens",
        corpus.train.len(),
        corpus.heldout.len()
    ));
    // Labels and inputs into the draft's rows (ids outside the reduced set: the "other" row).
    if let Some((ids, vocab)) = &reduced_vocab {
        let row = llada_train::prose::row_map(ids, *vocab);
        for (x, y) in &mut distill {
            llada_train::prose::to_rows(&row, ids.len() as u32, x);
            llada_train::prose::to_rows(&row, ids.len() as u32, y);
        }
        for (c, p) in &mut distill_soft {
            merge_soft_rows(&row, ids.len() as u32, a.distill_soft, c, p);
        }
    }
    let mut opts = a.options(steps, 1.0);
    if a.distill.is_some() {
        if let Some(b) = opts.time_budget_s.as_mut() {
            let spent = started.elapsed().as_secs_f64();
            progress.note(&format!(
                "{:.1} of the {:.1} minutes went to tokenizing and to the target's labels",
                spent / 60.0,
                *b / 60.0
            ));
            if spent >= *b {
                bail!("the target's labels took the whole --minutes budget: raise it or lower --distill-windows");
            }
            *b -= spent;
        }
    }
    if let (true, Some(dir), Some((ids, _))) = (a.revocab, &a.init_from, &reduced_vocab) {
        opts.init_from = Some(write_revocab_init(dir, ids, progress)?);
    }
    if let Some((target, tensors)) = from_target {
        let ids = reduced_vocab.as_ref().map(|(ids, _)| ids.as_slice());
        opts.init_from = Some(write_target_init(&target, &a.target_layers, tensors, ids)?);
    }
    // The card's recipe is the default of tiny-llada-prose (a bare `llada train --preset
    // tiny-llada-prose` re-trains the shipped model): 55 minutes, the first half a two-stream
    // warm-up.
    let diffusion = a.preset == "tiny-llada-prose";
    if diffusion {
        a.card_budget(&mut opts);
    }
    let ar_warmup = a.ar_warmup.unwrap_or(if diffusion { 0.5 } else { 0.0 });
    if !(0.0..1.0).contains(&ar_warmup) {
        bail!("--ar-warmup must be in [0, 1)");
    }
    if a.two_stream == Some(true) && ar_warmup == 0.0 {
        bail!("--two-stream needs an --ar-warmup > 0");
    }
    let mut data = ProseData {
        corpus,
        tokenizer,
        batch: opts.batch,
        seq_len,
        reduced_vocab,
        distill,
        distill_soft,
        distill_from: a.distill_from,
        distill_share: a.distill_share,
        ar_warmup,
        two_stream: a.two_stream.unwrap_or(ar_warmup > 0.0),
    };
    Ok(train_with(spec, opts, out, a.resume, false, &mut data)?)
}

/// Writes the target's exported tensors as a draft checkpoint to start from
/// (`data/init-TARGET-L…/model.safetensors`) and returns its directory. With a reduced
/// vocabulary the embedding keeps the rows of `ids`, and the shared "other" row is the mean of
/// every other row.
fn write_target_init(
    target: &str,
    layers: &[usize],
    tensors: Vec<llada_model::load::ExportedTensor>,
    ids: Option<&[u32]>,
) -> Result<PathBuf> {
    use candle_core::{Device, Tensor};
    let stem = file_stem(target);
    let tag: Vec<String> = layers.iter().map(usize::to_string).collect();
    let dir = PathBuf::from("data").join(format!("init-{stem}-L{}", tag.join("_")));
    let mut map = std::collections::HashMap::new();
    for t in tensors {
        let (shape, data) = match (t.name.as_str(), ids) {
            ("model.embed_tokens.weight", Some(ids)) => {
                let d = t.shape[1];
                let mut keep = vec![false; t.shape[0]];
                let mut rows = Vec::with_capacity((ids.len() + 1) * d);
                for &i in ids {
                    let i = i as usize;
                    let row = t
                        .data
                        .get(i * d..(i + 1) * d)
                        .context("a reduced-vocabulary id beyond the target's embedding")?;
                    rows.extend_from_slice(row);
                    keep[i] = true;
                }
                let mut other = vec![0f64; d];
                let mut n = 0usize;
                for (r, _) in keep.iter().enumerate().filter(|(_, k)| !**k) {
                    for (o, v) in other.iter_mut().zip(&t.data[r * d..(r + 1) * d]) {
                        *o += *v as f64;
                    }
                    n += 1;
                }
                rows.extend(other.iter().map(|v| (*v / n.max(1) as f64) as f32));
                (vec![ids.len() + 1, d], rows)
            }
            _ => (t.shape, t.data),
        };
        map.insert(t.name, Tensor::from_vec(data, shape, &Device::Cpu)?);
    }
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("model.safetensors");
    candle_core::safetensors::save(&map, &file)
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(dir)
}

/// `dir`'s checkpoint with its embedding (and untied head) moved to the reduced vocabulary
/// `ids`: an id it already had keeps its row, a new one starts from its "other" row (the last).
/// Written to `data/init-revocab-NAME/` and returned (the directory to start from).
fn write_revocab_init(
    dir: &std::path::Path,
    ids: &[u32],
    progress: &dyn Progress,
) -> Result<PathBuf> {
    use candle_core::{Device, Tensor};
    let old = checkpoint_ids(dir)?;
    let file = dir.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&file, &Device::Cpu)
        .with_context(|| format!("reading {}", file.display()))?;
    let old_row: std::collections::HashMap<u32, usize> =
        old.iter().enumerate().map(|(r, &t)| (t, r)).collect();
    let index: Vec<u32> = ids
        .iter()
        .map(|t| old_row.get(t).copied().unwrap_or(old.len()) as u32)
        .chain(std::iter::once(old.len() as u32))
        .collect();
    let index = Tensor::new(index.as_slice(), &Device::Cpu)?;
    let mut moved = 0;
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        if let Some(t) = map.get(name) {
            if t.dim(0)? != old.len() + 1 {
                bail!(
                    "{}: {name} has {} rows, its config lists {} ids (+ other)",
                    file.display(),
                    t.dim(0)?,
                    old.len()
                );
            }
            let t = t.index_select(&index, 0)?;
            map.insert(name.to_string(), t);
            moved += 1;
        }
    }
    if moved == 0 {
        bail!("{} has no embedding to move", file.display());
    }
    let kept = ids.iter().filter(|t| old_row.contains_key(t)).count();
    progress.note(&format!(
        "revocab: {kept} of {} ids keep their rows from {}",
        ids.len(),
        dir.display()
    ));
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "draft".into());
    let out = PathBuf::from("data").join(format!("init-revocab-{name}"));
    std::fs::create_dir_all(&out)?;
    candle_core::safetensors::save(&map, out.join("model.safetensors"))
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// The reduced vocabulary a draft checkpoint was trained over (a fine-tune keeps it).
fn checkpoint_ids(dir: &std::path::Path) -> Result<Vec<u32>> {
    let file = dir.join("config.json");
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?,
    )
    .with_context(|| format!("parsing {}", file.display()))?;
    // The engine's own reading of `reduced_vocab_ids` (validated), not a second parser.
    llada_model::ModelConfig::from_hf(&cfg, &file)?
        .vocab_ids
        .with_context(|| format!("{} has no reduced vocabulary", dir.display()))
}

/// Train `a` (checked first: a bad option is an error before any work) and return the final
/// state; the checkpoint is in the request's output directory.
pub fn train(a: &TrainRequest, progress: &dyn Progress) -> Result<TrainState> {
    a.check_numbers()?;
    // The output directory is checked before any work (tokenizing, labelling, training).
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("models").join(&a.preset));
    llada_train::trainer::check_out_dir(&out, a.resume)?;
    if a.distill.is_some() && a.preset != "smollm2-draft" {
        bail!("--distill applies to drafts (--preset smollm2-draft)");
    }
    if a.distill_soft > 0 && a.distill.is_none() {
        bail!("--distill-soft needs --distill TARGET (the model whose distribution is learnt)");
    }
    if a.distill.is_none() && (a.distill_from != 0.0 || a.distill_share != 1.0) {
        bail!("--distill-from and --distill-share need --distill TARGET");
    }
    if !((0.0..1.0).contains(&a.distill_from) && a.distill_share > 0.0 && a.distill_share <= 1.0) {
        bail!("--distill-from must be in [0, 1) and --distill-share in (0, 1]");
    }
    if a.distill_soft == 1 || a.distill_soft > 256 {
        bail!("--distill-soft takes 0 (hard labels) or 2 to 256 classes per position");
    }
    if !a.target_layers.is_empty() {
        if a.preset != "smollm2-draft" {
            bail!("--target-layers applies to drafts (--preset smollm2-draft)");
        }
        if a.init_from.is_some() {
            bail!("--target-layers and --init-from both say where to start: give one");
        }
    }
    if a.revocab && (a.init_from.is_none() || a.preset != "smollm2-draft") {
        bail!("--revocab moves a draft checkpoint to a new vocabulary: it needs --preset smollm2-draft and --init-from");
    }
    if prose_preset(&a.preset, 0).is_some() {
        // Task-model options would otherwise be accepted and silently ignored.
        if !a.tasks.is_empty()
            || a.structured_masks.is_some()
            || a.batch_tokens.is_some()
            || a.pad_answers.is_some()
            || a.padding != "answer"
            || a.eos_tail.is_some()
            || !a.bands
            || a.adaptive_mix != 0.0
            || !a.multi_tasks.is_empty()
        {
            bail!(
                "--tasks, --structured-masks, --batch-tokens, --pad-answers, --padding, --eos-tail, --bands, --adaptive-mix and --multi-tasks apply to the task presets \
                 (tiny-llada-tasks, tiny-dream-tasks, tiny-ar-tasks), not to {}",
                a.preset
            );
        }
        if a.preset != "tiny-llada-prose" && (a.ar_warmup.is_some() || a.two_stream.is_some()) {
            bail!(
                "--ar-warmup and --two-stream apply to the diffusion presets, not to {}",
                a.preset
            );
        }
        return train_prose(a, &out, progress);
    }
    let (mut spec, steps) = task_preset(&a.preset)?;
    a.override_spec(&mut spec)?;
    // The cards' recipe is the default of the two diffusion task presets (a bare `llada train
    // --preset tiny-llada-tasks` re-trains the shipped model); every part can be overridden.
    let card = matches!(a.preset.as_str(), "tiny-llada-tasks" | "tiny-dream-tasks");
    let mut opts = a.options(steps, 0.6);
    if card {
        a.card_budget(&mut opts);
    }
    let tasks = known_names(&a.tasks, &TASKS, "task")?;
    let multi_tasks = known_names(&a.multi_tasks, &MULTI_SUBTASKS, "--multi-tasks item")?;
    let (structured, ar_warmup) = (
        a.structured_masks.unwrap_or(0.5),
        // LLaDA's two-stream warm-up step costs ≈ 1.8 diffusion steps: a shorter warm-up leaves
        // more of the 55 minutes to diffusion (measured: held-out loss 0.206 at 0.3, 0.461 at 0.5).
        a.ar_warmup.unwrap_or(match (card, spec.format) {
            (false, _) => 0.0,
            (true, Format::LLaDA) => 0.3,
            (true, _) => 0.5,
        }),
    );
    let pad_answers = a.pad_answers.unwrap_or(if card { 32 } else { 0 });
    if !(0.0..=1.0).contains(&a.adaptive_mix) {
        bail!("--adaptive-mix must be in [0, 1]");
    }
    if !(0.0..=1.0).contains(&structured) || !(0.0..1.0).contains(&ar_warmup) {
        bail!("--structured-masks must be in [0, 1] and --ar-warmup in [0, 1)");
    }
    if a.two_stream == Some(true) && (spec.format != Format::LLaDA || ar_warmup == 0.0) {
        bail!("--two-stream applies to the --ar-warmup of LLaDA models (tiny-llada-tasks, tiny-llada-prose)");
    }
    let two_stream = a
        .two_stream
        .unwrap_or(spec.format == Format::LLaDA && ar_warmup > 0.0);
    if (ar_warmup > 0.0
        || a.pad_answers.is_some_and(|p| p > 0)
        || a.padding != "answer"
        || a.eos_tail.is_some())
        && spec.format == Format::Llama
    {
        bail!(
            "--ar-warmup, --pad-answers, --padding and --eos-tail apply to diffusion models \
             (tiny-llada-tasks, tiny-dream-tasks)"
        );
    }
    if a.eos_tail.is_some() && a.padding != "hidden" {
        bail!("--eos-tail needs --padding hidden (each row its own answer region)");
    }
    // Announced once every option has been checked (a bad one is an error before this line).
    progress.note(&format!(
        "training {} -> {} ({} steps, batch {})",
        a.preset,
        out.display(),
        opts.steps,
        opts.batch
    ));
    let mut data = llada_train::trainer::TaskData {
        batch: opts.batch,
        batch_tokens: a.batch_tokens.unwrap_or(2048),
        seed: opts.seed,
        curriculum: opts.curriculum,
        tasks,
        max_scale: a.max_scale,
        structured,
        ar_warmup,
        two_stream,
        pad_answers,
        eos_tail: a.eos_tail,
        hide_padding: a.padding == "hidden",
        bands: a.bands,
        mix: llada_train::trainer::TaskMix::with_adaptive(a.adaptive_mix),
    };
    data.mix.multi = multi_tasks;
    Ok(llada_train::trainer::train(
        spec, opts, &out, a.resume, false, &mut data,
    )?)
}
