//! Hostile inputs: truncated, patched and fuzzed GGUF files and broken HF safetensors
//! directories must give a [`FormatError`] naming the file (and the tensor or key where there is
//! one) — never a panic, an abort or an out-of-bounds read.

use llada_formats::gguf::{GgufFile, GgufWriter, Value};
use llada_formats::hf::HfDir;
use llada_formats::{FormatError, TensorSource};
use llada_kernels::GgmlType;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Scratch directories
// ---------------------------------------------------------------------------------------------

/// A scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "llada-hostile-formats-{}-{tag}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The error's message must name `path`.
fn assert_names_path(e: &FormatError, path: &Path) {
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "error does not name {}: {msg}",
        path.display()
    );
}

fn open_err(path: &Path, bytes: &[u8]) -> FormatError {
    std::fs::write(path, bytes).unwrap();
    match GgufFile::open(path) {
        Ok(g) => panic!("hostile file opened fine ({} tensors)", g.tensors.len()),
        Err(e) => {
            assert_names_path(&e, path);
            e
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A small valid GGUF and its layout (computed from the spec, independently of the reader)
// ---------------------------------------------------------------------------------------------

const TOKENS: [&str; 4] = ["<s>", "a", "bc", "\u{e9}t\u{e9}"];

fn kvs() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("hostile-test".into())),
        ("llama.block_count", Value::U32(2)),
        (
            "tokenizer.ggml.tokens",
            Value::Array(
                TOKENS
                    .iter()
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            ),
        ),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("general.flag", Value::Bool(true)),
        ("general.big", Value::U64(1 << 40)),
    ]
}

/// (name, row-major shape, type, data bytes).
fn tensors() -> Vec<(&'static str, Vec<usize>, GgmlType, Vec<u8>)> {
    let f32s: Vec<u8> = (0..15)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let q8: Vec<u8> = (0..2 * 2 * 34).map(|i| (i * 7 % 251) as u8).collect();
    let q41: Vec<u8> = (0..20).map(|i| (i * 13 % 256) as u8).collect();
    vec![
        ("t.f32", vec![3, 5], GgmlType::F32, f32s),
        ("t.q8_0", vec![2, 64], GgmlType::Q8_0, q8),
        ("t.q4_1", vec![1, 32], GgmlType::Q4_1, q41),
    ]
}

fn valid_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in kvs() {
        w.kv(k, v);
    }
    for (n, s, t, d) in tensors() {
        w.tensor(n, &s, t, d);
    }
    w
}

fn value_size(v: &Value) -> usize {
    match v {
        Value::U8(_) | Value::I8(_) | Value::Bool(_) => 1,
        Value::U16(_) | Value::I16(_) => 2,
        Value::U32(_) | Value::I32(_) | Value::F32(_) => 4,
        Value::U64(_) | Value::I64(_) | Value::F64(_) => 8,
        Value::String(s) => 8 + s.len(),
        Value::Array(a) => 4 + 8 + a.iter().map(value_size).sum::<usize>(),
    }
}

struct KvLayout {
    key: &'static str,
    /// Offset of the key's u64 length.
    start: usize,
    /// Offset of the u32 value type.
    ty_at: usize,
    /// One past the value.
    end: usize,
}

struct TensorLayout {
    name: &'static str,
    start: usize,
    /// Offset of the u32 n_dims.
    ndims_at: usize,
    /// Offset of the first u64 dim.
    dims_at: usize,
    /// Offset of the u32 ggml type.
    ty_at: usize,
    /// Offset of the u64 data offset.
    off_at: usize,
    end: usize,
    /// Absolute byte range of the data.
    data: (usize, usize),
}

struct Layout {
    kvs: Vec<KvLayout>,
    tensors: Vec<TensorLayout>,
    header_end: usize,
    data_offset: usize,
    len: usize,
}

