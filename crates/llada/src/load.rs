//! Loading a model file with the load's transients returned to the OS.

use crate::error::Result;
use llada_model::{LoadOptions, Model};
use std::path::Path;

/// mimalloc (v3) option index of `mi_option_purge_delay` (`mimalloc.h`, `enum mi_option_e`);
/// libmimalloc-sys names only the v2 indices.
pub const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// [`Model::load`] with freed memory returned to the OS as it is freed, when mimalloc is the
/// process's allocator (the `llada` binary's; elsewhere the calls touch an unused heap).
/// Loading builds and drops large transients (the tokenizer's JSON document and text, every
/// streamed unit once for validation); mimalloc v3 keeps freed pages for a second by default,
/// so they stacked under the weights and the load was the process's RSS peak (SmolLM2-135M at
/// `--mem-budget 25%`: peak RSS 123–125 MB against ≈ 80 MB while decoding; 88–90 MB with
/// this). Afterwards the previous delay comes back: decoding reuses its buffers, and purging
/// at once slowed resident decoding by 10–15 % (docs/architecture.md, "Weight store").
pub fn load_model(path: &Path, opts: &LoadOptions) -> Result<Model> {
    // SAFETY: reads and sets process-wide allocator options and asks mimalloc to return freed
    // pages; none of these touch live allocations.
    let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    let m = Model::load(path, opts);
    unsafe {
        libmimalloc_sys::mi_collect(true);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, before);
    }
    Ok(m.map_err(|e| with_path(e, path))?)
}

/// A model-loading error that names `path` once: format errors already start with it; others
/// get "loading PATH: " in front (saying it twice read "loading /x: /x: …").
pub fn with_path(e: llada_model::ModelError, path: &Path) -> llada_model::ModelError {
    let p = path.display().to_string();
    let m = e.to_string();
    if m.starts_with(&format!("{p}:")) || m.starts_with(&format!("{p}/")) {
        e
    } else {
        llada_model::ModelError::Other(format!("loading {p}: {m}"))
    }
}
