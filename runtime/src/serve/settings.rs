//! `fulcrumd`'s settings, from its command line and its TOML file (`--config`), checked into a
//! [`ServeConfig`]. Both sources give the same [`Settings`]; the command line wins field by
//! field ([`Settings::or`]), and every value is checked once, here, with a message that names
//! the option and its range. The file is read as any file an operator names: a regular file
//! of bounded size ([`crate::durable::read_bounded`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::ServeConfig;
use crate::compute::exec::{EngineChoice, ExecOptions};

/// Largest configuration file read.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Every setting, unset where not given. The TOML keys are the option names with underscores
/// (`allow_gid = [44]`, `mem_budget = "64M"`).
#[derive(Deserialize, Default, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub weights: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    #[serde(default, deserialize_with = "engine_text")]
    pub engine: Option<EngineChoice>,
    pub threads: Option<usize>,
    pub device: Option<usize>,
    pub fp16: Option<bool>,
    #[serde(default)]
    pub allow_uid: Vec<u32>,
    #[serde(default)]
    pub allow_gid: Vec<u32>,
    #[serde(default, deserialize_with = "size_text")]
    pub mem_budget: Option<u64>,
    pub state_dir: Option<PathBuf>,
    pub fine_tune_slice: Option<u64>,
    pub fine_tune_share: Option<f32>,
    pub fine_tune_replay: Option<PathBuf>,
    pub fine_tune_replay_fraction: Option<f32>,
    pub max_clients: Option<usize>,
    pub max_clients_per_uid: Option<usize>,
    pub hello_timeout: Option<u64>,
    pub max_frame_side: Option<u16>,
    pub threshold: Option<f32>,
    pub top_k: Option<u32>,
    pub nms: Option<f32>,
    pub client_reload_dir: Option<PathBuf>,
    pub reload_timeout: Option<u64>,
    pub metrics: Option<PathBuf>,
    pub metrics_every: Option<u64>,
}

fn engine_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<EngineChoice>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| {
        t.parse()
            .map_err(|e| serde::de::Error::custom(format!("engine = {t:?}: {e}")))
    })
    .transpose()
}

fn size_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| crate::base::parse_size(&t).map_err(serde::de::Error::custom))
        .transpose()
}

/// What the environment gives where neither source says (systemd's folders, the cores).
#[derive(Clone, Debug)]
pub struct Defaults {
    pub socket: PathBuf,
    pub state_dir: Option<PathBuf>,
    pub threads: usize,
}

/// Why settings were refused: the file, or a value out of its range.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: crate::durable::BoundedRead,
    },
    #[error("{}: not UTF-8 text ({source})", path.display())]
    NotText {
        path: PathBuf,
        source: std::str::Utf8Error,
    },
    #[error("{}{source}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    Toml {
        path: Option<PathBuf>,
        source: toml::de::Error,
    },
    #[error("no weights: give --weights CHECKPOINT (or `weights = ...` in --config)")]
    NoWeights,
    #[error("{option} {value} {unit}: use {least} to {most} {unit}")]
    OutOfRange {
        option: &'static str,
        value: u64,
        least: u64,
        most: u64,
        unit: &'static str,
    },
    #[error("--max-clients-per-uid {value}: use 1 to --max-clients ({max_clients})")]
    ClientsPerUid { value: usize, max_clients: usize },
    #[error("--client-reload-dir {}: not a folder; create it or leave the option out", .0.display())]
    ReloadDir(PathBuf),
    #[error(
        "--metrics {}: give a file in an existing folder (node_exporter's textfile folder, for \
         example)",
        .0.display()
    )]
    MetricsFile(PathBuf),
    #[error("--threshold {0} must be in [0, 1]")]
    Threshold(f32),
    #[error(
        "--fine-tune-share {0}: give the share of engine time fine-tuning keeps under load, \
         from 0 (inference first, the default) to {max}",
        max = super::share::MAX_SHARE
    )]
    Share(f32),
    #[error(
        "--fine-tune-replay {}: not a packed dataset (no manifest.json); give the base model's \
         packed training data (`fulcrum pack`), or leave the option out",
        .0.display()
    )]
    ReplayData(PathBuf),
    #[error(
        "--fine-tune-replay-fraction {0}: use a share of the batch above 0 and below 1 (e.g. 0.25)"
    )]
    ReplayFraction(f32),
    #[error("--nms: {0}")]
    Nms(#[from] crate::infer::nms::BadLimit),
}

impl Settings {
    /// Parses a configuration file's text.
    pub fn from_toml(text: &str) -> Result<Settings, SettingsError> {
        toml::from_str(text).map_err(|source| SettingsError::Toml { path: None, source })
    }

