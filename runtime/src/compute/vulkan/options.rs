//! How the Vulkan engine is set up: [`Options`] (where the pipeline cache is kept among them:
//! [`CacheDir`]), and the environment variables that stand in for the options a caller leaves
//! unset (the loader, validation, and the kernel variants' switches for A/B runs). Each switch
//! is read once, when a device is opened, and a value it cannot take is an error naming the
//! ones it can.

use std::path::PathBuf;

use super::{Error, Result};

/// Environment variable: the Vulkan loader library to load instead of `libvulkan.so.1`.
pub const LOADER_ENV: &str = "FULCRUM_VULKAN_LOADER";
/// Environment variable: `1` enables the Khronos validation layer.
pub const VALIDATION_ENV: &str = "FULCRUM_VULKAN_VALIDATION";
/// Environment variable: `0` keeps the plain kernels where subgroup variants would run, `1`
/// asks for the variants (see [`Options::subgroups`]), for A/B runs.
pub const SUBGROUPS_ENV: &str = "FULCRUM_VULKAN_SUBGROUPS";
/// Environment variable: `0` keeps the GPUs' kernels where direct variants would run (on a
/// CPU-type device), `1` asks for the direct variants on any device (see [`Options::direct`]),
/// for A/B runs.
pub const DIRECT_ENV: &str = "FULCRUM_VULKAN_DIRECT";
/// Environment variable: `ROWSxCOLS` (say `32x64`) gives every tiled GEMM dispatch that tile
/// (see [`Options::gemm_tile`]), for A/B runs.
pub const GEMM_TILE_ENV: &str = "FULCRUM_VULKAN_GEMM_TILE";

/// Where the pipeline cache is kept.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheDir {
    /// [`default_cache_dir`].
    #[default]
    User,
    /// This directory.
    At(PathBuf),
    /// No persisted cache (an in-memory one is still used within the process).
    Off,
}

impl CacheDir {
    pub(super) fn dir(&self) -> Option<PathBuf> {
        match self {
            CacheDir::User => Some(default_cache_dir()),
            CacheDir::At(p) => Some(p.clone()),
            CacheDir::Off => None,
        }
    }
}

/// `~/.cache/fulcrum/vulkan` (see [`crate::durable::user_cache_dir`]).
pub fn default_cache_dir() -> PathBuf {
    crate::durable::user_cache_dir().join("vulkan")
}

/// How to set up Vulkan.
#[derive(Debug, Clone)]
pub struct Options {
    /// Enable the Khronos validation layer and `VK_EXT_debug_utils`, recording every warning
    /// and error into the [`ValidationLog`](super::ValidationLog). Also on when
    /// `FULCRUM_VULKAN_VALIDATION=1`. Asking for it where the layer is not installed is an
    /// error (tests must not silently run unvalidated).
    pub validation: bool,
    /// The loader library; `None`: `FULCRUM_VULKAN_LOADER` if set, else `libvulkan.so.1`.
    pub loader: Option<PathBuf>,
    /// The device index (as listed by `fulcrum devices`); `None`: the best one.
    pub device: Option<usize>,
    /// Where the pipeline cache is kept.
    pub pipeline_cache: CacheDir,
    /// How long a submission may take before [`Error::Timeout`].
    pub fence_timeout: std::time::Duration,
    /// Use the fp16 kernel variants where the device offers `shaderFloat16` (faster on most
    /// GPUs, ~1e-3 relative error); ignored, with a log line, where it does not.
    pub fp16: bool,
    /// Use the direct kernel variants (no shared memory, no barriers) where a step has one;
    /// `None`: `FULCRUM_VULKAN_DIRECT` if set, else on CPU-type devices (lavapipe), which pay
    /// for every workgroup barrier by switching between all the groups of lanes.
    pub direct: Option<bool>,
    /// Use the subgroup kernel variants (a workgroup's sums by `subgroupAdd` rather than a
    /// tree of barriers in shared memory) where a step has one; `None`: `FULCRUM_VULKAN_SUBGROUPS`
    /// if set, else wherever the device's subgroups have arithmetic in compute shaders.
    /// Asked for where they do not, they are not used (with a log line).
    pub subgroups: Option<bool>,
    /// Compile each convolution kernel (and the few others whose table entry allows it)
    /// once per shape, the shape as specialisation constants (`shaders/conv_push.glsl`),
    /// rather than once with the shape in push constants: the compiler folds the shape in
    /// (det-s's training step on lavapipe: 1.4× faster), at the cost of more pipelines to
    /// create (kept in the pipeline cache).
    pub specialise: bool,
    /// The tile (rows, columns) of every tiled GEMM dispatch, rows from
    /// [`GEMM_TILE_ROWS`](super::kernels::GEMM_TILE_ROWS) and columns from
    /// [`GEMM_TILE_COLS`](super::kernels::GEMM_TILE_COLS); `None`: `FULCRUM_VULKAN_GEMM_TILE`
    /// if set, else each dispatch's own, chosen for its shape. For tests and A/B runs.
    pub gemm_tile: Option<[u32; 2]>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            validation: false,
            loader: None,
            device: None,
            pipeline_cache: CacheDir::User,
            fence_timeout: std::time::Duration::from_secs(120),
            fp16: false,
            direct: None,
            subgroups: None,
            specialise: true,
            gemm_tile: None,
        }
    }
}

