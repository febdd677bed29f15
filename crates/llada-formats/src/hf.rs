//! Hugging Face model directories: `config.json`, `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, and `tokenizer.json`. Weights are memory-mapped; the
//! `safetensors` crate validates each header (offsets inside the file, no overlaps).

use crate::error::FormatError;
use crate::gguf::{map_file, require_regular_file, MappedFile};
use crate::tensor::{TensorSource, TensorView};
use llada_kernels::GgmlType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An opened HF directory.
pub struct HfDir {
    pub dir: PathBuf,
    /// `config.json` as parsed JSON.
    pub config: serde_json::Value,
    tensors: BTreeMap<String, TensorView>,
    order: Vec<String>,
    /// The mapped shard files (for releasing streamed tensors).
    maps: BTreeMap<PathBuf, Arc<MappedFile>>,
}

fn dtype_to_ggml(d: safetensors::Dtype) -> Option<GgmlType> {
    match d {
        safetensors::Dtype::F32 => Some(GgmlType::F32),
        safetensors::Dtype::F16 => Some(GgmlType::F16),
        safetensors::Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// A (JSON) text file, which must be a regular file.
pub fn read_text(path: &Path) -> Result<String, FormatError> {
    require_regular_file(path)?;
    std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))
}

impl HfDir {
    /// Open `dir` (must hold `config.json` and safetensors weights).
    pub fn open(dir: &Path) -> Result<Self, FormatError> {
        let cfg_path = dir.join("config.json");
        let text = read_text(&cfg_path)?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| FormatError::corrupt(&cfg_path, format!("invalid JSON: {e}")))?;
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = read_text(&index)?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| FormatError::corrupt(&index, format!("invalid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| FormatError::metadata(&index, "weight_map", " is missing"))?;
            let mut files: Vec<String> = map
                .values()
                .filter_map(|f| f.as_str().map(String::from))
                .collect();
            files.sort();
            files.dedup();
            for f in &files {
                if f.contains('/') || f.contains('\\') || f.contains("..") {
                    return Err(FormatError::corrupt(
                        &index,
                        format!("shard name '{f}' is not a plain file name"),
                    ));
                }
            }
            files.into_iter().map(|f| dir.join(f)).collect()
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(FormatError::io(
                    &single,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no model.safetensors or model.safetensors.index.json",
                    ),
                ));
            }
            vec![single]
        };
        let mut tensors = BTreeMap::new();
        let mut order = Vec::new();
        let mut maps = BTreeMap::new();
        for f in files {
            let map: Arc<MappedFile> = map_file(&f)?;
            maps.insert(f.clone(), map.clone());
            let buf: &[u8] = (*map).as_ref();
            let st = safetensors::SafeTensors::deserialize(buf)
                .map_err(|e| FormatError::corrupt(&f, format!("invalid safetensors: {e}")))?;
            for (name, view) in st.tensors() {
                let ty =
                    dtype_to_ggml(view.dtype()).ok_or_else(|| FormatError::UnsupportedType {
                        path: f.clone(),
                        tensor: name.clone(),
                        ty: format!("{:?}", view.dtype()),
                    })?;
                let data = view.data();
                let offset = data.as_ptr() as usize - buf.as_ptr() as usize;
                let tv = TensorView {
                    name: name.clone(),
                    ty,
                    shape: view.shape().to_vec(),
                    owner: map.clone(),
                    offset,
                    len: data.len(),
                    file: f.clone(),
                };
                if tensors.insert(name.clone(), tv).is_some() {
                    return Err(FormatError::corrupt(
                        &f,
                        format!("tensor '{name}' appears in two shards"),
                    ));
                }
                order.push(name);
            }
        }
        order.sort();
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            tensors,
            order,
            maps,
        })
    }

    /// `config.json` path (for error messages).
    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }
}

impl TensorSource for HfDir {
    fn get(&self, name: &str) -> Option<TensorView> {
        self.tensors.get(name).cloned()
    }
    fn names(&self) -> Vec<String> {
        self.order.clone()
    }
    fn path(&self) -> &Path {
        &self.dir
    }
    fn release(&self, name: &str) {
        if let Some(v) = self.tensors.get(name) {
            if let Some(m) = self.maps.get(&v.file) {
                m.release_range(v.offset, v.len);
            }
        }
    }
}
