//! `llada convert` / `llada quantize` against the llama.cpp peer (docs/peer.md): llama.cpp's
//! `llama-quantize` loads the GGUF we convert from the zoo's tiny-llada-prose and, for every
//! mixed type, gives each tensor the type our `quantize` gives it. Skips, saying why, when the
//! peer is not built (`scripts/peer/llama_cpp.sh`; `LLADA_PEER_DIR` points elsewhere).

use std::path::{Path, PathBuf};
use std::process::Command;

fn peer_dir() -> Option<PathBuf> {
    let d = std::env::var_os("LLADA_PEER_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            let cache = std::env::var_os("LLADA_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(home).join(".cache/llada"));
            Some(cache.join("peer/llama.cpp-0.3.36/bin"))
        })?;
    d.join("llama-quantize").is_file().then_some(d)
}

fn llada(args: &[&std::ffi::OsStr]) {
    let o = Command::new(env!("CARGO_BIN_EXE_llada"))
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// (tensor, type) of every tensor, by name (llama-quantize writes them in its own order).
fn types(p: &Path) -> std::collections::BTreeMap<String, String> {
    let g = llada_formats::gguf::GgufFile::open(p).unwrap();
    g.tensors
        .values()
        .map(|t| (t.name.clone(), t.ty.name().to_string()))
        .collect()
}

#[test]
fn llama_quantize_reads_our_files_and_mixes_types_as_we_do() {
    let Some(peer) = peer_dir() else {
        eprintln!(
            "skipping: the llama.cpp peer is not built (no llama-quantize; build it with \
             scripts/peer/llama_cpp.sh or set LLADA_PEER_DIR)"
        );
        return;
    };
    let d = std::env::temp_dir().join(format!("llada-convert-peer-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let hf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-llada-prose");
    let f16 = d.join("f16.gguf");
    llada(&[
        "convert".as_ref(),
        hf.as_os_str(),
        "-o".as_ref(),
        f16.as_os_str(),
    ]);
    for t in ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0"] {
        let theirs = d.join(format!("peer-{t}.gguf"));
        let o = Command::new(peer.join("llama-quantize"))
            .args([f16.as_os_str(), theirs.as_os_str(), t.as_ref()])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "llama-quantize {t}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let ours = d.join(format!("ours-{t}.gguf"));
        let lower = t.to_lowercase();
        llada(&[
            "quantize".as_ref(),
            f16.as_os_str(),
            ours.as_os_str(),
            "--type".as_ref(),
            lower.as_ref(),
        ]);
        assert_eq!(types(&ours), types(&theirs), "{t}");
    }
    let _ = std::fs::remove_dir_all(&d);
}
