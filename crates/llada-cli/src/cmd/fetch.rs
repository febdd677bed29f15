//! `llada fetch`: a model by alias into the cache (kept when cached and intact), its path on
//! stdout; `--list` the aliases.

use anyhow::Result;
use llada::models;

pub fn run(name: Option<String>, list: bool, force: bool) -> Result<()> {
    let Some(name) = name.filter(|_| !list) else {
        for a in models::ALIASES {
            crate::util::out_line(format!("{:<10} {}  [{}]", a.name, a.description, a.package))?;
        }
        return Ok(());
    };
    let a = models::alias(&name)?;
    let p = models::fetch(a, false, force)?;
    crate::util::out_line(p.display())
}
