//! `llada fetch`: a model by alias into the cache (kept when cached and intact), its path on
//! stdout; with no alias (or `--list`) the aliases, their sizes and whether they are cached.

use anyhow::Result;
use llada::models::{self, CacheState};

pub fn run(name: Option<String>, list: bool, force: bool) -> Result<()> {
    let Some(name) = name.filter(|_| !list) else {
        for a in models::ALIASES {
            let state = match models::cache_state(a) {
                CacheState::Verified => "cached",
                CacheState::Unverified => "unverified",
                CacheState::Absent => "not cached",
            };
            crate::util::out_line(format!(
                "{:<20} {:>9}  {:<10}  {}",
                a.name,
                models::human_bytes(a.size),
                state,
                a.description
            ))?;
        }
        return Ok(());
    };
    let a = models::alias(&name)?;
    let p = models::fetch(a, false, force)?;
    crate::util::out_line(p.display())
}
