//! Named diffusion strategies and the lanes they run on: what `--strategy` selects, as one
//! [`DiffusionConfig`] per name, for every front-end (CLI, server, embedding programs).
//!
//! | strategy | cache | commit | windows | revision |
//! |---|---|---|---|---|
//! | `vanilla` | none (every step recomputes everything: the reference) | schedule | — | — |
//! | `prefix` | prompt + finished blocks | schedule | — | — |
//! | `dual` | prefix + masked suffix | schedule | — | — |
//! | `multi-block` | dual | threshold (default 0.95) | sliding + lookahead | — |
//! | `revision` | dual | threshold (default 0.95) | — | progressive, sparse lane |
//! | `full` | dual | threshold (default 0.95) | sliding + lookahead | progressive |
//!
//! An explicit threshold applies to any strategy.

use crate::diffusion::{
    generate_with, CacheMode, Confidence, DiffusionConfig, DiffusionOutput, MultiBlock, Revision,
    Schedule, StepView,
};
use crate::error::DecodeError;
use llada_model::{Model, ModelError};
use llada_runtime::Lane;
use serde::Serialize;

/// A named diffusion strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// Recompute everything every step (the reference).
    Vanilla,
    /// Prompt and finished blocks cached.
    Prefix,
    /// Prefix and masked suffix cached; each step recomputes only the current block.
    Dual,
    /// Dual cache, sliding window with adaptive lookahead into future blocks, threshold commits.
    MultiBlock,
    /// Dual cache, progressive revision on a sparse lane, threshold commits.
    Revision,
    /// Dual cache, multi-block windows and revision.
    Full,
}

impl Strategy {
    pub const ALL: [Strategy; 6] = [
        Self::Vanilla,
        Self::Prefix,
        Self::Dual,
        Self::MultiBlock,
        Self::Revision,
        Self::Full,
    ];
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vanilla => "vanilla",
            Self::Prefix => "prefix",
            Self::Dual => "dual",
            Self::MultiBlock => "multi-block",
            Self::Revision => "revision",
            Self::Full => "full",
        }
    }
    /// The strategy of `name`, `None` for an unknown one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
    /// Whether it commits by confidence threshold by default (the speculative strategies).
    pub fn thresholded(self) -> bool {
        matches!(self, Self::MultiBlock | Self::Revision | Self::Full)
    }
    fn windows(self) -> bool {
        matches!(self, Self::MultiBlock | Self::Full)
    }
    fn revises(self) -> bool {
        matches!(self, Self::Revision | Self::Full)
    }
}

/// Every option of a strategy run, with the CLI's defaults ([`Default`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyOptions {
    pub strategy: Strategy,
    pub gen_length: usize,
    /// Denoising steps (`None`: `gen_length`, one token per step).
    pub steps: Option<usize>,
    pub block_length: usize,
    /// Dream's timestep schedule over one block of the whole answer instead of LLaDA's
    /// uniform one over blocks.
    pub timesteps: bool,
    pub confidence: Confidence,
    /// Gumbel-noise temperature (0 = greedy commits).
    pub temperature: f32,
    pub seed: u64,
    /// Commit threshold (`None`: [`DEFAULT_THRESHOLD`] for the thresholded strategies, off
    /// otherwise).
    pub threshold: Option<f32>,
    pub window: usize,
    pub lookahead: usize,
    pub revise_threshold: f32,
    pub stable_threshold: f32,
    pub max_probes: u8,
    pub stable_on_commit: Option<f32>,
    /// Revision's sparse lane beside the dense pass (`false`: after it; the same result).
    pub concurrent_revision: bool,
    pub prefix_refresh: bool,
    pub refresh_every: usize,
    pub cfg_scale: f32,
    pub alg_temp: f32,
}

/// The default threshold of the thresholded strategies: chosen with [`DEFAULT_WINDOW`] on the
/// task models' tuning split (`llada bench diffusion-frontier`; Fast-dLLM's 0.9 committed
/// dependent running-sum digits in parallel: docs/diffusion.md, "Defaults").
pub const DEFAULT_THRESHOLD: f32 = 0.95;

/// The default multi-block window: one that holds the whole current block (32) and a block of
/// lookahead, so no masked row of the block is read from a stale cache row (with 8, sorts
/// lost 4–6 points on the tuning split; docs/diffusion.md, "Defaults").
pub const DEFAULT_WINDOW: usize = 64;

impl Default for StrategyOptions {
    fn default() -> Self {
        let r = Revision::default();
        Self {
            strategy: Strategy::Vanilla,
            gen_length: 64,
            steps: None,
            block_length: 32,
            timesteps: false,
            confidence: Confidence::TopProb,
            temperature: 0.0,
            seed: 0,
            threshold: None,
            window: DEFAULT_WINDOW,
            lookahead: 8,
            revise_threshold: r.revise_threshold,
            stable_threshold: r.stable_threshold,
            max_probes: r.max_probes,
            stable_on_commit: r.stable_on_commit,
            concurrent_revision: true,
            prefix_refresh: false,
            refresh_every: 0,
            cfg_scale: 0.0,
            alg_temp: 0.0,
        }
    }
}

impl StrategyOptions {
    /// The threshold in force.
    pub fn threshold(&self) -> Option<f32> {
        self.threshold
            .or(self.strategy.thresholded().then_some(DEFAULT_THRESHOLD))
    }

