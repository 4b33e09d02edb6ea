use std::path::PathBuf;

/// Errors of dataset import and image decoding: each names the file and says what to do.
///
/// Problems with single label lines or objects are not errors: importers skip them and list
/// them in [`ImportNotes`](super::source::ImportNotes). These variants are for problems that
/// leave nothing sensible to import.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{dir}: no images (*.jpg, *.jpeg, *.png) found; point at the dataset folder (the one holding data.yaml, or images/ and labels/)")]
    NoImages { dir: PathBuf },
    #[error(
        "{path}: bad data.yaml: {what}; fix the file (keys: path, train, val, test, names, nc)"
    )]
    BadDataYaml { path: PathBuf, what: String },
    #[error("{path}: bad Pascal VOC annotation: {what}")]
    BadVoc { path: PathBuf, what: String },
    #[error("{path}: bad COCO JSON: {what}")]
    BadCoco { path: PathBuf, what: String },
    #[error("{path}: cannot decode image: {what} (re-save it as a JPEG or PNG of sensible size, or leave it out)")]
    UnreadableImage { path: PathBuf, what: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a dataset this importer understands: looked for {what_we_looked_for}")]
    NotADataset {
        path: PathBuf,
        what_we_looked_for: String,
    },
    #[error("{path} already exists; pass --force to replace it, or choose another --out")]
    OutputExists { path: PathBuf },
    #[error("{path} is being read by another process (training, eval, inspect, load or a fine-tune); stop it first, or pack to another --out")]
    OutputInUse { path: PathBuf },
    #[error("{path} is being written by another `fulcrum pack`; wait for it to finish, or choose another --out")]
    OutputBeingPacked { path: PathBuf },
    #[error("{what}: nothing to pack")]
    Empty { what: String },
    #[error("bad pack option: {0}")]
    BadOption(String),
    /// `--size` and `--max-boxes` make no record layout.
    #[error("--size / --max-boxes: {0}")]
    Layout(#[from] crate::format::LayoutError),
    #[error("{dir}: split {split:?} asked for, but this YOLO dataset has no data.yaml and so no splits; leave the split out, or add a data.yaml naming the split folders")]
    NoSplits { dir: PathBuf, split: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source: crate::durable::explain_full_disk(
                source,
                "free some, or pack to another --out (nothing was left behind)",
            ),
        }
    }
}
