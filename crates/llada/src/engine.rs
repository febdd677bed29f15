//! [`Engine`]: a loaded model with its dense lane, and what turns a user's prompt into ids.

use crate::draft::DraftSource;
use crate::error::{invalid, Error, Result};
use crate::session::Session;
use llada_formats::tokenizer::{ChatTemplate, Message, Tokenizer};
use llada_kernels::GgmlType;
use llada_model::{LoadOptions, Model};
use llada_runtime::Lane;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Most worker threads a lane may have: far above any core count this runs on, far below a
/// count whose thread creation alone stalls the process (`--threads 100000` did).
pub const MAX_THREADS: usize = 1024;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Dense-lane threads (`None`: `RAYON_NUM_THREADS`, else every core).
    pub threads: Option<usize>,
    /// Weight memory budget (`512M`, `2G`, `25%`): what does not fit streams from the file for
    /// every forward pass.
    pub mem_budget: Option<String>,
    /// EMULATION: cap streamed weights' read bandwidth (GB/s); needs `mem_budget`.
    pub storage_bw_gbps: Option<f64>,
    /// Requantize every matrix at load.
    pub quantize: Option<GgmlType>,
    /// Dequantize every weight to f32 (reference precision; slow).
    pub dequantize: bool,
    /// No progress output while fetching an alias.
    pub quiet: bool,
}

impl EngineOptions {
    /// The thread count asked for, checked: 1 ..= [`MAX_THREADS`]; without one, the default
    /// (every core, or `RAYON_NUM_THREADS`) capped.
    pub fn threads(&self) -> Result<usize> {
        match self.threads {
            None => Ok(default_threads().clamp(1, MAX_THREADS)),
            Some(0) => invalid!("--threads must be at least 1"),
            Some(n) if n > MAX_THREADS => invalid!(
                "--threads {n}: at most {MAX_THREADS} (this machine reports {} cores)",
                default_threads()
            ),
            Some(n) => Ok(n),
        }
    }

    /// The model-loading options, checked.
    pub fn load_options(&self) -> Result<LoadOptions> {
        if let Some(bw) = self.storage_bw_gbps {
            if !(bw.is_finite() && bw >= 1e-3) {
                invalid!(
                    "--storage-bw {bw:?}: give the emulated storage bandwidth in GB/s, at least 0.001"
                );
            }
            if self.mem_budget.is_none() {
                invalid!(
                    "--storage-bw emulates the storage of streamed weights: it needs --mem-budget"
                );
            }
        }
        if self.quantize.is_some() && self.dequantize {
            invalid!("--quantize and --dequantize exclude each other");
        }
        Ok(LoadOptions {
            quantize: self.quantize,
            quantize_floats_only: false,
            no_tokenizer: false,
            dequantize: self.dequantize,
            mem_budget: self
                .mem_budget
                .as_deref()
                .map(llada_model::store::Budget::parse)
                .transpose()
                .map_err(Error::Invalid)?,
            storage_bw: self.storage_bw_gbps.map(|g| g * 1e9),
        })
    }
}

/// `RAYON_NUM_THREADS` (as for the global pool, e.g. two jobs sharing the cores), else every
/// core the OS reports; at least 1.
pub fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        })
}

/// A prompt: text as is, or a conversation wrapped in the model's chat template.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    Raw(&'a str),
    Chat(&'a [Message]),
}

/// A loaded model and the lanes its passes run on.
pub struct Engine {
    model: Model,
    path: PathBuf,
    lane: Lane,
    threads: usize,
    /// One-thread lanes started on first use and kept: a draft model's passes, and the
    /// vocabulary-wide selection of speculative verification (or diffusion's own sparse pool).
    draft_lane: OnceLock<Lane>,
    sparse_lane: OnceLock<Lane>,
}

/// The lane in `cell`, started (one thread, named `name`) on first use.
fn one_thread_lane<'a>(cell: &'a OnceLock<Lane>, name: &str) -> Result<&'a Lane> {
    if cell.get().is_none() {
        // A lane another thread set meanwhile wins; this one is dropped.
        let _ = cell.set(Lane::new(name, 1)?);
    }
    cell.get()
        .ok_or_else(|| Error::Invalid(format!("the {name} lane could not be started")))
}

impl Engine {
    /// Load `model`: an alias (fetched into the cache on first use), a shipped model's name, a
    /// GGUF file or an HF directory ([`crate::models::resolve`]).
    pub fn load(model: &str, opts: &EngineOptions) -> Result<Self> {
        let threads = opts.threads()?;
        let load = opts.load_options()?;
        let path = crate::models::resolve(model, opts.quiet)?;
        let m = crate::load::load_model(&path, &load)?;
        Self::from_model(m, path, threads)
    }

    /// An engine over a model already loaded (from `path`).
    pub fn from_model(model: Model, path: PathBuf, threads: usize) -> Result<Self> {
        let lane = Lane::new("dense", threads.max(1))?;
        Ok(Self {
            model,
            path,
            lane,
            threads: threads.max(1),
            draft_lane: OnceLock::new(),
            sparse_lane: OnceLock::new(),
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }
    /// The file or directory it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The dense lane every forward pass of this engine runs on.
    pub fn lane(&self) -> &Lane {
        &self.lane
    }
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// The one-thread lane a draft model runs on (started on first use, then kept).
    pub fn draft_lane(&self) -> Result<&Lane> {
        one_thread_lane(&self.draft_lane, "draft")
    }
    /// The one-thread sparse lane (speculative selection, diffusion's own sparse pool).
    pub fn sparse_lane(&self) -> Result<&Lane> {
        one_thread_lane(&self.sparse_lane, "sparse")
    }
    /// Whether it is a diffusion model (LLaDA, Dream): it decodes with `Mode::Diffusion` only.
    pub fn is_diffusion(&self) -> bool {
        self.model.config.arch.is_diffusion()
    }
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.model
            .tokenizer
            .as_ref()
            .ok_or_else(|| Error::Invalid(format!("{} has no tokenizer", self.path.display())))
    }

    /// A conversation of fresh state (its own KV cache).
    pub fn session(&self) -> Session<'_> {
        Session::new(self)
    }

    /// Load drafter `name` for this model ([`DraftSource::load`]).
    pub fn load_draft(&self, name: &str, quant: Option<GgmlType>) -> Result<DraftSource> {
        DraftSource::load(name, &self.model, quant)
    }

    /// The text a prompt becomes: raw text as is (also for a model without a template), a
    /// conversation rendered with the chat template and the assistant's turn opened.
    pub fn render(&self, prompt: &Prompt) -> Result<String> {
        let tok = self.tokenizer()?;
        Ok(match prompt {
            Prompt::Raw(t) => t.to_string(),
            Prompt::Chat(msgs) if tok.template == ChatTemplate::Raw => {
                msgs.iter().map(|m| m.content.as_str()).collect()
            }
            Prompt::Chat(msgs) => tok.template.render(msgs, true),
        })
    }

    /// A prompt's ids, with characters the vocabulary cannot represent refused by name
    /// ([`Tokenizer::encode_prompt`]); also the characters its unknown token stands for. A
    /// diffusion model's prompt starts with its BOS.
    pub fn encode(&self, prompt: &Prompt) -> Result<(Vec<u32>, Vec<char>)> {
        let tok = self.tokenizer()?;
        let (mut ids, unknown) = tok
            .encode_prompt(&self.render(prompt)?)
            .map_err(Error::Invalid)?;
        if self.is_diffusion() {
            if let Some(bos) = self.model.config.bos_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        if ids.is_empty() {
            invalid!("the prompt is empty");
        }
        Ok((ids, unknown))
    }
}
