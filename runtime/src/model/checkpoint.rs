//! Checkpoints: weights, optimizer state and where training stood, in one safetensors file.
//!
//! Tensors are `F32`, named as the model's parameters (`stem.weight`, …) with the AdamW
//! moments as `adam.m.NAME` and `adam.v.NAME` and the weight average (EMA) as `ema.NAME`
//! (all three absent in a weights-only file). `NAME` holds the last step's weights, which
//! training resumes from; evaluation, inference, serving and export use the average where the
//! file has one ([`Checkpoint::weight`]). The safetensors header's metadata holds, as JSON
//! strings:
//!
//! - `fulcrum.format`: `"1"`;
//! - `fulcrum.model`: the [`ModelConfig`];
//! - `fulcrum.progress`: [`Progress`] (seed, epoch, step, …), what resume needs besides the
//!   tensors — the epoch order is a pure function of (seed, epoch);
//! - `fulcrum.train`: the training configuration, as the trainer wrote it (opaque here);
//! - `fulcrum.classes`: the class names, when the dataset has them.
//!
//! Files are written with [`crate::durable::write_atomic`]: a crash while saving leaves the
//! previous checkpoint intact.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};

use crate::model::ModelConfig;

const FORMAT: &str = "1";

/// Where training stood when the checkpoint was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Progress {
    pub seed: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// Optimizer steps taken (AdamW's step count).
    pub step: u64,
    /// Batches of the current epoch already trained (0 at an epoch boundary).
    pub batch_in_epoch: u64,
}

/// Errors reading or writing a checkpoint; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a safetensors file ({detail})")]
    Format { path: PathBuf, detail: String },
    #[error("{path}: {detail}")]
    Content { path: PathBuf, detail: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a checkpoint's tensors could not be put into an engine.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the checkpoint has no tensor {0:?}")]
    MissingTensor(String),
    #[error("checkpoint tensor {name:?} has {got} values; the model's has {want}")]
    WrongLength {
        name: String,
        got: usize,
        want: usize,
    },
    #[error(transparent)]
    Exec(#[from] crate::compute::exec::Error),
}

/// The largest file a checkpoint of any model this build can describe may be: the widest,
/// deepest three-level model with the most classes, with its AdamW moments and its average
/// (four f32 values a parameter), plus room for the header. Anything larger is not a
/// checkpoint, and is refused before a byte of it is read.
pub fn max_file_bytes() -> u64 {
    static BOUND: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BOUND.get_or_init(|| {
        let widest = ModelConfig {
            name: "det-l".into(),
            width: ModelConfig::MAX_WIDTH,
            depth: ModelConfig::MAX_DEPTH,
            levels: 3,
            input: ModelConfig::MAX_INPUT,
            classes: ModelConfig::MAX_CLASSES,
        };
        let params: u64 = crate::model::Arch::new(&widest)
            .params()
            .iter()
            .map(|p| p.len() as u64)
            .sum();
        params * 4 * 4 + HEADER_ROOM
    })
}

/// Room for a safetensors header: the tensor table, the class names and the training
/// configuration.
const HEADER_ROOM: u64 = 16 << 20;

/// Reads the whole of `path` as a checkpoint: a regular file of at most `max` bytes
/// ([`crate::durable::read_bounded`]).
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    use crate::durable::BoundedRead;
    crate::durable::read_bounded(path, max).map_err(|e| match e {
        BoundedRead::Io(source) => Error::Io {
            path: path.to_path_buf(),
            source,
        },
        BoundedRead::NotRegular(kind) => Error::Content {
            path: path.to_path_buf(),
            detail: format!("is {kind}, not a regular file: give the path of a checkpoint file"),
        },
        BoundedRead::TooLarge(len) => Error::Content {
            path: path.to_path_buf(),
            detail: format!(
                "{len} bytes, more than any fulcrum checkpoint can be ({max}): not a checkpoint"
            ),
        },
        BoundedRead::Grew => Error::Content {
            path: path.to_path_buf(),
            detail: format!("grew past {max} bytes while being read: not a checkpoint"),
        },
    })
}

