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
    write_atomic_at(path, |tmp| {
        let file = File::create(tmp)?;
        let mut w = io::BufWriter::new(&file);
        fill(&mut w)?;
        w.flush()
    })
}

/// As [`write_atomic`], with the contents written by `fill` into the file at the temporary
/// path it is given (for a library that writes files by name, such as safetensors'
/// `serialize_to_file`): then fsync, rename, fsync of the directory, as for every file here.
pub fn write_atomic_at(path: &Path, fill: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_owned();
    tmp_name.push(".fulcrum-tmp");
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        fill(&tmp)?;
        File::open(&tmp)?.sync_all()?;
        slow_rename_fault();
        fs::rename(&tmp, path)?;
        sync_dir_of(path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| explain_full_disk(e, "free some and try again (the previous file is kept)"))
}

/// `e` saying what to do when it is a full disk (`StorageFull`); other errors as they are.
pub fn explain_full_disk(e: io::Error, what_to_do: &str) -> io::Error {
    if e.kind() == io::ErrorKind::StorageFull {
        io::Error::new(
            e.kind(),
            format!("no space left on the device: {what_to_do}"),
        )
    } else {
        e
    }
}

/// Test and fault-injection hook: `FULCRUM_FAULT_SLOW_RENAME_MS=N` sleeps N ms between
/// writing the temporary file and renaming it, so that a test's SIGKILL lands inside a write.
fn slow_rename_fault() {
    if let Some(ms) = std::env::var("FULCRUM_FAULT_SLOW_RENAME_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Why [`read_bounded`] read nothing.
#[derive(Debug)]
pub enum BoundedRead {
    Io(io::Error),
    /// What the path is instead of a regular file ("a FIFO", "a character device", …).
    NotRegular(&'static str),
    /// Its size, over the limit.
    TooLarge(u64),
    /// It grew past the limit while being read.
    Grew,
}

impl std::error::Error for BoundedRead {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BoundedRead::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl std::fmt::Display for BoundedRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BoundedRead::Io(e) => write!(f, "{e}"),
            BoundedRead::NotRegular(kind) => write!(f, "is {kind}, not a regular file"),
            BoundedRead::TooLarge(len) => write!(f, "{len} bytes, more than this file may have"),
            BoundedRead::Grew => write!(f, "grew past its size limit while being read"),
        }
    }
}

/// Reads the whole of `path`, which must be a regular file (a link to one is fine) of at most
/// `max` bytes: what fulcrum does with every file an operator or a client names. The file is
/// opened without blocking and checked on its open descriptor before a byte is read, so a
/// FIFO, a device such as `/dev/zero`, a folder or an oversized file is refused at once; a
/// file that grows while it is read is refused too.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, BoundedRead> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(BoundedRead::Io)?;
    let meta = file.metadata().map_err(BoundedRead::Io)?;
    if !meta.is_file() {
        return Err(BoundedRead::NotRegular(file_kind(&meta)));
    }
    if meta.len() > max {
        return Err(BoundedRead::TooLarge(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(BoundedRead::Io)?;
    if bytes.len() as u64 > max {
        return Err(BoundedRead::Grew);
    }
    Ok(bytes)
}

/// What a file that is not a regular file is, for messages.
fn file_kind(meta: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// An exclusive claim on a folder for as long as the value lives (`flock` on `DIR/.lock`, so
/// the kernel drops it when the process dies, however it dies). Its pid is written into the
/// file for the message a second claimant gets.
#[derive(Debug)]
pub struct FolderLock {
    _lock: nix::fcntl::Flock<File>,
}

impl FolderLock {
    /// Claims `dir` (creating it), or says who holds it.
    pub fn claim(dir: &Path, what: &str) -> Result<FolderLock, LockError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| LockError::Io { path, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(".lock");
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path))?;
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                // The pid is only for messages: failing to write it does not matter.
                let _ = lock.set_len(0);
                let _ = writeln!(&mut *lock, "{}", std::process::id());
                Ok(FolderLock { _lock: lock })
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let holder = fs::read_to_string(&path).unwrap_or_default();
                let holder = holder.trim();
                Err(LockError::Held {
                    dir: dir.to_owned(),
                    what: what.to_owned(),
                    holder: if holder.is_empty() {
                        String::new()
                    } else {
                        format!(" (pid {holder})")
                    },
                })
            }
            Err((_, e)) => Err(LockError::Io {
                path,
                source: e.into(),
            }),
        }
    }
}

/// Why a folder could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is in use by another {what}{holder}: wait for it to finish, or choose another folder",
        dir.display()
    )]
    Held {
        dir: std::path::PathBuf,
        what: String,
        holder: String,
    },
}

/// A `flock` on a folder's own directory descriptor: shared by the readers of a packed
/// dataset, exclusive for `pack` while it writes or replaces one. It needs no lock file, so a
/// dataset on read-only media can still be locked, and the kernel drops it however its holder
/// dies.
#[derive(Debug)]
pub struct DirLock {
    _lock: nix::fcntl::Flock<File>,
}

impl DirLock {
    /// Locks `dir` without waiting: `Ok(None)` when another process holds a conflicting lock.
    pub fn try_lock(dir: &Path, exclusive: bool) -> io::Result<Option<DirLock>> {
        use nix::fcntl::{Flock, FlockArg};
        use std::os::unix::fs::MetadataExt;
        let arg = if exclusive {
            FlockArg::LockExclusiveNonblock
        } else {
            FlockArg::LockSharedNonblock
        };
        // A folder renamed away between the open and the lock (a `pack --force` replacing it)
        // leaves the lock on the old one: lock again whatever is at the path now.
        for _ in 0..3 {
            let lock = match Flock::lock(File::open(dir)?, arg) {
                Ok(lock) => lock,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
                Err((_, e)) => return Err(e.into()),
            };
            let (locked, now) = (lock.metadata()?, fs::metadata(dir)?);
            if (locked.dev(), locked.ino()) == (now.dev(), now.ino()) {
                return Ok(Some(DirLock { _lock: lock }));
            }
        }
        Ok(None)
    }
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
    fn dir_lock_shares_between_readers_and_excludes_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let reader = DirLock::try_lock(dir.path(), false).unwrap();
        assert!(reader.is_some());
        assert!(DirLock::try_lock(dir.path(), false).unwrap().is_some());
        assert!(DirLock::try_lock(dir.path(), true).unwrap().is_none());
        drop(reader);
        let writer = DirLock::try_lock(dir.path(), true).unwrap();
        assert!(writer.is_some());
        assert!(DirLock::try_lock(dir.path(), false).unwrap().is_none());
        drop(writer);
        assert!(DirLock::try_lock(&dir.path().join("absent"), false).is_err());
    }

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
