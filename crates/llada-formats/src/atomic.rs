//! Atomic file writes: the bytes go to a temporary file next to the target
//! (`FILE.PID.N.part`, unique to the writer), which is renamed over the target only once it is
//! completely written and synced. An interrupted or failed write never leaves a truncated
//! target, nor destroys a good file already there; on an error (or a panic while writing) the
//! temporary file is removed. A process killed mid-write leaves only its `.part` file.

use crate::error::FormatError;
use std::fs::File;
use std::io::{BufWriter, Error, ErrorKind};
use std::path::{Path, PathBuf};

/// A fresh temporary file next to `target`: `target` with `.PID.N.part` appended, created
/// exclusively, so two writers of one target (two `llada synth -o` runs, two processes filling
/// one cache entry) never write into the same file.
fn create_part(target: &Path) -> Result<(PathBuf, File), FormatError> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = target.file_name().ok_or_else(|| {
        FormatError::io(
            target,
            Error::new(ErrorKind::InvalidInput, "is not a file name to write to"),
        )
    })?;
    loop {
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut part = name.to_os_string();
        part.push(format!(".{}.{n}.part", std::process::id()));
        let part = target.with_file_name(part);
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&part)
        {
            Ok(f) => return Ok((part, f)),
            // Left by a killed process of the same pid: take the next number.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(FormatError::io(
                    target,
                    Error::new(e.kind(), format!("cannot create {}: {e}", part.display())),
                ))
            }
        }
    }
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

/// `write` through a buffer into `file`, flushed; the file back.
fn fill<F>(file: File, write: F) -> std::io::Result<File>
where
    F: FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
{
    let mut w = BufWriter::with_capacity(1 << 22, file);
    write(&mut w)?;
    w.into_inner().map_err(|e| e.into_error())
}

/// Write `bytes` to `target` atomically ([`write_with`]).
pub fn write(target: &Path, bytes: &[u8]) -> Result<(), FormatError> {
    write_with(target, |w| std::io::Write::write_all(w, bytes))
}

/// Write `target` atomically: `write` fills a buffered writer on the temporary file; errors name
/// `target`. A device or a pipe is written in place; through a symbolic link, the file it points
/// to is replaced (created, for a dangling link); an existing file's permissions are kept.
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
        return fill(file, write).map(drop).map_err(err);
    }
    // Through a symbolic link, the file it points to is replaced (or created), not the link.
    let mut real = target.to_path_buf();
    for _ in 0..40 {
        match std::fs::read_link(&real) {
            Ok(to) => real = real.parent().map_or(to.clone(), |d| d.join(&to)),
            Err(_) => break,
        }
    }
    let target = real.as_path();
    let (part, file) = create_part(target)?;
    let mut cleanup = Cleanup(Some(part.clone()));
    if let Ok(m) = std::fs::metadata(target) {
        file.set_permissions(m.permissions()).map_err(err)?;
    }
    let file = fill(file, write).map_err(err)?;
    file.sync_all().map_err(err)?;
    drop(file);
    std::fs::rename(&part, target).map_err(err)?;
    cleanup.0 = None;
    Ok(())
}