    /// The decoder configuration, checked ([`DiffusionConfig::validate`]).
    pub fn config(&self) -> Result<DiffusionConfig, DecodeError> {
        let s = self.strategy;
        let cfg = DiffusionConfig {
            gen_length: self.gen_length,
            steps: self.steps.unwrap_or(self.gen_length),
            block_length: if self.timesteps {
                self.gen_length
            } else {
                self.block_length
            },
            schedule: if self.timesteps {
                Schedule::Timesteps { eps: 1e-3 }
            } else {
                Schedule::Uniform
            },
            confidence: self.confidence,
            temperature: self.temperature,
            seed: self.seed,
            cache: match s {
                Strategy::Vanilla => CacheMode::None,
                Strategy::Prefix => CacheMode::Prefix,
                _ => CacheMode::Dual,
            },
            refresh_prefix: self.prefix_refresh,
            refresh_every: self.refresh_every,
            threshold: self.threshold(),
            multi_block: s.windows().then_some(MultiBlock {
                window: self.window,
                lookahead: self.lookahead,
            }),
            revision: s.revises().then_some(Revision {
                revise_threshold: self.revise_threshold,
                stable_threshold: self.stable_threshold,
                max_probes: self.max_probes,
                stable_on_commit: self.stable_on_commit,
                concurrent: self.concurrent_revision,
                ..Revision::default()
            }),
            cfg_scale: self.cfg_scale,
            alg_temp: self.alg_temp,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// A short name for reports: the strategy and what was added to it
    /// (`full+threshold0.95+refresh-every2`).
    pub fn name(&self) -> String {
        let mut name = match self.threshold() {
            Some(t) => format!("{}+threshold{t}", self.strategy.name()),
            None => self.strategy.name().to_string(),
        };
        if self.prefix_refresh && self.strategy != Strategy::Vanilla {
            name += "+prefix-refresh";
        }
        if self.refresh_every > 0 {
            name += &format!("+refresh-every{}", self.refresh_every);
        }
        name
    }
}

/// The lanes a diffusion strategy runs on: the dense lane with every thread, and a sparse lane
/// of its own only when asked for (see [`DiffusionLanes::new`]).
pub struct DiffusionLanes {
    pub dense: Lane,
    pub sparse: Option<Lane>,
}

impl DiffusionLanes {
    /// The lanes for `cfg`. Concurrent revision runs its sparse pass beside the dense pass on
    /// the dense lane's threads ([`Lane::join`]), unless `sparse_pool` gives it a one-thread
    /// pool of its own. Measured on 2 cores (`llada bench diffusion`, strategies `full` and
    /// `full-sparse-pool`): the own pool preempts a dense worker, and every parallel kernel of
    /// the dense pass then waits for it — the dense pass took ≈ 1.5x longer, more than the
    /// sparse work itself; the join made revision cost ≈ 5 % over multi-block instead of
    /// 15–30 %. The own pool is for machines with a core to spare.
    pub fn new(
        threads: usize,
        cfg: &DiffusionConfig,
        sparse_pool: bool,
    ) -> Result<Self, ModelError> {
        let lane = |name: &str, n: usize| {
            Lane::new(name, n).map_err(|e| ModelError::Other(format!("starting lane {name}: {e}")))
        };
        Ok(Self {
            dense: lane("dense", threads)?,
            sparse: if Self::wants_sparse_pool(cfg, sparse_pool) {
                Some(lane("sparse", 1)?)
            } else {
                None
            },
        })
    }

    /// Whether `cfg` runs its sparse pass on a pool of its own: concurrent revision with
    /// `sparse_pool` asked for.
    pub fn wants_sparse_pool(cfg: &DiffusionConfig, sparse_pool: bool) -> bool {
        sparse_pool && cfg.revision.is_some_and(|r| r.concurrent)
    }

    /// Decode after `prompt` with `cfg` ([`generate_with`]); `observe` sees every step.
    pub fn generate(
        &self,
        model: &Model,
        prompt: &[u32],
        cfg: &DiffusionConfig,
        observe: Option<&mut dyn FnMut(&StepView)>,
    ) -> Result<DiffusionOutput, ModelError> {
        generate_with(
            model,
            &self.dense,
            self.sparse.as_ref(),
            prompt,
            cfg,
            observe,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_presets_follow_the_table() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.name()), Some(s));
        }
        assert_eq!(Strategy::parse("fast"), None);
        let opts = |strategy| StrategyOptions {
            strategy,
            ..Default::default()
        };
        let v = opts(Strategy::Vanilla).config().unwrap();
        assert_eq!((v.cache, v.threshold), (CacheMode::None, None));
        assert!(v.multi_block.is_none() && v.revision.is_none());
        let f = opts(Strategy::Full).config().unwrap();
        assert_eq!(
            (f.cache, f.threshold),
            (CacheMode::Dual, Some(DEFAULT_THRESHOLD))
        );
        assert!(f.multi_block.is_some() && f.revision.is_some());
        let r = opts(Strategy::Revision).config().unwrap();
        assert!(r.multi_block.is_none() && r.revision.is_some());
        assert_eq!(
            opts(Strategy::Prefix).config().unwrap().cache,
            CacheMode::Prefix
        );
        assert_eq!(opts(Strategy::Full).name(), "full+threshold0.95");
        let d = StrategyOptions {
            strategy: Strategy::Dual,
            threshold: Some(0.8),
            refresh_every: 2,
            ..Default::default()
        };
        assert_eq!(d.name(), "dual+threshold0.8+refresh-every2");
        let bad = StrategyOptions {
            gen_length: 40,
            ..Default::default()
        };
        assert!(
            bad.config().is_err(),
            "40 is not a multiple of the block length 32"
        );
    }
}