fn layout() -> Layout {
    let mut pos = 4 + 4 + 8 + 8;
    let mut kl = Vec::new();
    for (k, v) in kvs() {
        let start = pos;
        let ty_at = start + 8 + k.len();
        let end = ty_at + 4 + value_size(&v);
        kl.push(KvLayout {
            key: k,
            start,
            ty_at,
            end,
        });
        pos = end;
    }
    let mut tl = Vec::new();
    let mut rel = 0usize;
    for (n, s, _, d) in tensors() {
        let start = pos;
        let ndims_at = start + 8 + n.len();
        let dims_at = ndims_at + 4;
        let ty_at = dims_at + 8 * s.len();
        let off_at = ty_at + 4;
        let end = off_at + 8;
        tl.push(TensorLayout {
            name: n,
            start,
            ndims_at,
            dims_at,
            ty_at,
            off_at,
            end,
            data: (rel, rel + d.len()),
        });
        rel = (rel + d.len()).next_multiple_of(32);
        pos = end;
    }
    let data_offset = pos.next_multiple_of(32);
    for t in &mut tl {
        t.data = (t.data.0 + data_offset, t.data.1 + data_offset);
    }
    Layout {
        kvs: kl,
        tensors: tl,
        header_end: pos,
        data_offset,
        len: data_offset + rel,
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn valid_file_matches_layout() {
    let s = Scratch::new("valid");
    let bytes = valid_writer().to_bytes();
    let l = layout();
    assert_eq!(bytes.len(), l.len, "writer layout differs from the spec");
    // Spot-check the computed layout against the bytes.
    for k in &l.kvs {
        assert_eq!(&bytes[k.start + 8..k.ty_at], k.key.as_bytes());
    }
    for t in &l.tensors {
        assert_eq!(&bytes[t.start + 8..t.ndims_at], t.name.as_bytes());
    }
    let p = s.path("valid.gguf");
    std::fs::write(&p, &bytes).unwrap();
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.data_offset as usize, l.data_offset);
    assert_eq!(g.order, ["t.f32", "t.q8_0", "t.q4_1"]);
    assert_eq!(g.architecture().unwrap(), "llama");
    let toks: Vec<&str> = g
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(toks, TOKENS);
    assert_eq!(g.get_u64("general.big").unwrap(), 1 << 40);
    for (t, (name, shape, ty, data)) in l.tensors.iter().zip(tensors()) {
        let v = g.require(name).unwrap();
        assert_eq!(v.ty, ty);
        assert_eq!(v.shape, shape);
        assert_eq!((v.offset, v.offset + v.len), t.data);
        assert_eq!(v.bytes(), &data[..]);
    }
    // v2 files are accepted too.
    let mut v2 = bytes.clone();
    put_u32(&mut v2, 4, 2);
    std::fs::write(&p, v2).unwrap();
    assert_eq!(GgufFile::open(&p).unwrap().version, 2);
}

// ---------------------------------------------------------------------------------------------
// Truncation at every byte offset
// ---------------------------------------------------------------------------------------------

#[test]
fn truncated_at_every_offset() {
    let s = Scratch::new("trunc");
    let p = s.path("t.gguf");
    let bytes = valid_writer().to_bytes();
    let l = layout();
    let last_end = l.tensors.last().unwrap().data.1;
    assert!(last_end < l.len, "the fixture should have trailing padding");
    for cut in 0..l.len {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let r = GgufFile::open(&p);
        if cut >= last_end {
            // Only trailing padding after the last tensor is missing.
            let g = r.unwrap_or_else(|e| panic!("cut at {cut} (only padding lost): {e}"));
            assert_eq!(g.tensors.len(), 3);
            assert_eq!(g.require("t.q4_1").unwrap().bytes(), &tensors()[2].3[..]);
            continue;
        }
        let e = match r {
            Ok(_) => panic!("file truncated at {cut} of {} opened fine", l.len),
            Err(e) => e,
        };
        assert_names_path(&e, &p);
        let msg = e.to_string();
        if cut < 4 {
            assert!(
                matches!(e, FormatError::BadMagic { .. }),
                "cut {cut}: {msg}"
            );
            continue;
        }
        match &e {
            FormatError::Truncated { len, .. } => assert_eq!(*len, cut as u64, "cut {cut}: {msg}"),
            _ => panic!("cut {cut}: expected Truncated, got {msg}"),
        }
        // The message names the thing being read where there is one.
        let expect: Option<String> =
            if let Some(k) = l.kvs.iter().find(|k| (k.start..k.end).contains(&cut)) {
                Some(if cut < k.ty_at {
                    "metadata key #".into()
                } else {
                    format!("'{}'", k.key)
                })
            } else if let Some(t) = l.tensors.iter().find(|t| (t.start..t.end).contains(&cut)) {
                Some(if cut < t.ndims_at {
                    "tensor name #".into()
                } else {
                    format!("'{}'", t.name)
                })
            } else if (l.header_end..l.data_offset).contains(&cut) {
                Some("tensor data section".into())
            } else if cut >= l.data_offset {
                let t = l.tensors.iter().find(|t| t.data.1 > cut).unwrap();
                Some(format!("data of tensor '{}'", t.name))
            } else {
                None // inside the fixed header (version / counts)
            };
        if let Some(x) = expect {
            assert!(msg.contains(&x), "cut {cut}: expected '{x}' in: {msg}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Patched headers
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_magic_and_version() {
    let s = Scratch::new("magic");
    let p = s.path("m.gguf");
    let good = valid_writer().to_bytes();

    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGML");
    match open_err(&p, &b) {
        FormatError::BadMagic { magic, .. } => assert_eq!(magic, b"GGML"),
        e => panic!("expected BadMagic, got {e}"),
    }
    // Something that is not a model at all.
    match open_err(&p, b"{\"hello\": \"world\"}") {
        FormatError::BadMagic { magic, .. } => assert_eq!(magic, b"{\"he"),
        e => panic!("expected BadMagic, got {e}"),
    }
    for v in [0u32, 1, 4, 99, u32::MAX] {
        let mut b = good.clone();
        put_u32(&mut b, 4, v);
        match open_err(&p, &b) {
            FormatError::BadVersion { version, .. } => assert_eq!(version, v),
            e => panic!("expected BadVersion({v}), got {e}"),
        }
    }
}

#[test]
fn missing_file_and_directory() {
    let s = Scratch::new("missing");
    let p = s.path("nope.gguf");
    let e = GgufFile::open(&p).err().expect("missing file opened");
    assert!(
        matches!(&e, FormatError::Io { err: source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{e}"
    );
    assert_names_path(&e, &p);
    // A directory is not a GGUF file.
    let e = GgufFile::open(&s.0)
        .err()
        .expect("directory opened as GGUF");
    assert_names_path(&e, &s.0);
}

#[test]
fn absurd_counts() {
    let s = Scratch::new("counts");
    let p = s.path("c.gguf");
    let good = valid_writer().to_bytes();
    for (at, what) in [(8usize, "tensors"), (16, "metadata")] {
        for v in [u64::MAX, 1 << 40, (1 << 24) + 1] {
            let mut b = good.clone();
            put_u64(&mut b, at, v);
            let e = open_err(&p, &b);
            assert!(
                matches!(e, FormatError::Corrupt { .. }),
                "{what} = {v}: {e}"
            );
            assert!(e.to_string().contains("absurd header counts"), "{e}");
        }
        // Large but plausible: the reader runs into the following bytes and fails quickly
        // instead of looping 2^24 times or allocating for 2^24 entries.
        let mut b = good.clone();
        put_u64(&mut b, at, 1 << 24);
        let e = open_err(&p, &b);
        assert!(
            matches!(
                e,
                FormatError::Truncated { .. } | FormatError::Corrupt { .. }
            ),
            "{what} = 2^24: {e}"
        );
    }
    // One tensor more than the header holds: the data section is read as a tensor info.
    let mut b = good.clone();
    put_u64(&mut b, 8, 4);
    let e = open_err(&p, &b);
    assert!(
        matches!(
            e,
            FormatError::Truncated { .. } | FormatError::Corrupt { .. }
        ),
        "{e}"
    );
}

#[test]
fn absurd_string_and_array_lengths() {
    let s = Scratch::new("lengths");
    let p = s.path("l.gguf");
    let good = valid_writer().to_bytes();
    let l = layout();
    let kv = |k: &str| l.kvs.iter().find(|x| x.key == k).unwrap();

    // Key length.
    for v in [u64::MAX, u64::MAX - 7, 1 << 40, good.len() as u64] {
        let mut b = good.clone();
        put_u64(&mut b, kv("general.name").start, v);
        let e = open_err(&p, &b);
        assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
        assert!(e.to_string().contains("metadata key #1"), "{e}");
    }
    // String value length.
    for v in [u64::MAX, 1 << 40] {
        let mut b = good.clone();
        put_u64(&mut b, kv("general.name").ty_at + 4, v);
        let e = open_err(&p, &b);
        assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
        assert!(e.to_string().contains("'general.name'"), "{e}");
    }
    // Tensor name length.
    let mut b = good.clone();
    put_u64(&mut b, l.tensors[1].start, u64::MAX);
    let e = open_err(&p, &b);
    assert!(e.to_string().contains("tensor name #1"), "{e}");
    // Array length (element count) and array element string length.
    let tok = kv("tokenizer.ggml.tokens");
    for v in [u64::MAX, 1 << 40, (1 << 24) + 1, 1000] {
        let mut b = good.clone();
        put_u64(&mut b, tok.ty_at + 4 + 4, v);
        let e = open_err(&p, &b);
        assert!(
            matches!(
                e,
                FormatError::Truncated { .. } | FormatError::Corrupt { .. }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("tokenizer.ggml.tokens"),
            "array len {v}: {e}"
        );
    }
    let mut b = good.clone();
    put_u64(&mut b, tok.ty_at + 4 + 4 + 8, u64::MAX);
    let e = open_err(&p, &b);
    assert!(e.to_string().contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn bad_value_types_and_utf8() {
    let s = Scratch::new("types");
    let p = s.path("t.gguf");
    let good = valid_writer().to_bytes();
    let l = layout();
    let kv = |k: &str| l.kvs.iter().find(|x| x.key == k).unwrap();

    for t in [13u32, 200, u32::MAX] {
        let mut b = good.clone();
        put_u32(&mut b, kv("llama.block_count").ty_at, t);
        let e = open_err(&p, &b);
        assert!(matches!(e, FormatError::Corrupt { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("'llama.block_count'") && msg.contains(&format!("unknown value type {t}")),
            "{msg}"
        );
    }
    // Unknown array element type.
    let mut b = good.clone();
    put_u32(&mut b, kv("tokenizer.ggml.tokens").ty_at + 4, 77);
    let e = open_err(&p, &b);
    assert!(
        e.to_string()
            .contains("'tokenizer.ggml.tokens' has unknown value type 77"),
        "{e}"
    );

    // Non-UTF-8 key, string value and tensor name.
    let mut b = good.clone();
    b[kv("general.name").start + 8] = 0xff;
    let e = open_err(&p, &b);
    assert!(matches!(e, FormatError::Corrupt { .. }), "{e}");
    assert!(
        e.to_string().contains("metadata key #1 is not valid UTF-8"),
        "{e}"
    );

    let mut b = good.clone();
    b[kv("general.name").ty_at + 4 + 8] = 0xc3; // lone UTF-8 lead byte followed by ASCII
    let e = open_err(&p, &b);
    assert!(
        e.to_string().contains("'general.name' is not valid UTF-8"),
        "{e}"
    );

    let mut b = good.clone();
    b[l.tensors[2].start + 8] = 0x80;
    let e = open_err(&p, &b);
    assert!(
        e.to_string().contains("tensor name #2 is not valid UTF-8"),
        "{e}"
    );
}

#[test]
fn empty_arrays_are_written_as_string_arrays() {
    // `llada synth` writes an empty `tokenizer.ggml.merges`; GGUF readers check its element type.
    let mut w = GgufWriter::new();
    w.kv("tokenizer.ggml.merges", Value::Array(vec![]));
    let b = w.to_bytes();
    let key = b"tokenizer.ggml.merges";
    let at = b
        .windows(key.len())
        .position(|x| x == key)
        .expect("key written")
        + key.len();
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    assert_eq!(u32_at(at), 9, "value type: array");
    assert_eq!(u32_at(at + 4), 8, "element type: string");
    assert_eq!(
        u64::from_le_bytes(b[at + 8..at + 16].try_into().unwrap()),
        0
    );
}

#[test]
fn nested_arrays_and_alignment_metadata() {
    let s = Scratch::new("nested");
    let p = s.path("n.gguf");
    // Four levels of arrays: rejected (bounded recursion), naming the key.
    let deep = Value::Array(vec![Value::Array(vec![Value::Array(vec![Value::Array(
        vec![Value::U8(1)],
    )])])]);
    let mut w = GgufWriter::new();
    w.kv("deep.key", deep);
    let e = open_err(&p, &w.to_bytes());
    assert!(
        e.to_string()
            .contains("'deep.key': arrays nested too deeply"),
        "{e}"
    );
    // Three levels are fine.
    let ok = Value::Array(vec![Value::Array(vec![Value::Array(vec![
        Value::U8(1),
        Value::U8(2),
    ])])]);
    let mut w = GgufWriter::new();
    w.kv("ok.key", ok.clone());
    w.write(&p).unwrap();
    assert_eq!(GgufFile::open(&p).unwrap().get("ok.key"), Some(&ok));

    for a in [
        Value::U32(0),
        Value::U32(3),
        Value::U32(1 << 20),
        Value::String("32".into()),
        Value::I32(-32),
    ] {
        let mut w = valid_writer();
        w.kv("general.alignment", a.clone());
        let e = open_err(&p, &w.to_bytes());
        match &e {
            FormatError::Metadata { key, .. } => assert_eq!(key, "general.alignment", "{e}"),
            _ => panic!("alignment {a:?}: expected Metadata error, got {e}"),
        }
    }
}

#[test]
fn bad_tensor_infos() {
    let s = Scratch::new("tinfo");
    let p = s.path("t.gguf");
    let good = valid_writer().to_bytes();
    let l = layout();
    let (t0, t1, t2) = (&l.tensors[0], &l.tensors[1], &l.tensors[2]);

    // n_dims 0, 5 (above the supported 4) and 9.
    for nd in [0u32, 5, 9, u32::MAX] {
        let mut b = good.clone();
        put_u32(&mut b, t1.ndims_at, nd);
        let e = open_err(&p, &b);
        assert!(matches!(e, FormatError::Corrupt { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("tensor 't.q8_0' has {nd} dimensions")),
            "{e}"
        );
    }
    // Dimensions whose product overflows u64, is absurd, or is zero.
    for (d0, d1) in [
        (1u64 << 32, 1u64 << 32),
        (u64::MAX, 3),
        (1 << 20, 1 << 20),
        (0, 3),
        (5, 0),
    ] {
        let mut b = good.clone();
        put_u64(&mut b, t0.dims_at, d0);
        put_u64(&mut b, t0.dims_at + 8, d1);
        let e = open_err(&p, &b);
        assert!(matches!(e, FormatError::Corrupt { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("tensor 't.f32' has absurd dimensions"),
            "dims {d0}x{d1}: {e}"
        );
    }
    // Plausible dims that need more bytes than the file holds.
    let mut b = good.clone();
    put_u64(&mut b, t0.dims_at + 8, 1000);
    let e = open_err(&p, &b);
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
    assert!(e.to_string().contains("data of tensor 't.f32'"), "{e}");
    // Row length not a whole number of Q8_0 blocks.
    let mut b = good.clone();
    put_u64(&mut b, t1.dims_at, 48);
    let e = open_err(&p, &b);
    assert!(
        e.to_string()
            .contains("tensor 't.q8_0': row length 48 is not a multiple"),
        "{e}"
    );
    // A K-quant type on rows (64) that are not whole super-blocks of 256: a clear error
    // naming the tensor.
    for ty in [10u32, 11, 12, 13, 14] {
        let mut b = good.clone();
        put_u32(&mut b, t1.ty_at, ty);
        let e = open_err(&p, &b);
        assert!(e.to_string().contains("t.q8_0"), "type {ty}: {e}");
    }
    // Unknown / unsupported ggml type ids (4, 5: removed from ggml; 9: Q8_1; 16: IQ2_XXS).
    for ty in [200u32, 4, 5, 9, 16, u32::MAX] {
        let mut b = good.clone();
        put_u32(&mut b, t2.ty_at, ty);
        match open_err(&p, &b) {
            FormatError::UnsupportedType { tensor, ty: t, .. } => {
                assert_eq!(tensor, "t.q4_1");
                assert!(t.contains(&ty.to_string()), "{t}");
            }
            e => panic!("type {ty}: expected UnsupportedType, got {e}"),
        }
    }
    // Offset past the end of the file, and offsets that overflow when added to the data start.
    for off in [
        1u64 << 20,
        (l.len - l.data_offset) as u64,
        u64::MAX - 31,
        1 << 63,
    ] {
        let mut b = good.clone();
        put_u64(&mut b, t2.off_at, off);
        let e = open_err(&p, &b);
        assert!(
            matches!(e, FormatError::Truncated { .. }),
            "offset {off}: {e}"
        );
        assert!(
            e.to_string().contains("data of tensor 't.q4_1'"),
            "offset {off}: {e}"
        );
    }
    // Offset not aligned.
    for off in [1u64, 33, 224 + 16] {
        let mut b = good.clone();
        put_u64(&mut b, t2.off_at, off);
        let e = open_err(&p, &b);
        assert!(matches!(e, FormatError::Corrupt { .. }), "{e}");
        assert!(
            e.to_string().contains(&format!(
                "tensor 't.q4_1' offset {off} is not aligned to 32"
            )),
            "{e}"
        );
    }
    // Duplicate tensor names (two ways: writer, and patching a name in place).
    let mut w = valid_writer();
    w.tensor("t.f32", &[3, 5], GgmlType::F32, vec![0u8; 60]);
    let e = open_err(&p, &w.to_bytes());
    assert!(e.to_string().contains("duplicate tensor 't.f32'"), "{e}");
    let mut w = GgufWriter::new();
    w.tensor("aa", &[32], GgmlType::F32, vec![0u8; 128]);
    w.tensor("ab", &[32], GgmlType::F32, vec![0u8; 128]);
    let mut b = w.to_bytes();
    let second = 24 + 8 + 2 + 4 + 8 + 4 + 8 + 8; // header, first info, then len of the second name
    assert_eq!(&b[second..second + 2], b"ab");
    b[second + 1] = b'a';
    let e = open_err(&p, &b);
    assert!(e.to_string().contains("duplicate tensor 'aa'"), "{e}");
}

/// A claimed array longer than any real metadata, with the bytes "present" in a sparse file:
/// must be rejected without trying to allocate memory for it (which would abort the process).
#[test]
fn huge_array_in_sparse_file() {
    let s = Scratch::new("sparse");
    let p = s.path("sparse.gguf");
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(5u64.to_le_bytes());
    b.extend(b"a.big");
    b.extend(9u32.to_le_bytes()); // array
    b.extend(0u32.to_le_bytes()); // of u8
    let n: u64 = 1 << 34;
    b.extend(n.to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    if f.set_len(n + b.len() as u64).is_err() {
        eprintln!("skipping: the temp filesystem cannot hold a sparse 16 GiB file");
        return;
    }
    drop(f);
    let e = GgufFile::open(&p)
        .err()
        .expect("2^34-element array accepted");
    assert_names_path(&e, &p);
    assert!(e.to_string().contains("'a.big'"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Fuzzing
// ---------------------------------------------------------------------------------------------

struct Lcg(u64);
impl Lcg {
    fn next_u64(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[test]
fn fuzz_mutated_headers() {
    let s = Scratch::new("fuzz");
    let p = s.path("f.gguf");
    let good = valid_writer().to_bytes();
    let l = layout();
    let mut rng = Lcg(0x5eed_1234_abcd);
    let (mut oks, mut errs) = (0usize, 0usize);
    let iters = 4000;
    for it in 0..iters {
        let mut b = good.clone();
        for _ in 0..1 + rng.below(4) {
            // Mostly the header; sometimes anywhere.
            let at = if rng.below(10) < 9 {
                rng.below(l.header_end)
            } else {
                rng.below(b.len())
            };
            match rng.below(6) {
                0 => b[at] ^= 1 << rng.below(8),
                1 => b[at] = rng.next_u64() as u8,
                2 => b[at] = 0xff,
                3 => b[at] = 0,
                4 => {
                    // A whole extreme u64 (counts, lengths, dims, offsets are u64s).
                    let v = [0u64, 1, u64::MAX, 1 << 63, 1 << 32, rng.next_u64()][rng.below(6)];
                    let at = at.min(b.len() - 8);
                    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                _ => {
                    let v = rng.next_u64() as u32 % 40;
                    let at = at.min(b.len() - 4);
                    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if rng.below(8) == 0 {
            b.truncate(rng.below(b.len()));
        }
        std::fs::write(&p, &b).unwrap();
        let r = std::panic::catch_unwind(|| match GgufFile::open(&p) {
            Ok(g) => {
                // Every tensor the reader hands out lies inside the file and has the size its
                // type and shape imply.
                for name in g.names() {
                    let v = g.require(&name).unwrap();
                    assert!(v.offset + v.len <= b.len(), "tensor '{name}' out of bounds");
                    let numel: u64 = v.shape.iter().map(|&d| d as u64).product();
                    assert_eq!(
                        Some(v.len as u64),
                        v.ty.bytes_for(numel),
                        "tensor '{name}' size"
                    );
                    assert_eq!(v.bytes().len(), v.len);
                }
                true
            }
            Err(e) => {
                assert!(
                    e.to_string().contains(&p.display().to_string()),
                    "error does not name the file: {e}"
                );
                false
            }
        });
        match r {
            Ok(true) => oks += 1,
            Ok(false) => errs += 1,
            Err(_) => {
                let dump = s.path(&format!("crash-{it}.gguf"));
                std::fs::copy(&p, &dump).unwrap();
                panic!(
                    "iteration {it}: GgufFile::open panicked (input kept at {})",
                    dump.display()
                );
            }
        }
    }
    eprintln!("fuzz: {oks} opened, {errs} rejected");
    assert_eq!(oks + errs, iters);
    assert!(
        oks > 0 && errs > iters / 2,
        "fuzzer is not exercising both paths: {oks} ok, {errs} err"
    );
}

// ---------------------------------------------------------------------------------------------
// Hugging Face directories
// ---------------------------------------------------------------------------------------------

fn safetensors_bytes(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    raw_safetensors(&serde_json::Value::Object(header).to_string(), &data)
}

fn raw_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

const CONFIG: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 8}"#;

fn hf_dir(tag: &str, shards: &[(&str, Vec<u8>)]) -> Scratch {
    let s = Scratch::new(tag);
    std::fs::write(s.path("config.json"), CONFIG).unwrap();
    for (name, bytes) in shards {
        std::fs::write(s.path(name), bytes).unwrap();
    }
    s
}

fn two_tensors() -> Vec<u8> {
    safetensors_bytes(&[
        ("a.weight", "F16", vec![2, 4], vec![0u8; 16]),
        ("b.weight", "F32", vec![3], vec![0u8; 12]),
    ])
}

fn hf_err(dir: &Path) -> FormatError {
    match HfDir::open(dir) {
        Ok(h) => panic!("hostile HF dir opened fine ({} tensors)", h.names().len()),
        Err(e) => e,
    }
}

#[test]
fn hf_valid_dir_opens() {
    let s = hf_dir("hf-ok", &[("model.safetensors", two_tensors())]);
    let h = HfDir::open(&s.0).unwrap();
    assert_eq!(h.names(), ["a.weight", "b.weight"]);
    assert_eq!(h.config["hidden_size"], 8);
    let a = h.require("a.weight").unwrap();
    assert_eq!(
        (a.ty, a.shape.clone(), a.len),
        (GgmlType::F16, vec![2, 4], 16)
    );
    assert!(
        matches!(h.require("c.weight"), Err(FormatError::MissingTensor { tensor, .. }) if tensor == "c.weight")
    );
}

#[test]
fn hf_missing_or_bad_config() {
    let s = hf_dir("hf-nocfg", &[("model.safetensors", two_tensors())]);
    std::fs::remove_file(s.path("config.json")).unwrap();
    match hf_err(&s.0) {
        FormatError::Io { path, err: source } => {
            assert_eq!(path, s.path("config.json"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        e => panic!("expected Io on config.json, got {e}"),
    }
    for bad in ["{\"hidden_size\": ", "", "not json", "{\"a\": 1}}"] {
        std::fs::write(s.path("config.json"), bad).unwrap();
        match hf_err(&s.0) {
            FormatError::Corrupt { path, what } => {
                assert_eq!(path, s.path("config.json"));
                assert!(what.contains("invalid JSON"), "{what}");
            }
            e => panic!("expected Corrupt config.json, got {e}"),
        }
    }
    // Not UTF-8.
    std::fs::write(s.path("config.json"), b"{\"a\": \"\xff\"}").unwrap();
    let e = hf_err(&s.0);
    assert_names_path(&e, &s.path("config.json"));
}

#[test]
fn hf_missing_weights() {
    let s = hf_dir("hf-noweights", &[]);
    match hf_err(&s.0) {
        FormatError::Io { path, err: source } => {
            assert_eq!(path, s.path("model.safetensors"));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        e => panic!("expected Io on model.safetensors, got {e}"),
    }
}

#[test]
fn hf_corrupt_safetensors() {
    let good = two_tensors();
    let hlen = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + hlen]).unwrap().to_string();
    let data = good[8 + hlen..].to_vec();

    let with_len = |n: u64| {
        let mut b = good.clone();
        b[..8].copy_from_slice(&n.to_le_bytes());
        b
    };
    let mut not_utf8 = good.clone();
    not_utf8[8] = 0xff;
    let patched = |from: &str, to: &str| raw_safetensors(&header.replace(from, to), &data);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty file", vec![]),
        ("shorter than the length prefix", vec![1, 2, 3]),
        (
            "header length larger than the file",
            with_len(good.len() as u64),
        ),
        ("header length u64::MAX", with_len(u64::MAX)),
        (
            "header not JSON",
            raw_safetensors(&"x".repeat(header.len()), &data),
        ),
        ("header not UTF-8", not_utf8),
        ("data_offsets past the end", patched("[16,28]", "[16,4000]")),
        ("data_offsets overlapping", patched("[16,28]", "[8,20]")),
        ("shape disagrees with data_offsets", patched("[3]", "[4]")),
        (
            "shape overflows",
            patched("[3]", "[18446744073709551615,2]"),
        ),
        ("data section truncated", good[..good.len() - 1].to_vec()),
        ("trailing garbage", [good.clone(), vec![0u8; 5]].concat()),
    ];

    for (what, bytes) in cases {
        let s = hf_dir("hf-corrupt", &[("model.safetensors", bytes)]);
        match hf_err(&s.0) {
            FormatError::Corrupt { path, what: w } => {
                assert_eq!(path, s.path("model.safetensors"), "{what}");
                assert!(w.contains("invalid safetensors"), "{what}: {w}");
            }
            e => panic!("{what}: expected Corrupt, got {e}"),
        }
    }
}

#[test]
fn hf_unsupported_dtype_names_tensor() {
    for dt in ["I64", "I32", "U8", "BOOL", "F64"] {
        let size = match dt {
            "I64" | "F64" => 8,
            "I32" => 4,
            _ => 1,
        };
        let st = safetensors_bytes(&[
            ("a.weight", "F16", vec![2], vec![0u8; 4]),
            ("pos.ids", dt, vec![3], vec![0u8; 3 * size]),
        ]);
        let s = hf_dir("hf-dtype", &[("model.safetensors", st)]);
        match hf_err(&s.0) {
            FormatError::UnsupportedType { path, tensor, ty } => {
                assert_eq!(path, s.path("model.safetensors"));
                assert_eq!(tensor, "pos.ids");
                assert_eq!(ty, dt);
            }
            e => panic!("{dt}: expected UnsupportedType, got {e}"),
        }
    }
    // An unknown dtype string is a header error.
    let st = safetensors_bytes(&[("a.weight", "Q4", vec![2], vec![0u8; 4])]);
    let s = hf_dir("hf-dtype", &[("model.safetensors", st)]);
    assert!(
        matches!(hf_err(&s.0), FormatError::Corrupt { path, .. } if path == s.path("model.safetensors"))
    );
}

fn index_json(map: &[(&str, &str)]) -> String {
    let m: serde_json::Map<String, serde_json::Value> = map
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    serde_json::json!({"metadata": {}, "weight_map": m}).to_string()
}

#[test]
fn hf_sharded() {
    let shard1 = safetensors_bytes(&[("a.weight", "F32", vec![2], vec![0u8; 8])]);
    let shard2 = safetensors_bytes(&[("b.weight", "F32", vec![2], vec![0u8; 8])]);
    let (n1, n2) = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    );

    // Valid.
    let s = hf_dir("hf-shards", &[(n1, shard1.clone()), (n2, shard2.clone())]);
    std::fs::write(
        s.path("model.safetensors.index.json"),
        index_json(&[("a.weight", n1), ("b.weight", n2)]),
    )
    .unwrap();
    assert_eq!(HfDir::open(&s.0).unwrap().names(), ["a.weight", "b.weight"]);

    // A shard that does not exist.
    std::fs::remove_file(s.path(n2)).unwrap();
    match hf_err(&s.0) {
        FormatError::Io { path, err: source } => {
            assert_eq!(path, s.path(n2));
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        e => panic!("expected Io on the missing shard, got {e}"),
    }

    // Shard names escaping the directory.
    for evil in [
        "../model.safetensors",
        "/etc/passwd",
        "sub/x.safetensors",
        "..\\x.safetensors",
        "..",
    ] {
        std::fs::write(
            s.path("model.safetensors.index.json"),
            index_json(&[("a.weight", n1), ("b.weight", evil)]),
        )
        .unwrap();
        match hf_err(&s.0) {
            FormatError::Corrupt { path, what } => {
                assert_eq!(path, s.path("model.safetensors.index.json"));
                assert!(what.contains(evil), "{what}");
            }
            e => panic!("{evil}: expected Corrupt index, got {e}"),
        }
    }

    // Invalid index JSON; no weight_map.
    std::fs::write(s.path("model.safetensors.index.json"), "{\"weight_map\": [").unwrap();
    assert!(
        matches!(hf_err(&s.0), FormatError::Corrupt { path, .. } if path == s.path("model.safetensors.index.json"))
    );
    std::fs::write(s.path("model.safetensors.index.json"), "{\"metadata\": {}}").unwrap();
    match hf_err(&s.0) {
        FormatError::Metadata { path, key, .. } => {
            assert_eq!(path, s.path("model.safetensors.index.json"));
            assert_eq!(key, "weight_map");
        }
        e => panic!("expected Metadata weight_map, got {e}"),
    }

    // The same tensor in two shards.
    std::fs::write(s.path(n2), shard1).unwrap();
    std::fs::write(
        s.path("model.safetensors.index.json"),
        index_json(&[("a.weight", n1), ("b.weight", n2)]),
    )
    .unwrap();
    let e = hf_err(&s.0);
    assert!(matches!(e, FormatError::Corrupt { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("tensor 'a.weight' appears in two shards"),
        "{e}"
    );
}

/// The streaming writer (used by `llada synth` for multi-GB files) produces the same file as
/// the in-memory one, and lazy tensors read back with the bytes `fill` gave them.
#[test]
fn streaming_writer_round_trips() {
    let dir = Scratch::new("stream");
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .tensor("a", &[4], GgmlType::F32, vec![1u8; 16])
        .tensor_lazy("b", &[3, 64], GgmlType::Q8_0)
        .tensor("c", &[2], GgmlType::F32, vec![2u8; 8]);
    let p = dir.path("s.gguf");
    let mut calls = 0;
    w.write_streaming(&p, &mut |i, off, buf| {
        calls += 1;
        assert_eq!(i, 1);
        for (k, b) in buf.iter_mut().enumerate() {
            *b = ((off + k) % 251) as u8;
        }
    })
    .unwrap();
    assert!(calls >= 1);
    let g = GgufFile::open(&p).unwrap();
    let b = TensorSource::get(&g, "b").unwrap();
    assert_eq!(b.shape, vec![3, 64]);
    assert_eq!(b.len, 3 * 2 * 34);
    assert!(b
        .bytes()
        .iter()
        .enumerate()
        .all(|(k, &x)| x == (k % 251) as u8));
    assert_eq!(TensorSource::get(&g, "c").unwrap().bytes(), &[2u8; 8]);
    // Same layout as the in-memory writer (which zero-fills lazy tensors).
    let mem = w.to_bytes();
    let disk = std::fs::read(&p).unwrap();
    assert_eq!(mem.len(), disk.len());
}

// ---------------------------------------------------------------------------------------------
// I/O errors, paths that are not regular files, atomic writes, tokenizer ids
// ---------------------------------------------------------------------------------------------

/// The whole text an error chain prints (`{:#}` in anyhow: each message, then each source's).
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

#[test]
fn io_error_message_appears_once() {
    let s = Scratch::new("io-once");
    let p = s.path("nope.gguf");
    let e = GgufFile::open(&p).err().expect("missing file opened");
    let text = chain_text(&e);
    assert_eq!(
        text.matches("No such file or directory").count(),
        1,
        "the I/O error is repeated: {text}"
    );
    assert!(text.starts_with(&p.display().to_string()), "{text}");
    // HF: the missing config.json.
    let e = hf_err(&s.0);
    let text = chain_text(&e);
    assert_eq!(text.matches("os error 2").count(), 1, "{text}");
    assert!(text.contains("config.json"), "{text}");
}

#[test]
fn paths_that_are_not_regular_files() {
    let s = Scratch::new("not-regular");
    // A directory where a GGUF file is expected.
    let e = GgufFile::open(&s.0).err().expect("directory opened");
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert!(!e.to_string().contains("os error 19"), "{e}");
    assert_names_path(&e, &s.0);
    // A device.
    let dev = Path::new("/dev/null");
    if dev.exists() {
        let e = GgufFile::open(dev).err().expect("/dev/null opened");
        let text = chain_text(&e);
        assert!(text.contains("is not a regular file"), "{text}");
        assert!(!text.contains("No such device"), "{text}");
        assert_names_path(&e, dev);
    }
    // A virtual file that claims to be regular but cannot be mapped.
    let proc = Path::new("/proc/self/status");
    if proc.exists() {
        let e = GgufFile::open(proc)
            .err()
            .expect("/proc/self/status opened");
        let text = chain_text(&e);
        assert!(text.contains("cannot be memory-mapped"), "{text}");
        assert_eq!(text.matches("/proc/self/status").count(), 1, "{text}");
    }
    // HF: model.safetensors / config.json / the index that are directories.
    let d = hf_dir("hf-dir-weights", &[]);
    std::fs::create_dir(d.path("model.safetensors")).unwrap();
    let e = hf_err(&d.0);
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert_names_path(&e, &d.path("model.safetensors"));
    let d = hf_dir("hf-dir-config", &[("model.safetensors", two_tensors())]);
    std::fs::remove_file(d.path("config.json")).unwrap();
    std::fs::create_dir(d.path("config.json")).unwrap();
    let e = hf_err(&d.0);
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert_names_path(&e, &d.path("config.json"));
    let d = hf_dir("hf-dir-index", &[]);
    std::fs::create_dir(d.path("model.safetensors.index.json")).unwrap();
    let e = hf_err(&d.0);
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert_names_path(&e, &d.path("model.safetensors.index.json"));
}

#[test]
fn writes_to_devices_and_links_keep_them() {
    let s = Scratch::new("atomic-dev");
    // A device is written in place: it stays a device (a rename once replaced /dev/full with a
    // regular file).
    valid_writer().write(Path::new("/dev/null")).unwrap();
    {
        use std::os::unix::fs::FileTypeExt;
        let m = std::fs::metadata("/dev/null").unwrap();
        assert!(m.file_type().is_char_device());
    }
    assert!(!Path::new("/dev/null.part").exists());
    // Through a link, the file it points to is replaced and the link stays a link.
    let real = s.path("real.gguf");
    let link = s.path("link.gguf");
    std::fs::write(&real, b"old").unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    valid_writer().write(&link).unwrap();
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(GgufFile::open(&real).is_ok());
    // A dangling link: the file it names is created, the link stays.
    let missing = s.path("missing.gguf");
    let dangling = s.path("dangling.gguf");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    valid_writer().write(&dangling).unwrap();
    assert!(GgufFile::open(&missing).is_ok());
    assert!(std::fs::symlink_metadata(&dangling)
        .unwrap()
        .file_type()
        .is_symlink());
    // The replaced file keeps its permissions.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    valid_writer().write(&real).unwrap();
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    // Two writers of one target at once each write a file of their own: the target is one of
    // them, whole.
    let both = s.path("both.gguf");
    std::thread::scope(|sc| {
        for _ in 0..2 {
            sc.spawn(|| valid_writer().write(&both).unwrap());
        }
    });
    assert!(GgufFile::open(&both).is_ok());
}

#[test]
fn failed_writes_leave_the_existing_file_intact() {
    let s = Scratch::new("atomic");
    let p = s.path("keep.gguf");
    // Temporary files (`keep.gguf.PID.N.part`) left in the directory.
    let parts = || {
        std::fs::read_dir(&s.0)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".part"))
            })
            .count()
    };
    valid_writer().write(&p).unwrap();
    let good = std::fs::read(&p).unwrap();
    assert_eq!(parts(), 0, "the temporary file outlived a successful write");
    // A write interrupted half-way (here: by a panic in `fill`, after the header and the first
    // tensor went out) leaves the old file whole and removes its temporary file.
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .tensor("a", &[4], GgmlType::F32, vec![1u8; 16])
        .tensor_lazy("b", &[64, 1024], GgmlType::Q8_0);
    let mut calls = 0;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.write_streaming(&p, &mut |_, _, _| {
            calls += 1;
            panic!("interrupted");
        })
    }));
    assert!(r.is_err() && calls == 1);
    assert_eq!(
        std::fs::read(&p).unwrap(),
        good,
        "the existing file was damaged"
    );
    assert_eq!(parts(), 0, "the temporary file was left behind");
    // A target that is a directory: an error naming it, nothing written.
    let e = valid_writer()
        .write(&s.0)
        .expect_err("wrote over a directory");
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert_names_path(&e, &s.0);
    // A stale temporary file of a killed run is left alone, and the write succeeds.
    let stale = s.path(&format!("keep.gguf.{}.0.part", std::process::id()));
    std::fs::write(&stale, b"stale").unwrap();
    w.write_streaming(&p, &mut |_, _, buf| buf.fill(3)).unwrap();
    assert_eq!(parts(), 1);
    std::fs::remove_file(&stale).unwrap();
    let g = GgufFile::open(&p).unwrap();
    assert!(TensorSource::get(&g, "b")
        .unwrap()
        .bytes()
        .iter()
        .all(|&x| x == 3));
}

fn tokenizer_gguf(path: &Path, extra: &[(&str, Value)]) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in kvs() {
        w.kv(k, v);
    }
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.merges", Value::Array(vec![]));
    for (k, v) in extra {
        w.kv(k, v.clone());
    }
    w.write(path).unwrap();
    GgufFile::open(path).unwrap()
}

#[test]
fn gguf_tokenizer_special_ids_are_checked() {
    use llada_formats::tokenizer::Tokenizer;
    let s = Scratch::new("tok-ids");
    let p = s.path("t.gguf");
    // In range: loads, ids kept.
    let g = tokenizer_gguf(
        &p,
        &[
            ("tokenizer.ggml.eos_token_id", Value::U32(3)),
            ("tokenizer.ggml.bos_token_id", Value::U32(0)),
        ],
    );
    let t = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!((t.stop_ids.clone(), t.bos_id), (vec![3], Some(0)));
    assert_eq!(t.path, p);
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eot_token_id",
    ] {
        for v in [
            Value::String("3".into()),
            Value::I32(-1),
            Value::F32(1.0),
            Value::U32(4),
            Value::U64(1 << 32),
        ] {
            let g = tokenizer_gguf(&p, &[(key, v.clone())]);
            match Tokenizer::from_gguf(&g).err() {
                Some(FormatError::Metadata { key: k, path, .. }) => {
                    assert_eq!((k.as_str(), &path), (key, &p), "{key}={v:?}")
                }
                other => panic!("{key}={v:?}: expected Metadata, got {other:?}"),
            }
        }
    }
    // An empty vocabulary.
    let g = tokenizer_gguf(&p, &[("tokenizer.ggml.tokens", Value::Array(vec![]))]);
    assert!(matches!(
        Tokenizer::from_gguf(&g),
        Err(FormatError::Metadata { key, .. }) if key == "tokenizer.ggml.tokens"
    ));
}

#[test]
fn hf_tokenizer_errors_name_the_file() {
    use llada_formats::tokenizer::{ChatTemplate, Tokenizer};
    let s = Scratch::new("tok-hf");
    let p = s.path("tokenizer.json");
    let word_level = |vocab: serde_json::Value| {
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "post_processor": null, "decoder": null,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated",
                "invert": false},
            "model": {"type": "WordLevel", "unk_token": "<unk>", "vocab": vocab}
        })
        .to_string()
    };
    // An empty vocabulary: an error at load naming tokenizer.json.
    std::fs::write(&p, word_level(serde_json::json!({}))).unwrap();
    match Tokenizer::from_hf_dir(&s.0, &[], ChatTemplate::Raw) {
        Err(e @ FormatError::Tokenizer { .. }) => {
            assert!(e.to_string().contains("vocabulary is empty"), "{e}");
            assert_names_path(&e, &p);
        }
        Err(e) => panic!("expected a tokenizer error, got {e}"),
        Ok(_) => panic!("an empty vocabulary loaded"),
    }
    // No [UNK] token: encoding an unknown word fails, naming the file.
    std::fs::write(&p, word_level(serde_json::json!({"a": 0}))).unwrap();
    let t = Tokenizer::from_hf_dir(&s.0, &[], ChatTemplate::Raw).unwrap();
    assert_eq!(t.max_token_id(), Some(0));
    let e = t.encode("b").expect_err("an unknown word encoded");
    assert!(e.contains(&p.display().to_string()), "{e}");
    // tokenizer.json that is a directory.
    std::fs::remove_file(&p).unwrap();
    std::fs::create_dir(&p).unwrap();
    let e = Tokenizer::from_hf_dir(&s.0, &[], ChatTemplate::Raw)
        .err()
        .expect("a directory loaded as tokenizer.json");
    assert!(e.to_string().contains("is a directory"), "{e}");
    assert_names_path(&e, &p);
}
