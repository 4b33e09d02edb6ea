//! Opening a dataset's shards for reading: `O_DIRECT` where the filesystem allows it, header
//! and length checks against the manifest before a single record is read.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{Error, RecordLoc, Result};
use crate::base::HostMemory;
use crate::format::{self, Manifest, ShardHeader, HEADER_SIZE};

/// Whether to bypass the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectMode {
    /// `O_DIRECT` unless the filesystem refuses it (tmpfs, some FUSE), then buffered, said once.
    #[default]
    Auto,
    /// `O_DIRECT` or an error.
    On,
    /// Buffered reads through the page cache.
    Off,
}

impl std::str::FromStr for DirectMode {
    type Err = crate::base::UnknownChoice;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DirectMode::Auto),
            "on" => Ok(DirectMode::On),
            "off" => Ok(DirectMode::Off),
            _ => Err(crate::base::UnknownChoice::new(
                "--direct mode",
                s,
                "auto, on or off",
            )),
        }
    }
}

/// The open shard files of one dataset, checked against its manifest.
pub struct ShardSet {
    dir: PathBuf,
    paths: Vec<PathBuf>,
    files: Vec<File>,
    headers: Vec<ShardHeader>,
    records_per_shard: u64,
    direct: bool,
    direct_note: Option<String>,
}

impl ShardSet {
    pub fn open(dir: &Path, manifest: &Manifest, mode: DirectMode) -> Result<Self> {
        match Self::open_with(dir, manifest, mode != DirectMode::Off) {
            Ok(set) => Ok(set),
            Err(OpenFailure::Io { path, source }) if is_direct_refusal(&source) => {
                if mode == DirectMode::On {
                    return Err(Error::DirectRefused { path, source });
                }
                let mut set = Self::open_with(dir, manifest, false).map_err(Error::from)?;
                set.direct_note = Some(format!(
                    "O_DIRECT refused by the filesystem holding {} ({}: {source}); using buffered reads",
                    dir.display(),
                    path.display()
                ));
                Ok(set)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn open_with(dir: &Path, manifest: &Manifest, direct: bool) -> Result<Self, OpenFailure> {
        let mut header_buf = HostMemory::zeroed(HEADER_SIZE).expect("4 KiB allocation");
        let n = manifest.shards.len();
        let mut set = ShardSet {
            dir: dir.to_owned(),
            paths: Vec::with_capacity(n),
            files: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            records_per_shard: manifest.records_per_shard as u64,
            direct,
            direct_note: None,
        };
        for i in 0..n as u32 {
            let path = manifest.shard_path(dir, i);
            let io = |source| OpenFailure::Io {
                path: path.clone(),
                source,
            };
            let mut options = OpenOptions::new();
            options.read(true);
            if direct {
                options.custom_flags(nix::libc::O_DIRECT);
            }
            if direct && direct_refusal_injected() {
                return Err(io(std::io::Error::from_raw_os_error(nix::libc::EINVAL)));
            }
            let file = options.open(&path).map_err(io)?;
            // The header is read with the same flags as the records: a filesystem that accepts
            // O_DIRECT at open but refuses the read is found here, not mid-epoch.
            let buf = header_buf.as_mut_slice();
            let got = read_full_at(&file, buf, 0).map_err(io)?;
            let header = ShardHeader::decode(&buf[..got], &path)?;
            check_against_manifest(&header, &manifest.shard_header(i), &path)?;
            let actual = file.metadata().map_err(io)?.len();
            if actual < header.file_len() {
                let expected = header.file_len();
                return Err(format::Error::Truncated {
                    path,
                    actual,
                    expected,
                }
                .into());
            }
            set.paths.push(path);
            set.files.push(file);
            set.headers.push(header);
        }
        Ok(set)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    pub fn path(&self, shard: u32) -> &Path {
        &self.paths[shard as usize]
    }

    pub fn file(&self, shard: u32) -> &File {
        &self.files[shard as usize]
    }

    pub fn raw_fds(&self) -> Vec<RawFd> {
        self.files.iter().map(|f| f.as_raw_fd()).collect()
    }

    pub fn header(&self, shard: u32) -> &ShardHeader {
        &self.headers[shard as usize]
    }

    /// Whether reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Why `O_DIRECT` is not in use although it was asked for, if so.
    pub fn direct_note(&self) -> Option<&str> {
        self.direct_note.as_deref()
    }

    /// Where global record `index` lives.
    pub fn locate(&self, index: u64) -> RecordLoc {
        let shard = (index / self.records_per_shard) as u32;
        let local = (index % self.records_per_shard) as u32;
        RecordLoc {
            shard,
            offset: self.headers[shard as usize].record_offset(local),
        }
    }

    /// The shard file and record number within it of global record `index`, for messages.
    pub fn describe(&self, index: u64) -> (PathBuf, u64) {
        let shard = (index / self.records_per_shard) as usize;
        (self.paths[shard].clone(), index % self.records_per_shard)
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
pub(super) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn check_against_manifest(
    found: &ShardHeader,
    want: &ShardHeader,
    path: &Path,
) -> format::Result<()> {
    if found == want {
        return Ok(());
    }
    let what = if found.dataset_id != want.dataset_id {
        "dataset id differs".to_owned()
    } else if found.shard_index != want.shard_index {
        format!(
            "shard index {} where {} belongs",
            found.shard_index, want.shard_index
        )
    } else if found.record_count != want.record_count {
        format!(
            "{} records, manifest says {}",
            found.record_count, want.record_count
        )
    } else {
        "image or box layout differs".to_owned()
    };
    Err(format::Error::Mismatch {
        path: path.to_owned(),
        what,
    })
}

/// Why opening failed, before `open` decides whether it was `O_DIRECT` being refused.
enum OpenFailure {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    Format(format::Error),
}

impl From<format::Error> for OpenFailure {
    fn from(e: format::Error) -> Self {
        OpenFailure::Format(e)
    }
}

impl From<OpenFailure> for Error {
    fn from(f: OpenFailure) -> Self {
        match f {
            OpenFailure::Io { path, source } => Error::Open { path, source },
            OpenFailure::Format(e) => Error::Format(e),
        }
    }
}

/// Test and fault-injection hook: `FULCRUM_FAULT_DIRECT=EINVAL` makes every `O_DIRECT` open
/// fail as on a filesystem that refuses it (tmpfs before Linux 6.6, some FUSE filesystems).
fn direct_refusal_injected() -> bool {
    std::env::var("FULCRUM_FAULT_DIRECT").is_ok_and(|v| v == "EINVAL")
}

/// EINVAL at open or at an aligned read is how Linux filesystems say "no O_DIRECT here".
fn is_direct_refusal(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(nix::libc::EINVAL)
}
