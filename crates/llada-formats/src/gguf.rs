//! GGUF v3 (and v2) reader over a memory map.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, metadata key/values,
//! tensor infos (name, n_dims, dims innermost-first, type, offset), padding to
//! `general.alignment`, tensor data. Every count, length and offset is checked against the file
//! size before use, so truncated or hostile files give a [`FormatError`], never a panic.

use crate::error::FormatError;
use crate::tensor::{TensorSource, TensorView};
use llada_kernels::{ByteOwner, GgmlType};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Integer value of any integer type (non-negative).
    pub fn as_u64(&self) -> Option<u64> {
        Some(match *self {
            Value::U8(v) => v as u64,
            Value::U16(v) => v as u64,
            Value::U32(v) => v as u64,
            Value::U64(v) => v,
            Value::I8(v) if v >= 0 => v as u64,
            Value::I16(v) if v >= 0 => v as u64,
            Value::I32(v) if v >= 0 => v as u64,
            Value::I64(v) if v >= 0 => v as u64,
            _ => return None,
        })
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => self.as_u64().map(|v| v != 0),
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Memory map that owns the file's bytes.
pub struct MappedFile(memmap2::Mmap, std::fs::File);
impl AsRef<[u8]> for MappedFile {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl MappedFile {
    /// Drop `[offset, offset + len)` from this process's mapping and from the page cache, so
    /// the next access is a real storage read (streamed weights under a memory budget).
    pub fn release_range(&self, offset: usize, len: usize) {
        let page = 4096;
        let start = offset / page * page;
        let end = (offset + len).min(self.0.len());
        if end <= start {
            return;
        }
        // SAFETY: the mapping is read-only and file-backed: after MADV_DONTNEED the pages are
        // re-read from the file on the next access, so no data is lost and no reference into
        // the range is invalidated.
        unsafe {
            let _ = self.0.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start,
                end - start,
            );
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor; advisory only.
            unsafe {
                libc::posix_fadvise(
                    self.1.as_raw_fd(),
                    start as libc::off_t,
                    (end - start) as libc::off_t,
                    libc::POSIX_FADV_DONTNEED,
                );
            }
        }
    }
}

/// `Ok` when `path` is a regular file; else an error that says what it is instead (a directory,
/// a device, a FIFO …). Checked before opening: opening a FIFO would block.
pub fn require_regular_file(path: &Path) -> Result<std::fs::Metadata, FormatError> {
    use std::io::{Error, ErrorKind};
    let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(meta);
    }
    if ft.is_dir() {
        return Err(FormatError::io(
            path,
            Error::new(ErrorKind::IsADirectory, "is a directory, not a file"),
        ));
    }
    #[cfg(unix)]
    let what = {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a special file"
        }
    };
    #[cfg(not(unix))]
    let what = "a special file";
    Err(FormatError::io(
        path,
        Error::new(
            ErrorKind::InvalidInput,
            format!("is not a regular file (it is {what})"),
        ),
    ))
}

/// Map `path` read-only (it must be a regular file).
pub fn map_file(path: &Path) -> Result<Arc<MappedFile>, FormatError> {
    require_regular_file(path)?;
    let f = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
    // SAFETY: the map is read-only; we accept that another process truncating the file while we
    // run is outside our guarantees (as every mmap-based loader does).
    let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| {
        // Virtual files (/proc, /sys) claim to be regular files but cannot be mapped (ENODEV).
        #[cfg(unix)]
        let virtual_file = e.raw_os_error() == Some(libc::ENODEV);
        #[cfg(not(unix))]
        let virtual_file = false;
        let msg = if virtual_file {
            "is not a regular file on disk (a virtual or special file): it cannot be memory-mapped"
                .to_string()
        } else {
            format!("cannot be memory-mapped: {e}")
        };
        FormatError::io(path, std::io::Error::new(e.kind(), msg))
    })?;
    Ok(Arc::new(MappedFile(m, f)))
}

/// One tensor's entry in the GGUF header.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions as stored (innermost first, ggml's `ne`).
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub len: u64,
}

