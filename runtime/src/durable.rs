//! Files that must survive a crash, and where per-user files live.
//!
//! [`write_atomic`] is the one way fulcrum replaces a file it cares about (checkpoints, the
//! pipeline cache): write a temporary file beside it, fsync it, rename it over the target,
//! fsync the directory. A crash at any moment leaves either the old file or the new one,
//! never a torn mix.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` atomically and durably (see the module docs). The temporary
/// file is `path` with `.fulcrum-tmp` appended; it is removed if anything fails.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// As [`write_atomic`], with the contents written by `fill` (for large files written in
/// pieces, without assembling them in memory first).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut io::BufWriter<&File>) -> io::Result<()>,
) -> io::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".fulcrum-tmp");
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let file = File::create(&tmp)?;
        {
            let mut w = io::BufWriter::new(&file);
            fill(&mut w)?;
            w.flush()?;
        }
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir_of(path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// fsyncs the directory holding `path`, so that a rename into it is durable.
pub fn sync_dir_of(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// fulcrum's per-user cache directory: `$XDG_CACHE_HOME/fulcrum`, else `$HOME/.cache/fulcrum`,
/// else the system temporary directory's `fulcrum`.
pub fn user_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("fulcrum")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt.bin");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("ckpt.bin")]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt.bin");
        write_atomic(&path, b"old").unwrap();
        let err = write_atomic_with(&path, |w| {
            w.write_all(b"half")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk full");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert!(!dir.path().join("ckpt.bin.fulcrum-tmp").exists());
    }
}