/// A checkpoint in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub model: ModelConfig,
    pub progress: Progress,
    /// The trainer's configuration (JSON), stored as is.
    pub train: Option<serde_json::Value>,
    pub classes: Vec<String>,
    /// `(name, shape, values)`, in the order given (the file itself is sorted by name).
    pub tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Checkpoint {
    /// An untrained model: the initial weights for `seed` (benchmarks and smoke tests need a
    /// model of the right shape, not a good one).
    pub fn initial(model: crate::model::ModelConfig, classes: Vec<String>, seed: u64) -> Self {
        let arch = crate::model::Arch::new(&model);
        let values = crate::model::init::init_params(&arch, seed);
        let tensors = arch
            .params()
            .into_iter()
            .zip(values)
            .map(|(spec, v)| (spec.name, spec.shape, v))
            .collect();
        Checkpoint {
            model,
            progress: Progress::default(),
            train: None,
            classes,
            tensors,
        }
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.tensors
            .iter()
            .find(|t| t.0 == name)
            .map(|t| t.2.as_slice())
    }

    /// The weights of parameter `name` to evaluate, serve or export: the average `ema.NAME`
    /// where the checkpoint has one, else `NAME`.
    pub fn weight(&self, name: &str) -> Option<&[f32]> {
        self.get(&StateTensor::Ema.name(name))
            .or_else(|| self.get(name))
    }

    /// Bytes of the tensors' values in memory.
    pub fn value_bytes(&self) -> u64 {
        let values: usize = self.tensors.iter().map(|t| t.2.len()).sum();
        (values * std::mem::size_of::<f32>()) as u64
    }

    /// The weights alone: each parameter as [`Checkpoint::weight`] gives it (the average where
    /// there is one), without the optimizer's moments. A quarter of the file, and all that
    /// evaluation, serving, export and fine-tuning read; a run cannot resume from it.
    pub fn weights_only(&self) -> Checkpoint {
        let tensors = self
            .tensors
            .iter()
            .filter(|(name, _, _)| StateTensor::param_of(name) == name.as_str())
            .map(|(name, shape, values)| {
                let weight = self.weight(name).unwrap_or(values);
                (name.clone(), shape.clone(), weight.to_vec())
            })
            .collect();
        Checkpoint {
            tensors,
            ..self.clone()
        }
    }

    /// The weight of the GIoU term the model was trained with (the training config's `giou`;
    /// 0 for runs without one or from before it existed), so that an evaluation's loss is
    /// the loss it was trained on.
    pub fn giou_weight(&self) -> f32 {
        self.trained_with("giou")
    }

    /// The regression weight of the centres' neighbours the model was trained with (the
    /// training config's `neighbours`; 0 for runs without it), for the same reason.
    pub fn neighbour_weight(&self) -> f32 {
        self.trained_with("neighbours")
    }

    /// How far those neighbours reached (the training config's `neighbour_radius`; 1, the
    /// 3×3 block, for runs from before it).
    pub fn neighbour_radius(&self) -> u32 {
        match self.trained_with("neighbour_radius") as u32 {
            0 => 1,
            r => r,
        }
    }

    /// The most neighbour cells a box weighed in full (the training config's
    /// `neighbour_cells`; 0, no limit, for runs without it).
    pub fn neighbour_cells(&self) -> u32 {
        self.trained_with("neighbour_cells") as u32
    }

    /// A number from the training config (0 where it or the field is absent).
    fn trained_with(&self, field: &str) -> f32 {
        self.train
            .as_ref()
            .and_then(|t| t.get(field))
            .and_then(serde_json::Value::as_f64)
            .map_or(0.0, |w| w as f32)
    }

    /// Each tensor as safetensors writes it, its values' memory borrowed.
    fn views(&self) -> impl Iterator<Item = (&str, TensorView<'_>)> {
        self.tensors.iter().map(|(name, shape, values)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), le_bytes(values))
                .expect("a checkpoint tensor's shape matches its values");
            (name.as_str(), view)
        })
    }

    /// The header's metadata (see the module docs).
    fn metadata(&self) -> HashMap<String, String> {
        let mut meta = HashMap::new();
        meta.insert("fulcrum.format".to_owned(), FORMAT.to_owned());
        meta.insert("fulcrum.model".to_owned(), json(&self.model));
        meta.insert("fulcrum.progress".to_owned(), json(&self.progress));
        if let Some(t) = &self.train {
            meta.insert("fulcrum.train".to_owned(), t.to_string());
        }
        if !self.classes.is_empty() {
            meta.insert("fulcrum.classes".to_owned(), json(&self.classes));
        }
        meta
    }

    /// Writes the checkpoint to `path` atomically (temporary file, fsync, rename, fsync of
    /// the directory), creating the directory if needed. The tensors go to the file straight
    /// from their own memory: saving holds no second copy of the weights and state.
    pub fn save(&self, path: &Path) -> Result<()> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        crate::durable::write_atomic_at(path, |tmp| {
            safetensors::serialize_to_file(self.views(), Some(self.metadata()), tmp).map_err(|e| {
                match e {
                    safetensors::SafeTensorError::IoError(e) => e,
                    other => std::io::Error::other(other),
                }
            })
        })
        .map_err(io)
    }

    /// Reads a checkpoint, checking its format and that every tensor is `F32` of a
    /// consistent size.
    pub fn load(path: &Path) -> Result<Checkpoint> {
        let bytes = read_bounded(path, max_file_bytes())?;
        Checkpoint::decode(path, &bytes)
    }

    /// Parses the bytes of a checkpoint file (`path` is for messages).
    pub fn decode(path: &Path, bytes: &[u8]) -> Result<Checkpoint> {
        let content = |detail: String| Error::Content {
            path: path.to_path_buf(),
            detail,
        };
        let st = SafeTensors::deserialize(bytes).map_err(|e| Error::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| Error::Format {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        let meta = header.metadata().clone().unwrap_or_default();
        let field = |key: &str| {
            meta.get(key).ok_or_else(|| {
                content(format!(
                    "no {key:?} in the header: not a fulcrum checkpoint (fulcrum train writes them)"
                ))
            })
        };
        let format = field("fulcrum.format")?;
        if format != FORMAT {
            return Err(content(format!(
                "checkpoint format {format:?}; this fulcrum reads format {FORMAT:?}"
            )));
        }
        fn parse<T: serde::de::DeserializeOwned>(path: &Path, key: &str, text: &str) -> Result<T> {
            serde_json::from_str(text).map_err(|e| Error::Content {
                path: path.to_path_buf(),
                detail: format!("{key}: {e}"),
            })
        }
        let model: ModelConfig = parse(path, "fulcrum.model", field("fulcrum.model")?)?;
        model
            .validate()
            .map_err(|e| content(format!("fulcrum.model: {e}")))?;
        let progress: Progress = parse(path, "fulcrum.progress", field("fulcrum.progress")?)?;
        let train = match meta.get("fulcrum.train") {
            Some(t) => Some(parse(path, "fulcrum.train", t)?),
            None => None,
        };
        let classes = match meta.get("fulcrum.classes") {
            Some(t) => parse(path, "fulcrum.classes", t)?,
            None => Vec::new(),
        };
        let mut tensors = Vec::new();
        let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
        names.sort();
        if let Some(name) = foreign_tensor(&model, &names) {
            return Err(content(format!(
                "tensor {name:?} belongs to no parameter of {} as this fulcrum builds it: the \
                 file was written by another version of fulcrum or for another model, and \
                 its weights would be read into the wrong layers; use the fulcrum that wrote it",
                model.name
            )));
        }
        for name in names {
            let view = st
                .tensor(&name)
                .map_err(|e| content(format!("{name}: {e}")))?;
            if view.dtype() != Dtype::F32 {
                return Err(content(format!(
                    "tensor {name} is {:?}; fulcrum checkpoints hold F32",
                    view.dtype()
                )));
            }
            let values = view
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            tensors.push((name, view.shape().to_vec(), values));
        }
        Ok(Checkpoint {
            model,
            progress,
            train,
            classes,
            tensors,
        })
    }
}

/// Training state kept beside a parameter, named after it with a prefix (`adam.m.stem.bias`).
/// The graph's tensors, the checkpoint and the trainer's snapshot all spell the names here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateTensor {
    /// AdamW's first moment.
    AdamM,
    /// AdamW's second moment.
    AdamV,
    /// The weight average that evaluation, serving and export use.
    Ema,
}