/// A parsed GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Tensor names in file order.
    pub order: Vec<String>,
    pub data_offset: u64,
    map: Arc<MappedFile>,
}

const MAX_DIMS: u32 = 4;
const MAX_COUNT: u64 = 1 << 24;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], FormatError> {
        let end = (self.pos as u64).checked_add(n);
        match end {
            Some(end) if end <= self.buf.len() as u64 => {
                let s = &self.buf[self.pos..end as usize];
                self.pos = end as usize;
                Ok(s)
            }
            _ => Err(FormatError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset: self.pos as u64,
                len: self.buf.len() as u64,
            }),
        }
    }
    fn u32(&mut self, what: &str) -> Result<u32, FormatError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, FormatError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self, what: &str) -> Result<String, FormatError> {
        let n = self.u64(what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| FormatError::corrupt(self.path, format!("{what} is not valid UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, FormatError> {
        let what = format!("value of '{key}'");
        Ok(match ty {
            0 => Value::U8(self.take(1, &what)?[0]),
            1 => Value::I8(self.take(1, &what)?[0] as i8),
            2 => {
                let b = self.take(2, &what)?;
                Value::U16(u16::from_le_bytes([b[0], b[1]]))
            }
            3 => {
                let b = self.take(2, &what)?;
                Value::I16(i16::from_le_bytes([b[0], b[1]]))
            }
            4 => Value::U32(self.u32(&what)?),
            5 => Value::I32(self.u32(&what)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(&what)?)),
            7 => Value::Bool(self.take(1, &what)?[0] != 0),
            8 => Value::String(self.string(&what)?),
            9 => {
                if depth > 2 {
                    return Err(FormatError::corrupt(
                        self.path,
                        format!("'{key}': arrays nested too deeply"),
                    ));
                }
                let et = self.u32(&what)?;
                let n = self.u64(&what)?;
                // No real metadata array comes near MAX_COUNT elements; a larger count (even one a
                // huge sparse file could back) would only make us allocate without bound.
                if n > MAX_COUNT {
                    return Err(FormatError::corrupt(
                        self.path,
                        format!("array '{key}' claims an absurd {n} elements"),
                    ));
                }
                // Every element takes at least one byte: a count beyond the bytes left is corrupt.
                let left = (self.buf.len() - self.pos) as u64;
                if n > left {
                    return Err(FormatError::Truncated {
                        path: self.path.to_path_buf(),
                        what: format!("array '{key}' of {n} elements"),
                        offset: self.pos as u64,
                        len: self.buf.len() as u64,
                    });
                }
                let mut v = Vec::with_capacity(n.min(4096) as usize);
                for _ in 0..n {
                    v.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(&what)?),
            11 => Value::I64(self.u64(&what)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(&what)?)),
            t => {
                return Err(FormatError::corrupt(
                    self.path,
                    format!("metadata '{key}' has unknown value type {t}"),
                ))
            }
        })
    }
}

impl GgufFile {
    /// Open and validate a GGUF file.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let map = map_file(path)?;
        Self::parse(path, map)
    }

    fn parse(path: &Path, map: Arc<MappedFile>) -> Result<Self, FormatError> {
        let buf: &[u8] = (*map).as_ref();
        let mut r = Reader { buf, pos: 0, path };
        let magic = r.take(4, "magic").map_err(|_| FormatError::BadMagic {
            path: path.to_path_buf(),
            magic: buf[..buf.len().min(4)].to_vec(),
        })?;
        if magic != b"GGUF" {
            return Err(FormatError::BadMagic {
                path: path.to_path_buf(),
                magic: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(FormatError::BadVersion {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        if n_tensors > MAX_COUNT || n_kv > MAX_COUNT {
            return Err(FormatError::corrupt(
                path,
                format!("absurd header counts: {n_tensors} tensors, {n_kv} metadata entries"),
            ));
        }
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&format!("type of '{key}'"))?;
            let v = r.value(ty, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut infos = Vec::with_capacity(n_tensors.min(4096) as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor name #{i}"))?;
            let nd = r.u32(&format!("n_dims of '{name}'"))?;
            if nd == 0 || nd > MAX_DIMS {
                return Err(FormatError::corrupt(
                    path,
                    format!("tensor '{name}' has {nd} dimensions"),
                ));
            }
            let mut ne = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                ne.push(r.u64(&format!("dims of '{name}'"))?);
            }
            let tid = r.u32(&format!("type of '{name}'"))?;
            let off = r.u64(&format!("offset of '{name}'"))?;
            infos.push((name, ne, tid, off));
        }
        let align = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 16 => a,
                _ => {
                    return Err(FormatError::metadata(
                        path,
                        "general.alignment",
                        ": not a power of two",
                    ))
                }
            },
        };
        let data_offset = (r.pos as u64).next_multiple_of(align);
        let file_len = buf.len() as u64;
        if data_offset > file_len && n_tensors > 0 {
            return Err(FormatError::Truncated {
                path: path.to_path_buf(),
                what: "tensor data section".into(),
                offset: data_offset,
                len: file_len,
            });
        }
        let mut tensors = BTreeMap::new();
        let mut order = Vec::new();
        for (name, ne, tid, off) in infos {
            let ty = GgmlType::from_id(tid).ok_or_else(|| FormatError::UnsupportedType {
                path: path.to_path_buf(),
                tensor: name.clone(),
                ty: format!("ggml type id {tid}"),
            })?;
            let numel = ne
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n > 0 && n < 1 << 40)
                .ok_or_else(|| {
                    FormatError::corrupt(
                        path,
                        format!("tensor '{name}' has absurd dimensions {ne:?}"),
                    )
                })?;
            if ne[0] % ty.block_elems() as u64 != 0 {
                return Err(FormatError::corrupt(
                    path,
                    format!(
                        "tensor '{name}': row length {} is not a multiple of the {ty} block size",
                        ne[0]
                    ),
                ));
            }
            let len = ty.bytes_for(numel).ok_or_else(|| {
                FormatError::corrupt(path, format!("tensor '{name}' size overflows"))
            })?;
            if off % align != 0 {
                return Err(FormatError::corrupt(
                    path,
                    format!("tensor '{name}' offset {off} is not aligned to {align}"),
                ));
            }
            let abs = data_offset.checked_add(off);
            let end = abs.and_then(|a| a.checked_add(len));
            match (abs, end) {
                (Some(abs), Some(end)) if end <= file_len => {
                    if tensors.contains_key(&name) {
                        return Err(FormatError::corrupt(
                            path,
                            format!("duplicate tensor '{name}'"),
                        ));
                    }
                    order.push(name.clone());
                    tensors.insert(
                        name.clone(),
                        TensorInfo {
                            name,
                            ne,
                            ty,
                            offset: abs,
                            len,
                        },
                    );
                }
                _ => {
                    return Err(FormatError::Truncated {
                        path: path.to_path_buf(),
                        what: format!("data of tensor '{name}' ({len} bytes at data offset {off})"),
                        offset: data_offset.saturating_add(off),
                        len: file_len,
                    })
                }
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            order,
            data_offset,
            map,
        })
    }

    /// A metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
    /// A required unsigned integer.
    pub fn get_u64(&self, key: &str) -> Result<u64, FormatError> {
        self.get(key)
            .ok_or_else(|| FormatError::metadata(&self.path, key, " is missing"))?
            .as_u64()
            .ok_or_else(|| FormatError::metadata(&self.path, key, ": not an unsigned integer"))
    }
    /// A required float.
    pub fn get_f64(&self, key: &str) -> Result<f64, FormatError> {
        self.get(key)
            .ok_or_else(|| FormatError::metadata(&self.path, key, " is missing"))?
            .as_f64()
            .ok_or_else(|| FormatError::metadata(&self.path, key, ": not a number"))
    }
    /// A required string.
    pub fn get_str(&self, key: &str) -> Result<&str, FormatError> {
        self.get(key)
            .ok_or_else(|| FormatError::metadata(&self.path, key, " is missing"))?
            .as_str()
            .ok_or_else(|| FormatError::metadata(&self.path, key, ": not a string"))
    }
    /// The architecture name (`general.architecture`).
    pub fn architecture(&self) -> Result<&str, FormatError> {
        self.get_str("general.architecture")
    }
    /// The owner of the mapped bytes.
    pub fn owner(&self) -> ByteOwner {
        self.map.clone()
    }
}

impl TensorSource for GgufFile {
    fn release(&self, name: &str) {
        if let Some(v) = TensorSource::get(self, name) {
            self.map.release_range(v.offset, v.len);
        }
    }
    fn get(&self, name: &str) -> Option<TensorView> {
        let t = self.tensors.get(name)?;
        Some(TensorView {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.ne.iter().rev().map(|&d| d as usize).collect(),
            owner: self.owner(),
            offset: t.offset as usize,
            len: t.len as usize,
            file: self.path.clone(),
        })
    }
    fn names(&self) -> Vec<String> {
        self.order.clone()
    }
    fn path(&self) -> &Path {
        &self.path
    }
}

/// A minimal GGUF writer (F32/F16/quantized tensors, scalar/string/array metadata), used by
/// `llada synth` and by tests that build hostile files.
pub struct GgufWriter {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    /// (tensor index, bytes) of tensors filled at write time.
    lazy: Vec<(usize, usize)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self {
            kv: Vec::new(),
            tensors: Vec::new(),
            lazy: Vec::new(),
        }
    }
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kv.push((key.to_string(), v));
        self
    }
    /// Add a tensor with row-major `shape` (outermost first) and raw bytes of type `ty`.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> &mut Self {
        let ne = shape.iter().rev().map(|&d| d as u64).collect();
        self.tensors.push((name.to_string(), ne, ty, data));
        self
    }
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }
    fn put_val(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => Self::put_str(out, s),
            Value::Array(a) => {
                // An empty array has no element to take the type from: GGUF's empty arrays are
                // string lists (a tokenizer's merges, added tokens), and strict readers check it.
                let et = a.first().map(Self::type_id).unwrap_or(8);
                out.extend(et.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for e in a {
                    Self::put_val(out, e);
                }
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
        }
    }
    /// Add a tensor whose bytes are produced at write time by [`GgufWriter::write_streaming`]'s
    /// `fill` (multi-GB synthetic models never sit in memory).
    pub fn tensor_lazy(&mut self, name: &str, shape: &[usize], ty: GgmlType) -> &mut Self {
        let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let n: u64 = ne.iter().product();
        let bytes = ty.bytes_for(n).unwrap_or(0) as usize;
        self.lazy.push((self.tensors.len(), bytes));
        self.tensors.push((name.to_string(), ne, ty, Vec::new()));
        self
    }
    fn data_len(&self, i: usize) -> usize {
        self.lazy
            .iter()
            .find(|(j, _)| *j == i)
            .map(|(_, b)| *b)
            .unwrap_or(self.tensors[i].3.len())
    }
    /// Header (metadata, tensor infos, padding) of the file.
    fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            Self::put_str(&mut out, k);
            out.extend(Self::type_id(v).to_le_bytes());
            Self::put_val(&mut out, v);
        }
        let mut off = 0u64;
        for (i, (name, ne, ty, _)) in self.tensors.iter().enumerate() {
            Self::put_str(&mut out, name);
            out.extend((ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.id().to_le_bytes());
            out.extend(off.to_le_bytes());
            off = (off + self.data_len(i) as u64).next_multiple_of(32);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        out
    }
    /// Serialize to bytes (alignment 32); lazy tensors are zero-filled.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = self.header();
        for (i, (_, _, _, data)) in self.tensors.iter().enumerate() {
            out.extend(data);
            out.resize(out.len() + self.data_len(i) - data.len(), 0);
            out.resize(out.len().next_multiple_of(32), 0);
        }
        out
    }
    /// Write to `path`, asking `fill(tensor_index, chunk_offset, buf)` for the bytes of lazy
    /// tensors chunk by chunk. Atomic (see [`crate::atomic`]): an existing `path` is replaced
    /// only once the whole file is written.
    pub fn write_streaming(
        &self,
        path: &Path,
        fill: &mut dyn FnMut(usize, usize, &mut [u8]),
    ) -> Result<(), FormatError> {
        crate::atomic::write_with(path, |w| {
            let header = self.header();
            w.write_all(&header)?;
            let mut pos = header.len();
            let mut buf = vec![0u8; 1 << 22];
            for (i, (_, _, ty, data)) in self.tensors.iter().enumerate() {
                let len = self.data_len(i);
                if data.len() == len {
                    w.write_all(data)?;
                } else {
                    // Chunks are whole quant blocks.
                    let step =
                        (buf.len() / ty.block_bytes().max(1)).max(1) * ty.block_bytes().max(1);
                    let mut done = 0;
                    while done < len {
                        let n = step.min(len - done);
                        fill(i, done, &mut buf[..n]);
                        w.write_all(&buf[..n])?;
                        done += n;
                    }
                }
                pos += len;
                let pad = pos.next_multiple_of(32) - pos;
                w.write_all(&[0u8; 32][..pad])?;
                pos += pad;
            }
            Ok(())
        })
    }
    /// Write to `path` (atomically, like [`Self::write_streaming`]), asking
    /// `write_tensor(i, w)` to write the whole data of each lazy tensor `i` in turn (tensors
    /// converted one at a time). Writing more or fewer bytes than the tensor's size is an
    /// error (the file would be corrupt), as is any error `write_tensor` returns; either way
    /// no file is left under `path`.
    pub fn write_tensors(
        &self,
        path: &Path,
        write_tensor: &mut dyn FnMut(usize, &mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(), FormatError> {
        /// Counts what passes through.
        struct Counting<'a>(&'a mut dyn Write, u64);
        impl Write for Counting<'_> {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let n = self.0.write(b)?;
                self.1 += n as u64;
                Ok(n)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                self.0.flush()
            }
        }
        crate::atomic::write_with(path, |w| {
            let header = self.header();
            w.write_all(&header)?;
            let mut pos = header.len();
            for (i, (name, _, _, data)) in self.tensors.iter().enumerate() {
                let len = self.data_len(i);
                if data.len() == len {
                    w.write_all(data)?;
                } else {
                    let mut c = Counting(w, 0);
                    write_tensor(i, &mut c)?;
                    if c.1 != len as u64 {
                        return Err(std::io::Error::other(format!(
                            "tensor '{name}': {} bytes written, its type and shape make {len}",
                            c.1
                        )));
                    }
                }
                pos += len;
                let pad = pos.next_multiple_of(32) - pos;
                w.write_all(&[0u8; 32][..pad])?;
                pos += pad;
            }
            Ok(())
        })
    }
    /// Size in bytes of the file [`Self::write`] would write.
    pub fn file_len(&self) -> u64 {
        let mut n = self.header().len() as u64;
        for i in 0..self.tensors.len() {
            n = (n + self.data_len(i) as u64).next_multiple_of(32);
        }
        n
    }
    /// Write to `path` (atomically, like [`Self::write_streaming`]).
    pub fn write(&self, path: &Path) -> Result<(), FormatError> {
        let bytes = self.to_bytes();
        crate::atomic::write_with(path, |w| w.write_all(&bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor written short, or a writer's error, fails the write and leaves the file that
    /// was there untouched; a complete write reads back.
    #[test]
    fn write_tensors_is_checked_and_atomic() {
        let dir = std::env::temp_dir().join(format!("llada-wt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.gguf");
        std::fs::write(&p, b"old").unwrap();
        let mut w = GgufWriter::new();
        w.kv("general.architecture", Value::String("llama".into()));
        w.tensor_lazy("a", &[2, 32], GgmlType::Q8_0);
        let short = w.write_tensors(&p, &mut |_, s| s.write_all(&[0u8; 34]));
        assert!(short.unwrap_err().to_string().contains("34 bytes written"));
        let failed = w.write_tensors(&p, &mut |_, _| Err(std::io::Error::other("boom")));
        assert!(failed.unwrap_err().to_string().contains("boom"));
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        w.write_tensors(&p, &mut |_, s| s.write_all(&[0u8; 68]))
            .unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), w.file_len());
        let g = GgufFile::open(&p).unwrap();
        assert_eq!(g.tensors["a"].len, 68);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