    /// Reads and parses the file at `path` (a regular file of at most [`MAX_FILE_BYTES`]).
    pub fn from_file(path: &Path) -> Result<Settings, SettingsError> {
        let bytes = crate::durable::read_bounded(path, MAX_FILE_BYTES).map_err(|source| {
            SettingsError::Read {
                path: path.to_owned(),
                source,
            }
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|source| SettingsError::NotText {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(text).map_err(|source| SettingsError::Toml {
            path: Some(path.to_owned()),
            source,
        })
    }

    /// `self`'s values where set, else `other`'s; the allowed uids and gids of both.
    pub fn or(self, other: Settings) -> Settings {
        Settings {
            weights: self.weights.or(other.weights),
            socket: self.socket.or(other.socket),
            engine: self.engine.or(other.engine),
            threads: self.threads.or(other.threads),
            device: self.device.or(other.device),
            fp16: self.fp16.or(other.fp16),
            allow_uid: [self.allow_uid, other.allow_uid].concat(),
            allow_gid: [self.allow_gid, other.allow_gid].concat(),
            mem_budget: self.mem_budget.or(other.mem_budget),
            state_dir: self.state_dir.or(other.state_dir),
            fine_tune_slice: self.fine_tune_slice.or(other.fine_tune_slice),
            fine_tune_share: self.fine_tune_share.or(other.fine_tune_share),
            fine_tune_replay: self.fine_tune_replay.or(other.fine_tune_replay),
            fine_tune_replay_fraction: self
                .fine_tune_replay_fraction
                .or(other.fine_tune_replay_fraction),
            max_clients: self.max_clients.or(other.max_clients),
            max_clients_per_uid: self.max_clients_per_uid.or(other.max_clients_per_uid),
            hello_timeout: self.hello_timeout.or(other.hello_timeout),
            max_frame_side: self.max_frame_side.or(other.max_frame_side),
            threshold: self.threshold.or(other.threshold),
            top_k: self.top_k.or(other.top_k),
            nms: self.nms.or(other.nms),
            client_reload_dir: self.client_reload_dir.or(other.client_reload_dir),
            reload_timeout: self.reload_timeout.or(other.reload_timeout),
            metrics: self.metrics.or(other.metrics),
            metrics_every: self.metrics_every.or(other.metrics_every),
        }
    }

    /// The checked configuration. Limits that depend on the model (frame side, top-K, clients)
    /// are checked again when the server starts.
    pub fn into_config(self, defaults: Defaults) -> Result<ServeConfig, SettingsError> {
        let weights = self.weights.ok_or(SettingsError::NoWeights)?;
        let exec = ExecOptions {
            engine: self.engine.unwrap_or(EngineChoice::Auto),
            device: self.device,
            threads: self.threads.unwrap_or(defaults.threads),
            per_kernel_timing: false,
            // FULCRUM_VULKAN_VALIDATION=1 turns it on (`vulkan::Options::validation_enabled`).
            validation: false,
            mem_budget: self.mem_budget,
            fp16: self.fp16.unwrap_or(false),
        };
        let mut c = ServeConfig::new(self.socket.unwrap_or(defaults.socket), weights, exec);
        c.state_dir = self.state_dir.or(defaults.state_dir);
        c.allow_uids = self.allow_uid;
        c.allow_gids = self.allow_gid;
        if let Some(ms) = self.fine_tune_slice {
            c.fine_tune_slice = millis("--fine-tune-slice", ms, 1, 60_000)?;
        }
        if let Some(p) = self.fine_tune_share {
            if !(0.0..=super::share::MAX_SHARE).contains(&p) {
                return Err(SettingsError::Share(p));
            }
            c.fine_tune_share = p;
        }
        if let Some(dir) = self.fine_tune_replay {
            if !dir.join("manifest.json").is_file() {
                return Err(SettingsError::ReplayData(dir));
            }
            c.fine_tune_replay = Some(dir);
        }
        if let Some(f) = self.fine_tune_replay_fraction {
            if !crate::loader::replay::fraction_fits(f) {
                return Err(SettingsError::ReplayFraction(f));
            }
            c.fine_tune_replay_fraction = f;
        }
        if let Some(v) = self.max_clients {
            c.max_clients = v;
        }
        if let Some(v) = self.max_clients_per_uid {
            if v == 0 || v > c.max_clients {
                return Err(SettingsError::ClientsPerUid {
                    value: v,
                    max_clients: c.max_clients,
                });
            }
            c.max_clients_per_uid = Some(v);
        }
        if let Some(ms) = self.hello_timeout {
            c.hello_timeout = millis("--hello-timeout", ms, 10, 600_000)?;
        }
        if let Some(dir) = self.client_reload_dir {
            if !dir.is_dir() {
                return Err(SettingsError::ReloadDir(dir));
            }
            c.client_reload_dir = Some(dir);
        }
        if let Some(s) = self.reload_timeout {
            c.reload_timeout = seconds("--reload-timeout", s)?;
        }
        if let Some(path) = self.metrics {
            let folder = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !folder.is_dir() || path.is_dir() {
                return Err(SettingsError::MetricsFile(path));
            }
            c.metrics = Some(path);
        }
        if let Some(s) = self.metrics_every {
            c.metrics_every = seconds("--metrics-every", s)?;
        }
        if let Some(v) = self.max_frame_side {
            c.max_frame_side = v;
        }
        if let Some(v) = self.threshold {
            if !(0.0..=1.0).contains(&v) {
                return Err(SettingsError::Threshold(v));
            }
            c.threshold = v;
        }
        if let Some(v) = self.top_k {
            c.top_k = v;
        }
        if let Some(v) = self.nms {
            crate::infer::nms::check_limit(v)?;
            c.nms_iou = v;
        }
        Ok(c)
    }
}

fn millis(option: &'static str, ms: u64, least: u64, most: u64) -> Result<Duration, SettingsError> {
    within(option, ms, (least, most), "ms").map(Duration::from_millis)
}

fn seconds(option: &'static str, s: u64) -> Result<Duration, SettingsError> {
    within(option, s, (1, 3600), "s").map(Duration::from_secs)
}

fn within(
    option: &'static str,
    value: u64,
    (least, most): (u64, u64),
    unit: &'static str,
) -> Result<u64, SettingsError> {
    if (least..=most).contains(&value) {
        Ok(value)
    } else {
        Err(SettingsError::OutOfRange {
            option,
            value,
            least,
            most,
            unit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            socket: "/run/fulcrumd/fulcrumd.sock".into(),
            state_dir: None,
            threads: 2,
        }
    }

    #[test]
    fn a_file_sets_what_the_command_line_leaves() {
        let file = Settings::from_toml(
            "weights = \"/var/lib/m.safetensors\"\nengine = \"cpu\"\nmem_budget = \"64M\"\n\
             allow_gid = [44]\nhello_timeout = 500\nthreshold = 0.4\n",
        )
        .unwrap();
        let line = Settings {
            threshold: Some(0.1),
            allow_gid: vec![7],
            ..Settings::default()
        };
        let c = line.or(file).into_config(defaults()).unwrap();
        assert_eq!(c.weights, PathBuf::from("/var/lib/m.safetensors"));
        assert_eq!(c.exec.engine, EngineChoice::Cpu);
        assert_eq!(c.exec.mem_budget, Some(64 << 20));
        assert_eq!(c.allow_gids, [7, 44]);
        assert_eq!(c.hello_timeout, Duration::from_millis(500));
        assert_eq!(c.threshold, 0.1, "the command line wins");
        assert_eq!(c.socket, PathBuf::from("/run/fulcrumd/fulcrumd.sock"));
    }

    #[test]
    fn bad_values_name_their_option() {
        for (text, says) in [
            ("weigths = \"x\"", "weigths"),
            ("weights = \"x\"\nengine = \"gpu\"", "engine = \"gpu\""),
            ("weights = \"x\"\nmem_budget = \"lots\"", "not a size"),
            ("weights = \"x\"\nnms = 1.5", "--nms"),
            ("weights = \"x\"\nthreshold = -1", "--threshold"),
            ("weights = \"x\"\nhello_timeout = 0", "--hello-timeout"),
            (
                "weights = \"x\"\nreload_timeout = 99999",
                "--reload-timeout",
            ),
            (
                "weights = \"x\"\nmax_clients = 4\nmax_clients_per_uid = 5",
                "--max-clients-per-uid",
            ),
            (
                "weights = \"x\"\nclient_reload_dir = \"/nonexistent\"",
                "--client-reload-dir",
            ),
            (
                "weights = \"x\"\nmetrics = \"/nonexistent/m.prom\"",
                "--metrics",
            ),
            (
                "weights = \"x\"\nfine_tune_replay = \"/tmp\"",
                "not a packed dataset",
            ),
            (
                "weights = \"x\"\nfine_tune_replay_fraction = 0.0",
                "--fine-tune-replay-fraction 0",
            ),
            ("threads = 2", "no weights"),
        ] {
            let e = Settings::from_toml(text)
                .and_then(|s| s.into_config(defaults()))
                .unwrap_err();
            assert!(e.to_string().contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_example_file_and_every_key_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let example = Settings::from_file(&root.join("tools/systemd/fulcrumd.toml")).unwrap();
        assert!(example.weights.is_some());
        let every = root.join("runtime/fuzz/seeds/daemon_config/every-key.toml");
        let c = Settings::from_file(&every)
            .unwrap()
            .into_config(defaults())
            .unwrap();
        assert_eq!((c.max_clients, c.max_clients_per_uid), (8, Some(4)));
        assert_eq!(c.reload_timeout, Duration::from_secs(30));
        assert_eq!(
            (c.fine_tune_share, c.fine_tune_replay_fraction),
            (0.25, 0.5)
        );
    }

    #[test]
    fn the_file_is_read_as_a_bounded_regular_file() {
        let e = Settings::from_file(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("character device"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fulcrumd.toml");
        std::fs::write(&path, "weights = \"w\"\n").unwrap();
        assert_eq!(
            Settings::from_file(&path).unwrap().weights,
            Some(PathBuf::from("w"))
        );
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        let e = Settings::from_file(&path).unwrap_err();
        assert!(matches!(e, SettingsError::NotText { .. }) && e.to_string().contains("UTF-8"));
    }
}
