//! `llada serve`: an OpenAI-compatible HTTP server (the `llada-serve` crate) over one or more
//! models, with continuous batching and a playground page.

use anyhow::{bail, Context, Result};
use clap::Args;
use llada::EngineOptions;
use llada_serve::{ModelSpec, ServeConfig};
use std::net::{IpAddr, SocketAddr};

#[derive(Args)]
#[command(after_help = "Examples:\n  \
llada serve                                   # smollm2 on http://127.0.0.1:8080\n  \
llada serve -m coder=qwen2.5-coder-1.5b -m smollm2 --parallel 16\n  \
llada serve -m tiny-llada-tasks               # a diffusion model: open http://127.0.0.1:8080/\n  \
curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n    \
-d '{\"model\": \"smollm2\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'\n\n\
Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (\"stream\": true for\n\
server-sent events), GET /health, GET /metrics (Prometheus), GET / (playground). Request fields\n\
and extensions: docs/serve.md.")]
pub struct ServeArgs {
    /// A model to serve, as NAME=MODEL or MODEL (served under the alias or the file's name);
    /// repeat for several (the first is the default). MODEL: alias, shipped name, GGUF file or
    /// HF directory. Models load on their first request.
    #[arg(
        long = "model",
        short = 'm',
        value_name = "[NAME=]MODEL",
        default_value = "smollm2"
    )]
    pub models: Vec<String>,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health (also read from
    /// LLADA_API_KEY).
    #[arg(long, env = "LLADA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Sequences decoded together in each shared forward pass, per model.
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Requests that may wait for a slot, per model; beyond, 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// max_tokens of a request that gives none.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub body_limit: usize,
    /// Drafter for speculative decoding of every request of autoregressive models (a draft
    /// model, `ngram`, …; see `llada generate --help`); responses equal plain decoding.
    #[arg(long)]
    pub draft: Option<String>,
    /// Weight memory budget (512M, 2G, 25%): what does not fit streams from the file. Bytes
    /// are shared evenly by the served models; a percentage applies to each model's weights.
    #[arg(long, value_name = "BYTES|PCT")]
    pub mem_budget: Option<String>,
    /// Worker threads of each model's dense lane (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// `NAME=MODEL` or `MODEL` → (name, model).
fn named(spec: &str) -> Result<(String, String)> {
    if let Some((n, m)) = spec.split_once('=') {
        if n.is_empty() || m.is_empty() {
            bail!("--model {spec:?}: give NAME=MODEL or MODEL");
        }
        return Ok((n.to_string(), m.to_string()));
    }
    let p = std::path::Path::new(spec);
    let name = if p.components().count() > 1 || spec.ends_with(".gguf") {
        p.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.to_string())
    } else {
        spec.to_string()
    };
    Ok((name, spec.to_string()))
}

/// Each model's part of `--mem-budget`: bytes split evenly, a percentage as it is.
fn share_budget(budget: Option<&str>, models: usize) -> Result<Option<String>> {
    use llada_model::store::Budget;
    let Some(b) = budget else { return Ok(None) };
    Ok(Some(
        match Budget::parse(b).map_err(anyhow::Error::msg)? {
            Budget::Bytes(n) => (n / models.max(1) as u64).to_string(),
            Budget::Fraction(_) => b.to_string(),
        },
    ))
}

pub fn run(a: ServeArgs) -> Result<()> {
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let host: IpAddr = a
        .host
        .parse()
        .with_context(|| format!("--host {:?}: give an IP address such as 127.0.0.1", a.host))?;
    let engine = EngineOptions {
        threads: a.threads,
        mem_budget: share_budget(a.mem_budget.as_deref(), a.models.len())?,
        quiet: true,
        ..Default::default()
    };
    engine.threads()?;
    engine.load_options()?;
    let mut models: Vec<(String, ModelSpec)> = vec![];
    for m in &a.models {
        let (name, source) = named(m)?;
        if models.iter().any(|(n, _)| *n == name) {
            bail!("two models are served as {name:?}: name them (--model NAME=MODEL)");
        }
        let looks_like_path = source.contains('/') || source.ends_with(".gguf");
        if looks_like_path && !std::path::Path::new(&source).exists() {
            bail!("--model {source}: no such file or directory");
        }
        models.push((
            name,
            ModelSpec {
                source,
                engine: engine.clone(),
                draft: a.draft.clone(),
                parallel: a.parallel,
                queue: a.queue,
            },
        ));
    }
    let names: Vec<String> = models.iter().map(|(n, _)| n.clone()).collect();
    let cfg = ServeConfig {
        models,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        default_max_tokens: a.max_tokens,
        body_limit: a.body_limit,
    };
    let addr = SocketAddr::new(host, a.port);
    llada_serve::serve_blocking(cfg, addr, |bound| {
        eprintln!(
            "llada serve: http://{bound}/ serving {} (loaded on first request); Ctrl-C stops",
            names.join(", ")
        );
    })
    .with_context(|| format!("serving on {addr}"))
}