impl StateTensor {
    pub const ALL: [StateTensor; 3] = [StateTensor::AdamM, StateTensor::AdamV, StateTensor::Ema];

    pub fn prefix(self) -> &'static str {
        match self {
            StateTensor::AdamM => "adam.m.",
            StateTensor::AdamV => "adam.v.",
            StateTensor::Ema => "ema.",
        }
    }

    /// The state tensor's name for parameter `param`.
    pub fn name(self, param: &str) -> String {
        format!("{}{param}", self.prefix())
    }

    /// The parameter a tensor named `name` belongs to: `name` less a state prefix, or `name`.
    pub fn param_of(name: &str) -> &str {
        StateTensor::ALL
            .iter()
            .find_map(|state| name.strip_prefix(state.prefix()))
            .unwrap_or(name)
    }
}

/// The first of `names` that is neither a parameter of `model` nor one's AdamW moment or
/// average (the module doc's naming). A model that gained layers in a later version would
/// otherwise load here with its extra tensors ignored and run as a different network.
fn foreign_tensor<'a>(model: &ModelConfig, names: &'a [String]) -> Option<&'a str> {
    let params: std::collections::HashSet<String> = crate::model::Arch::new(model)
        .params()
        .into_iter()
        .map(|p| p.name)
        .collect();
    names
        .iter()
        .map(String::as_str)
        .find(|name| !params.contains(StateTensor::param_of(name)))
}

fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serialises")
}

impl Checkpoint {
    /// Writes the weights into `exec`, which runs `graph`. With `optimizer` (resuming), the
    /// last step's weights, the AdamW moments and the weight average (the last step's weights
    /// where the file has none); without, the weights of [`Checkpoint::weight`], also as the
    /// start of a training graph's average (fine-tuning).
    pub fn load_into(
        &self,
        exec: &mut crate::compute::exec::Exec,
        graph: &super::ModelGraph,
        optimizer: bool,
    ) -> std::result::Result<(), LoadError> {
        for (spec, p) in graph.arch.params().iter().zip(&graph.params) {
            let mut put = |name: &str, id| -> std::result::Result<(), LoadError> {
                let v = if name == spec.name && !optimizer {
                    self.weight(name)
                } else {
                    self.get(name)
                };
                let v = v.ok_or_else(|| LoadError::MissingTensor(name.to_owned()))?;
                if v.len() != spec.len() {
                    return Err(LoadError::WrongLength {
                        name: name.to_owned(),
                        got: v.len(),
                        want: spec.len(),
                    });
                }
                exec.write_f32(id, v)?;
                Ok(())
            };
            put(&spec.name, p.value)?;
            if optimizer {
                if let (Some(m), Some(v)) = (p.m, p.v) {
                    put(&StateTensor::AdamM.name(&spec.name), m)?;
                    put(&StateTensor::AdamV.name(&spec.name), v)?;
                }
            }
            if let Some(ema) = p.ema {
                let average = StateTensor::Ema.name(&spec.name);
                let has_average = self.get(&average).is_some();
                put(
                    if optimizer && has_average {
                        &average
                    } else {
                        &spec.name
                    },
                    ema,
                )?;
            }
        }
        Ok(())
    }
}

