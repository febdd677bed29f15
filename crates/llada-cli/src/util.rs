//! What every command shares: thread counts, output checks, stdout that fails cleanly, plots,
//! traces, progress bars, memory reports, model loading with the CLI's errors.

use crate::cmd::generate::ModelArgs;
use anyhow::{bail, Context, Result};
use llada_model::Model;
use llada_runtime::Tracer;
use std::io::Write;

pub(crate) use llada::load::MI_OPTION_PURGE_DELAY;

/// A model-loading error that names the path once ([`llada::load::with_path`]).
pub(crate) trait LoadContext<T> {
    fn load_context(self, path: &std::path::Path) -> Result<T>;
}

impl<T> LoadContext<T> for std::result::Result<T, llada_model::ModelError> {
    fn load_context(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| anyhow::Error::new(llada::load::with_path(e, path)))
    }
}

/// Commands that decode left to right (generate in AR or speculative mode, chat, `bench`,
/// `bench spec`, the train-* commands) refuse a diffusion model: `who` names it (its path, or
/// the option and path), `hint` says what to run instead.
pub(crate) fn left_to_right(model: &Model, who: &str, hint: &str) -> Result<()> {
    Ok(llada_zoo::left_to_right(model, who, hint)?)
}

/// A plot's drawing area: an SVG rendered into a string ([`write_svg`]).
pub(crate) type SvgArea<'a> =
    plotters::drawing::DrawingArea<plotters::prelude::SVGBackend<'a>, plotters::coord::Shift>;

/// Render a `size`-pixel SVG plot with `draw` into a string, then write it to `path`
/// atomically: a failing or interrupted run never leaves half a plot over a previous one.
pub(crate) fn write_svg(
    path: &std::path::Path,
    size: (u32, u32),
    draw: impl for<'a, 'b> FnOnce(&'b SvgArea<'a>) -> Result<()>,
) -> Result<()> {
    use plotters::prelude::IntoDrawingArea;
    let mut svg = String::new();
    {
        let root = plotters::prelude::SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root)?;
        root.present()?;
    }
    llada_formats::atomic::write(path, svg.as_bytes())?;
    Ok(())
}

/// The thread count `--threads` asks for, checked as the library checks it
/// ([`llada::EngineOptions::threads`]).
pub(crate) fn threads(opt: Option<usize>) -> Result<usize> {
    Ok(llada::EngineOptions {
        threads: opt,
        ..Default::default()
    }
    .threads()?)
}

/// `--storage-bw` (GB/s), checked: a finite rate of at least 1 MB/s (slower flash than any
/// phone's; a smaller value would make one read sleep for years).
pub(crate) fn check_storage_bw(gbps: f64) -> Result<()> {
    if !(gbps.is_finite() && gbps >= 1e-3) {
        bail!("--storage-bw {gbps:?}: give the emulated storage bandwidth in GB/s, at least 0.001");
    }
    Ok(())
}

/// An output file's path, checked before the work whose result it will hold: not a
/// directory, in a directory that exists.
pub(crate) fn check_output_file(path: &std::path::Path, flag: &str) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {}: is a directory", path.display());
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            parent.display()
        );
    }
    Ok(())
}

/// An output directory's path (created later if missing), checked before the work: it must
/// not be an existing file.
pub(crate) fn check_output_dir(path: &std::path::Path, flag: &str) -> Result<()> {
    if path.exists() && !path.is_dir() {
        bail!("{flag} {}: exists and is not a directory", path.display());
    }
    Ok(())
}

/// Print `s` and a newline on stdout: a full disk is an error, not a panic (a closed pipe ends
/// the process quietly: `main` restores SIGPIPE's default action).
pub(crate) fn out_line(s: impl std::fmt::Display) -> Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "{s}")
        .and_then(|_| o.flush())
        .context("writing to stdout")
}

/// Generated text streamed to stdout piece by piece: a failed write (a full disk) stops the
/// generation ([`StdoutStream::write`] returns `false`, the generator's "stop") and is the run's
/// error ([`StdoutStream::finish`]).
pub(crate) struct StdoutStream {
    out: std::io::Stdout,
    err: Option<std::io::Error>,
}

impl StdoutStream {
    pub(crate) fn new() -> Self {
        Self {
            out: std::io::stdout(),
            err: None,
        }
    }
    /// Write and flush `piece`; `false` once a write failed.
    pub(crate) fn write(&mut self, piece: &str) -> bool {
        match self
            .out
            .write_all(piece.as_bytes())
            .and_then(|_| self.out.flush())
        {
            Ok(()) => true,
            Err(e) => {
                self.err = Some(e);
                false
            }
        }
    }
    pub(crate) fn finish(self) -> Result<()> {
        match self.err {
            Some(e) => Err(e).context("writing to stdout"),
            None => Ok(()),
        }
    }
}

