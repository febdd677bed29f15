//! Atomic file writes: the bytes go to a temporary file next to the target (`FILE.part`), which
//! is renamed over the target only once it is completely written and synced. An interrupted or
//! failed write never leaves a truncated target, nor destroys a good file already there; on an
//! error (or a panic while writing) the temporary file is removed. A process killed mid-write
//! leaves only `FILE.part`, which the next write of the same target overwrites.

use crate::error::FormatError;
use std::fs::File;
use std::io::{BufWriter, Error, ErrorKind};
use std::path::{Path, PathBuf};

/// The temporary file [`write_with`] writes `target` through: `target` with `.part` appended.
pub fn part_path(target: &Path) -> Result<PathBuf, FormatError> {
    let name = target.file_name().ok_or_else(|| {
        FormatError::io(
            target,
            Error::new(ErrorKind::InvalidInput, "is not a file name to write to"),
        )
    })?;
    let mut part = name.to_os_string();
    part.push(".part");
    Ok(target.with_file_name(part))
}

/// Removes the temporary file unless the write was committed.
struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Write `target` atomically: `write` fills a buffered writer on the temporary file; errors name
/// `target`.
pub fn write_with<F>(target: &Path, write: F) -> Result<(), FormatError>
where
    F: FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
{
    let err = |e: Error| FormatError::io(target, e);
    if target.is_dir() {
        return Err(err(Error::new(
            ErrorKind::IsADirectory,
            "is a directory, not a file to write",
        )));
    }
    // A device or a pipe (`-o /dev/null`) is written in place: a rename would replace the
    // device node with a regular file (it did, for /dev/full).
    if std::fs::metadata(target).is_ok_and(|m| !m.is_file()) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(target)
            .map_err(err)?;
        let mut w = BufWriter::with_capacity(1 << 22, file);
        write(&mut w).map_err(err)?;
        w.into_inner().map_err(|e| err(e.into_error()))?;
        return Ok(());
    }
    // Through a symbolic link to an existing file, that file is replaced, not the link.
    let resolved = std::fs::symlink_metadata(target)
        .is_ok_and(|m| m.file_type().is_symlink())
        .then(|| std::fs::canonicalize(target).ok())
        .flatten();
    let target = resolved.as_deref().unwrap_or(target);
    let part = part_path(target)?;
    let file = File::create(&part).map_err(|e| {
        err(Error::new(
            e.kind(),
            format!("cannot create {}: {e}", part.display()),
        ))
    })?;
    let mut cleanup = Cleanup(Some(part.clone()));
    let mut w = BufWriter::with_capacity(1 << 22, file);
    write(&mut w).map_err(err)?;
    let file = w.into_inner().map_err(|e| err(e.into_error()))?;
    file.sync_all().map_err(err)?;
    drop(file);
    std::fs::rename(&part, target).map_err(err)?;
    cleanup.0 = None;
    Ok(())
}
