use std::path::PathBuf;

/// Errors of the shard format: each names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: not a fulcrum shard (bad magic); was it written by `fulcrum pack`?")]
    BadMagic { path: PathBuf },
    #[error("{path}: shard format version {found}, this fulcrum reads version {expected}; re-pack the dataset with this version of `fulcrum pack`")]
    BadVersion {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{path}: corrupt shard header ({what}); re-pack the dataset")]
    BadHeader { path: PathBuf, what: String },
    #[error("{path}: truncated: {actual} bytes, the header promises {expected}; the file was cut short (disk full or an interrupted copy?); re-pack or copy it again")]
    Truncated {
        path: PathBuf,
        actual: u64,
        expected: u64,
    },
    #[error("{path}: shard does not match the manifest ({what}); the dataset directory mixes files from different packs; re-pack it")]
    Mismatch { path: PathBuf, what: String },
    #[error("{path}: bad manifest: {what}")]
    BadManifest { path: PathBuf, what: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