/// `values` as little-endian bytes (safetensors' layout): their own memory, borrowed, so that
/// saving a checkpoint holds no second copy of the weights and optimizer state.
fn le_bytes(values: &[f32]) -> &[u8] {
    // SAFETY: `f32` is 4 bytes with no padding and any alignment suits `u8`; the slice covers
    // exactly the `4 · len` initialised bytes of `values`, borrowed for as long as `values`
    // is, and on a little-endian machine (checked at compile time below) those bytes are the
    // little-endian encoding.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values))
    }
}

// Every board fulcrum targets (aarch64, x86-64) is little-endian; [`le_bytes`] relies on it.
#[cfg(not(target_endian = "little"))]
compile_error!("checkpoints are written from the values' own memory: a little-endian target");

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            model: ModelConfig::named("det-s", 2).unwrap(),
            progress: Progress {
                seed: 3,
                epoch: 2,
                step: 128,
                batch_in_epoch: 0,
            },
            train: Some(serde_json::json!({"batch": 32, "lr": 0.01})),
            classes: vec!["disc".into(), "square".into()],
            tensors: vec![
                (
                    "stem.weight".into(),
                    vec![2, 1, 1, 2],
                    vec![1.0, -2.5, 3.25, f32::MIN_POSITIVE],
                ),
                ("stem.bias".into(), vec![2], vec![0.5, -0.0]),
            ],
        }
    }

    #[test]
    fn the_loss_settings_come_from_the_training_config() {
        let mut c = sample();
        assert_eq!(c.giou_weight(), 0.0, "a config without the field");
        assert_eq!((c.neighbour_weight(), c.neighbour_radius()), (0.0, 1));
        c.train = Some(serde_json::json!({"batch": 32, "giou": 1.5, "neighbours": 0.25}));
        assert_eq!(c.neighbour_radius(), 1, "a run from before the radius");
        c.train = Some(serde_json::json!({"neighbours": 0.25, "neighbour_radius": 2}));
        assert_eq!(c.neighbour_radius(), 2);
        c.train = Some(serde_json::json!({"batch": 32, "giou": 1.5, "neighbours": 0.25}));
        assert_eq!(c.giou_weight(), 1.5);
        assert_eq!(c.neighbour_weight(), 0.25);
        c.train = None;
        assert_eq!(c.giou_weight(), 0.0);
    }

    #[test]
    fn round_trip_keeps_every_bit_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ckpt.safetensors");
        let c = sample();
        c.save(&path).unwrap();
        let back = Checkpoint::load(&path).unwrap();
        assert_eq!(back.model, c.model);
        assert_eq!(back.progress, c.progress);
        assert_eq!(back.train, c.train);
        assert_eq!(back.classes, c.classes);
        for (name, shape, values) in &c.tensors {
            let got = back.tensors.iter().find(|t| &t.0 == name).unwrap();
            assert_eq!(&got.1, shape);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got.2), bits(values), "{name}");
        }
        assert_eq!(back.get("stem.bias"), Some(&[0.5, -0.0][..]));
    }

    #[test]
    fn the_weights_to_use_are_the_average_where_there_is_one() {
        let mut c = sample();
        assert_eq!(c.weight("stem.bias"), Some(&[0.5, -0.0][..]));
        c.tensors
            .push(("ema.stem.bias".into(), vec![2], vec![0.25, 1.0]));
        assert_eq!(c.weight("stem.bias"), Some(&[0.25, 1.0][..]));
        assert_eq!(c.get("stem.bias"), Some(&[0.5, -0.0][..]));
        assert_eq!(c.weight("stem.weight"), c.get("stem.weight"));
        assert_eq!(c.weight("nothing"), None);
    }

    #[test]
    fn weights_only_keeps_the_averages_as_the_weights_and_drops_the_moments() {
        let mut c = sample();
        c.tensors.extend([
            ("ema.stem.bias".into(), vec![2], vec![0.25, 1.0]),
            ("adam.m.stem.bias".into(), vec![2], vec![7.0, 7.0]),
            ("adam.v.stem.weight".into(), vec![2, 1, 1, 2], vec![9.0; 4]),
        ]);
        let slim = c.weights_only();
        let names: Vec<&str> = slim.tensors.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(names, ["stem.weight", "stem.bias"]);
        assert_eq!(slim.get("stem.bias"), Some(&[0.25, 1.0][..]), "the average");
        assert_eq!(
            slim.get("stem.weight"),
            c.get("stem.weight"),
            "no average: as trained"
        );
        assert_eq!(
            (slim.model, slim.progress, slim.classes),
            (c.model, c.progress, c.classes)
        );
    }

    #[test]
    fn foreign_and_damaged_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        std::fs::write(&path, b"not a checkpoint at all").unwrap();
        let e = Checkpoint::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("x.safetensors") && e.contains("not a safetensors file"),
            "{e}"
        );

        sample().save(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        let e = Checkpoint::decode(&path, &bytes).unwrap_err().to_string();
        assert!(e.contains("not a safetensors file"), "{e}");

        // A safetensors file that fulcrum did not write.
        let data = [0u8; 8];
        let view = TensorView::new(Dtype::F32, vec![2], &data).unwrap();
        let foreign = safetensors::serialize([("w", view)], None).unwrap();
        let e = Checkpoint::decode(&path, &foreign).unwrap_err().to_string();
        assert!(e.contains("not a fulcrum checkpoint"), "{e}");

        // Moments and averages of the model's parameters belong; a layer it lacks does not
        // (a det-s has seven blocks, not ten).
        let mut c = sample();
        for name in ["adam.m.stem.bias", "adam.v.stem.bias", "ema.stem.bias"] {
            c.tensors.push((name.into(), vec![2], vec![1.0, 2.0]));
        }
        c.save(&path).unwrap();
        assert_eq!(Checkpoint::load(&path).unwrap().tensors.len(), 5);
        c.tensors
            .push(("ema.b10.dw.bias".into(), vec![2], vec![1.0, 2.0]));
        c.save(&path).unwrap();
        let e = Checkpoint::load(&path).unwrap_err().to_string();
        assert!(
            e.contains("x.safetensors") && e.contains("\"ema.b10.dw.bias\"") && e.contains("det-s"),
            "{e}"
        );

        let e = Checkpoint::load(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn only_regular_files_within_the_family_bound_are_read() {
        let dir = tempfile::tempdir().unwrap();
        // A device that never ends, a FIFO with no writer, a folder: refused before reading.
        for (path, kind) in [
            (Path::new("/dev/zero").to_path_buf(), "character device"),
            (dir.path().to_path_buf(), "folder"),
        ] {
            let e = Checkpoint::load(&path).unwrap_err().to_string();
            assert!(e.contains(kind) && e.contains("not a regular file"), "{e}");
        }
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        let e = Checkpoint::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        // A link to /dev/zero is the device, as the descriptor says.
        let link = dir.path().join("w.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = Checkpoint::load(&link).unwrap_err().to_string();
        assert!(e.contains("character device"), "{e}");
        // A file over the bound: refused by its size (sparse, so nothing is written).
        let big = dir.path().join("big.safetensors");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(max_file_bytes() + 1).unwrap();
        let e = Checkpoint::load(&big).unwrap_err().to_string();
        assert!(e.contains("more than any fulcrum checkpoint"), "{e}");
        // The bound holds the largest preset's full training state with room to spare.
        let det_l = crate::model::Arch::new(&ModelConfig::named("det-l", 80).unwrap());
        let full: u64 = det_l.params().iter().map(|p| p.len() as u64 * 16).sum();
        assert!(
            max_file_bytes() > 4 * full,
            "{} vs {full}",
            max_file_bytes()
        );
        // And a small file reads whole.
        let small = dir.path().join("small");
        std::fs::write(&small, b"0123").unwrap();
        assert_eq!(read_bounded(&small, 4).unwrap(), b"0123");
        assert!(read_bounded(&small, 3).is_err());
    }
}