/// `threads`, or (when not given) `RAYON_NUM_THREADS`, or every core the OS reports; at least 1
/// ([`llada::engine::default_threads`]).
pub(crate) fn threads_or_all(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(llada::engine::default_threads)
}

/// A progress bar of `len` steps on stderr. It is drawn with `--json` too (stdout carries the
/// result, stderr the progress): a long command shows that it runs.
pub(crate) fn progress_bar(len: u64) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new(len)
}

/// The warning for prompt characters the model reads as its unknown token
/// ([`llada::Event::Unknown`]), on stderr.
pub(crate) fn warn_unknown(chars: &[char]) {
    let list: Vec<String> = chars.iter().map(|c| format!("{c:?}")).collect();
    eprintln!(
        "warning: the model reads {} as its unknown token",
        list.join(" ")
    );
}

/// Write the operator records collected so far to `path` (JSONL after `header`).
pub(crate) fn write_trace_file(path: &std::path::Path, header: &serde_json::Value) -> Result<()> {
    let recs = Tracer::global().drain();
    llada_formats::atomic::write_with(path, |w| Tracer::write_jsonl(w, header, &recs))
        .with_context(|| format!("writing trace {}", path.display()))?;
    eprintln!(
        "trace: {} operator records written to {}",
        recs.len(),
        path.display()
    );
    Ok(())
}

/// A requantization type named on the command line (`flag` names the option in the error).
pub(crate) fn parse_quant(flag: &str, s: Option<&str>) -> Result<Option<llada_kernels::GgmlType>> {
    Ok(llada::draft::parse_quant(flag, s)?)
}

/// Memory and streaming figures of a run (a JSON object), and a one-line summary for stderr
/// when weights were streamed. `rss_before_load` is the process's RSS just before the model
/// was loaded.
pub(crate) fn memory_report(
    model: &Model,
    rss_before_load: Option<u64>,
) -> (serde_json::Value, Option<String>) {
    use std::sync::atomic::Ordering::Relaxed;
    let peak = llada_model::store::peak_rss_bytes();
    let weights_peak = llada_kernels::weight_memory::peak();
    let mb = |b: u64| b as f64 / 1e6;
    let Some(st) = &model.store else {
        return (
            serde_json::json!({"rss_before_load_bytes": rss_before_load, "peak_rss_bytes": peak,
                "weights_peak_bytes": weights_peak}),
            None,
        );
    };
    let p = &st.plan;
    let j = serde_json::json!({
        "rss_before_load_bytes": rss_before_load,
        "peak_rss_bytes": peak,
        "weights_peak_bytes": weights_peak,
        "budget_bytes": p.budget,
        "resident_weight_bytes": p.resident_bytes(),
        "staging_bytes": p.staging_bytes(),
        "streamed_bytes_per_pass": p.streamed_bytes(),
        "bytes_read": st.stats.bytes_read.load(Relaxed),
        "units_read": st.stats.units_read.load(Relaxed),
        "storage_busy_s": st.stats.read_ns.load(Relaxed) as f64 / 1e9,
        "repack_busy_s": st.stats.build_ns.load(Relaxed) as f64 / 1e9,
        "dense_wait_s": st.stats.wait_ns.load(Relaxed) as f64 / 1e9,
        // `--storage-bw`: the reads were throttled to this; null when they ran at the disk's speed.
        "storage_bw_emulated_gbps": st.storage_bw.map(|b| b / 1e9),
    });
    let emulated = st.storage_bw.map_or(String::new(), |b| {
        format!(" at an EMULATED {:.2} GB/s", b / 1e9)
    });
    let line = format!(
        "[memory: budget {:.1} MB, resident weights {:.1} MB, staging {:.1} MB; weights peak {:.1} MB; peak RSS {:.1} MB ({:.1} MB before load); streamed {:.1} MB/pass{emulated}, reading {:.2}s, repacking {:.2}s, dense lane waited {:.2}s]",
        mb(p.budget.unwrap_or(0)),
        mb(p.resident_bytes()),
        mb(p.staging_bytes()),
        mb(weights_peak),
        mb(peak.unwrap_or(0)),
        mb(rss_before_load.unwrap_or(0)),
        mb(p.streamed_bytes()),
        st.stats.read_ns.load(Relaxed) as f64 / 1e9,
        st.stats.build_ns.load(Relaxed) as f64 / 1e9,
        st.stats.wait_ns.load(Relaxed) as f64 / 1e9,
    );
    (j, Some(line))
}

pub(crate) fn write_trace(args: &ModelArgs, model: &Model, tokens: Option<usize>) -> Result<()> {
    if let Some(p) = &args.trace {
        let mut header = serde_json::json!({
            "llada_trace": 1,
            "model": model.path.display().to_string(),
            "arch": model.config.arch.name(),
        });
        if let Some(n) = tokens {
            header["generated_tokens"] = n.into();
        }
        write_trace_file(p, &header)?;
    }
    Ok(())
}