impl Options {
    /// Whether validation is on: the option or `FULCRUM_VULKAN_VALIDATION=1`.
    pub fn validation_enabled(&self) -> bool {
        self.validation || std::env::var(VALIDATION_ENV).is_ok_and(|v| v == "1")
    }

    /// Whether the subgroup variants are asked for: the option, else `FULCRUM_VULKAN_SUBGROUPS`
    /// (`0` or `1`), else `None` (wherever the device has them).
    pub(super) fn subgroups_asked(&self) -> Result<Option<bool>> {
        switch_asked(
            self.subgroups,
            SUBGROUPS_ENV,
            "0 (plain kernels) or 1 (subgroup variants)",
        )
    }

    /// Whether the direct variants are asked for: the option, else `FULCRUM_VULKAN_DIRECT`
    /// (`0` or `1`), else `None` (on CPU-type devices).
    pub(super) fn direct_asked(&self) -> Result<Option<bool>> {
        switch_asked(
            self.direct,
            DIRECT_ENV,
            "0 (the GPUs' kernels) or 1 (direct variants)",
        )
    }

    /// The tile every tiled GEMM dispatch is given: the option, else `FULCRUM_VULKAN_GEMM_TILE`
    /// (`ROWSxCOLS`), else `None`; an error where it is not one the kernels take.
    pub(super) fn gemm_tile_asked(&self) -> Result<Option<[u32; 2]>> {
        use super::kernels::{GEMM_TILE_COLS, GEMM_TILE_ROWS};
        // The choices of GEMM_TILE_ROWS and GEMM_TILE_COLS, in words.
        macro_rules! choices {
            () => {
                "rows 16, 32 or 64 and columns 16, 32, 64 or 128"
            };
        }
        let taken =
            |tile: [u32; 2]| GEMM_TILE_ROWS.contains(&tile[0]) && GEMM_TILE_COLS.contains(&tile[1]);
        if let Some(tile) = self.gemm_tile {
            return match taken(tile) {
                true => Ok(Some(tile)),
                false => Err(Error::BadOption {
                    name: "Options::gemm_tile",
                    value: format!("[{}, {}]", tile[0], tile[1]),
                    expected: choices!(),
                }),
            };
        }
        let Ok(value) = std::env::var(GEMM_TILE_ENV) else {
            return Ok(None);
        };
        let parsed = value
            .split_once('x')
            .and_then(|(r, c)| Some([r.parse().ok()?, c.parse().ok()?]));
        match parsed {
            Some(tile) if taken(tile) => Ok(Some(tile)),
            _ => Err(Error::BadEnv {
                name: GEMM_TILE_ENV,
                value,
                expected: concat!("ROWSxCOLS, ", choices!()),
            }),
        }
    }

    pub(super) fn loader_path(&self) -> Option<PathBuf> {
        self.loader.clone().or_else(|| {
            std::env::var_os(LOADER_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    }
}

/// A switch: `option` if set, else environment variable `env` (`0` or `1`; anything else is
/// an error naming the `expected` values), else `None`.
fn switch_asked(
    option: Option<bool>,
    env: &'static str,
    expected: &'static str,
) -> Result<Option<bool>> {
    if option.is_some() {
        return Ok(option);
    }
    match std::env::var(env) {
        Err(_) => Ok(None),
        Ok(v) if v == "1" => Ok(Some(true)),
        Ok(v) if v == "0" => Ok(Some(false)),
        Ok(value) => Err(Error::BadEnv {
            name: env,
            value,
            expected,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemm_tile_option_is_checked_under_its_own_name() {
        let with = |tile| Options {
            gemm_tile: Some(tile),
            ..Options::default()
        };
        assert_eq!(with([16, 128]).gemm_tile_asked().unwrap(), Some([16, 128]));
        for bad in [[48, 64], [32, 8], [0, 0]] {
            let err = with(bad).gemm_tile_asked().unwrap_err().to_string();
            assert!(
                err.contains("Options::gemm_tile") && !err.contains(GEMM_TILE_ENV),
                "{bad:?}: {err}"
            );
            assert!(err.contains(&format!("[{}, {}]", bad[0], bad[1])), "{err}");
        }
    }

    #[test]
    fn a_switch_set_in_the_options_wins_over_the_environment() {
        // The option is returned before the variable is read, whatever it holds.
        for option in [Some(true), Some(false)] {
            assert_eq!(switch_asked(option, DIRECT_ENV, "0 or 1").unwrap(), option);
        }
    }
}
