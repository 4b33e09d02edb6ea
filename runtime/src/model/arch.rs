//! The detector's architecture as data: a [`ModelConfig`] (variant, width, depth, output
//! levels, input size, classes) and the layers it implies ([`Arch`]), from which
//! [`super::graph`] builds the recordings and [`super::init`] the initial weights.
//!
//! `det-s`, the reference detector: input 3×128×128, a 3×3 stride-2 stem, seven
//! depthwise-separable blocks (three with stride 2, four residual), a neck that projects the
//! last feature map with a pointwise conv (at its own 8×8 size: the conv and nearest
//! upsampling commute), upsamples it and adds it to the 16×16 one (`c3`), and a head of
//! depthwise, pointwise and a final 1×1 convolution to `K + 4` channels at stride 8.
//!
//! One stride-8 head cannot reach across an object that fills a larger input, so the larger
//! presets have three output levels, strides 8, 16 and 32 (a small feature pyramid): the
//! backbone gains a stride-32 stage (`c5`), the neck runs top-down — `p5 = pw(c5)`,
//! `p4 = pw(c4) + up(p5)`, `p3 = up(pw(p4)) + c3` — and each level has a head of its own
//! (`head` at stride 8, `head16`, `head32`). Each box is trained on the one level its size
//! picks ([`crate::compute::ops::Levels::level_of`]), and the levels' outputs are gathered
//! into one output, cell after cell ([`crate::compute::ops::Levels`]).
//!
//! Presets come from multipliers, not new code: `det-s` (width 1, depth 1, one level, 128 px),
//! `det-m` (width 1.5, depth 1, three levels, 256 px) and `det-l` (width 2, depth 2 — every
//! residual block twice — three levels, 320 px). Training takes the input size from the data.

use serde::{Deserialize, Serialize};

use crate::compute::ops::Levels;

/// Which detector and at what size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// `det-s`, `det-m` or `det-l`.
    pub name: String,
    /// Channel multiplier (det-s: 1.0); every width is rounded to a multiple of 8.
    pub width: f32,
    /// How many times each residual block repeats (det-s: 1). Checkpoints written before
    /// depth existed read as 1.
    #[serde(default = "one")]
    pub depth: u32,
    /// Output levels: 1 (stride 8) or 3 (strides 8, 16, 32). Checkpoints written before
    /// levels existed read as 1.
    #[serde(default = "one")]
    pub levels: u32,
    /// Square input side in pixels: the packed records' size, a multiple of 32 from
    /// [`ModelConfig::MIN_INPUT`] to [`ModelConfig::MAX_INPUT`] for a trained model (the
    /// deepest stride is 32).
    pub input: u32,
    /// Object classes (`K`).
    pub classes: u32,
}

fn one() -> u32 {
    1
}

/// Why a model configuration (a preset's name, a checkpoint's description) is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("unknown model {0}: use det-s, det-m or det-l")]
    UnknownModel(String),
    #[error("input size {input}: a model trains at a multiple of 32 from {min} to {max}")]
    TrainingInput { input: u32, min: u32, max: u32 },
    #[error("{classes} classes: a model needs 1 to {max}")]
    Classes { classes: u32, max: u32 },
    #[error("input size {input}: it must be a multiple of 32, at most {max}")]
    Input { input: u32, max: u32 },
    #[error("width {width}: use 0.25 to {max}")]
    Width { width: f32, max: f32 },
    #[error("depth {depth}: use 1 to {max}")]
    Depth { depth: u32, max: u32 },
    #[error("{0} output levels: a model has 1 (stride 8) or 3 (strides 8, 16, 32)")]
    Levels(u32),
}

impl ModelConfig {
    /// The presets: name, width, depth, levels, usual input size.
    pub const PRESETS: [(&'static str, f32, u32, u32, u32); 3] = [
        ("det-s", 1.0, 1, 1, 128),
        ("det-m", 1.5, 1, 3, 256),
        ("det-l", 2.0, 2, 3, 320),
    ];

    /// A named variant at its usual input size ([`Self::PRESETS`]); training takes the size
    /// from the data ([`Self::named_at`]).
    pub fn named(name: &str, classes: u32) -> Result<ModelConfig, ConfigError> {
        let Some(&(_, width, depth, levels, input)) = Self::PRESETS.iter().find(|p| p.0 == name)
        else {
            return Err(ConfigError::UnknownModel(crate::text::quoted(name)));
        };
        let config = ModelConfig {
            name: name.to_owned(),
            width,
            depth,
            levels,
            input,
            classes,
        };
        config.validate()?;
        Ok(config)
    }

    /// Smallest and largest input sizes a model is trained at.
    pub const MIN_INPUT: u32 = 128;
    pub const MAX_INPUT: u32 = 640;

    /// The variant `name` at input size `input` (the side of the packed records it trains on),
    /// which must be a multiple of 32 from [`Self::MIN_INPUT`] to [`Self::MAX_INPUT`].
    pub fn named_at(name: &str, classes: u32, input: u32) -> Result<ModelConfig, ConfigError> {
        if !input.is_multiple_of(32) || !(Self::MIN_INPUT..=Self::MAX_INPUT).contains(&input) {
            return Err(ConfigError::TrainingInput {
                input,
                min: Self::MIN_INPUT,
                max: Self::MAX_INPUT,
            });
        }
        let config = ModelConfig {
            input,
            ..Self::named(name, classes)?
        };
        config.validate()?;
        Ok(config)
    }

    /// The largest values [`ModelConfig::validate`] accepts.
    pub const MAX_CLASSES: u32 = 1000;
    pub const MAX_WIDTH: f32 = 8.0;
    pub const MAX_DEPTH: u32 = 4;
    /// Largest input side a checkpoint may describe (training stops at [`Self::MAX_INPUT`]).
    pub const MAX_DESCRIBED_INPUT: u32 = 1024;

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.classes == 0 || self.classes > Self::MAX_CLASSES {
            return Err(ConfigError::Classes {
                classes: self.classes,
                max: Self::MAX_CLASSES,
            });
        }
        if self.input == 0
            || !self.input.is_multiple_of(32)
            || self.input > Self::MAX_DESCRIBED_INPUT
        {
            return Err(ConfigError::Input {
                input: self.input,
                max: Self::MAX_DESCRIBED_INPUT,
            });
        }
        if !(self.width.is_finite() && (0.25..=Self::MAX_WIDTH).contains(&self.width)) {
            return Err(ConfigError::Width {
                width: self.width,
                max: Self::MAX_WIDTH,
            });
        }
        if !(1..=Self::MAX_DEPTH).contains(&self.depth) {
            return Err(ConfigError::Depth {
                depth: self.depth,
                max: Self::MAX_DEPTH,
            });
        }
        if self.levels != 1 && self.levels != 3 {
            return Err(ConfigError::Levels(self.levels));
        }
        Ok(())
    }

    /// `base` channels scaled by the width, rounded to a multiple of 8 (at least 8).
    pub fn channels(&self, base: u32) -> u32 {
        let scaled = (base as f32 * self.width / 8.0).round() as u32 * 8;
        scaled.max(8)
    }

    /// Output channels: `K` heat maps, 2 offsets, 2 log sizes.
    pub fn out_channels(&self) -> u32 {
        self.classes + 4
    }

    /// Input pixels per output cell of the finest level.
    pub const STRIDE: u32 = 8;

    /// The finest level's grid side (`input / 8`).
    pub fn grid(&self) -> u32 {
        self.input / Self::STRIDE
    }

    /// Each output level's stride, finest first.
    pub fn strides(&self) -> &'static [u32] {
        if self.levels == 3 {
            &[8, 16, 32]
        } else {
            &[8]
        }
    }

    /// The output grids at this input size.
    pub fn output_levels(&self) -> Levels {
        Levels::new(self.strides(), self.input, self.input)
    }
}

/// A depthwise-separable block: depthwise 3×3 (stride 1 or 2) + ReLU, pointwise + ReLU, and,
/// when `residual`, the block input added to the output (no ReLU after the add).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SepBlock {
    pub c_in: u32,
    pub c_out: u32,
    pub stride: u32,
    pub residual: bool,
}

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Inputs each output sees (`c_in/groups × k × k`), for initialisation.
    pub fan_in: u32,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The layers of a model, with channel counts and spatial sizes resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Arch {
    pub config: ModelConfig,
    pub stem_out: u32,
    pub blocks: Vec<SepBlock>,
    /// Index in `blocks` of the last stride-8 block, whose output the neck adds (`c3`).
    pub skip_block: usize,
    /// Index in `blocks` of the last stride-16 block (`c4`; the last block with one level).
    pub c4_block: usize,
    /// Neck pointwise channels (= the skip block's channels).
    pub neck: u32,
    /// Head depthwise + pointwise width.
    pub head: u32,
}

impl Arch {
    pub fn new(config: &ModelConfig) -> Arch {
        let c = |b| config.channels(b);
        let mut blocks = Vec::new();
        // A stride-2 block that widens, then `residuals` residual blocks, each `depth` times.
        let mut stage = |c_in, c_out, residuals: usize| {
            blocks.push(SepBlock {
                c_in: c(c_in),
                c_out: c(c_out),
                stride: 2,
                residual: false,
            });
            for _ in 0..residuals * config.depth as usize {
                blocks.push(SepBlock {
                    c_in: c(c_out),
                    c_out: c(c_out),
                    stride: 1,
                    residual: true,
                });
            }
            blocks.len() - 1
        };
        stage(16, 32, 1);
        let skip_block = stage(32, 64, 2);
        let c4_block = stage(64, 128, 1);
        if config.levels == 3 {
            stage(128, 192, 1);
        }
        Arch {
            config: config.clone(),
            stem_out: c(16),
            blocks,
            skip_block,
            c4_block,
            neck: c(64),
            head: c(64),
        }
    }

    /// The stride-32 stage's output (`c5`), with three levels.
    pub fn c5_block(&self) -> Option<usize> {
        (self.config.levels == 3).then(|| self.blocks.len() - 1)
    }

    /// Each level's head, finest first, by its parameter prefix: `head` (stride 8), `head16`,
    /// `head32`.
    pub fn heads(&self) -> Vec<String> {
        self.config
            .strides()
            .iter()
            .map(|&s| {
                if s == ModelConfig::STRIDE {
                    "head".to_owned()
                } else {
                    format!("head{s}")
                }
            })
            .collect()
    }

    /// Every parameter tensor, in a fixed order (checkpoints and the optimizer use it): for
    /// each convolution its weight (`c_out × c_in/groups × k × k`) then its bias (`c_out`).
    pub fn params(&self) -> Vec<ParamSpec> {
        let mut out = Vec::new();
        let mut conv = |name: &str, c_in_per_group: u32, c_out: u32, k: u32| {
            let fan_in = c_in_per_group * k * k;
            let shape = [c_out, c_in_per_group, k, k].map(|d| d as usize).to_vec();
            out.push(ParamSpec {
                name: format!("{name}.weight"),
                shape,
                fan_in,
            });
            out.push(ParamSpec {
                name: format!("{name}.bias"),
                shape: vec![c_out as usize],
                fan_in,
            });
        };
        conv("stem", 3, self.stem_out, 3);
        for (i, b) in self.blocks.iter().enumerate() {
            conv(&format!("b{}.dw", i + 1), 1, b.c_in, 3);
            conv(&format!("b{}.pw", i + 1), b.c_in, b.c_out, 1);
        }
        let c4 = self.blocks[self.c4_block].c_out;
        if let Some(c5) = self.c5_block() {
            conv("neck.p5", self.blocks[c5].c_out, self.neck, 1);
            conv("neck.p4", c4, self.neck, 1);
            conv("neck.pw", self.neck, self.neck, 1);
        } else {
            conv("neck.pw", c4, self.neck, 1);
        }
        for head in self.heads() {
            conv(&format!("{head}.dw"), 1, self.neck, 3);
            conv(&format!("{head}.pw"), self.neck, self.head, 1);
            conv(
                &format!("{head}.out"),
                self.head,
                self.config.out_channels(),
                1,
            );
        }
        out
    }

    /// Total parameters.
    pub fn param_count(&self) -> usize {
        self.params().iter().map(ParamSpec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn det_s_has_the_documented_parameter_count() {
        let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        assert_eq!(arch.param_count(), 54_758);
        assert_eq!(arch.params().len(), 2 * (1 + 14 + 4));
        assert_eq!(arch.config.grid(), 16);
        assert_eq!(arch.blocks[arch.skip_block].c_out, arch.neck);
    }

    #[test]
    fn det_m_is_wider_and_bigger() {
        let m = ModelConfig::named("det-m", 3).unwrap();
        assert_eq!(
            (m.input, m.grid(), m.channels(16), m.channels(128)),
            (256, 32, 24, 192)
        );
        assert!(Arch::new(&m).param_count() > 3 * 54_758);
    }

    #[test]
    fn three_level_presets_have_a_stride_32_stage_and_a_head_per_level() {
        let m = Arch::new(&ModelConfig::named("det-m", 2).unwrap());
        assert_eq!(m.config.strides(), [8, 16, 32]);
        // Stages of 1, 2, 1, 1 residual blocks after their stride-2 block.
        assert_eq!(m.blocks.len(), 2 + 3 + 2 + 2);
        assert_eq!((m.skip_block, m.c4_block, m.c5_block()), (4, 6, Some(8)));
        let strides: u32 = m.blocks.iter().map(|b| b.stride).product();
        assert_eq!(strides, 16, "four stride-2 blocks after the stem");
        let names: Vec<String> = m.params().into_iter().map(|p| p.name).collect();
        for name in [
            "neck.p5.weight",
            "neck.p4.bias",
            "head.out.bias",
            "head16.out.bias",
            "head32.dw.weight",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}");
        }
        let l = Arch::new(&ModelConfig::named("det-l", 2).unwrap());
        assert_eq!(
            l.blocks.len(),
            2 * m.blocks.len() - 4,
            "every residual block twice"
        );
        assert_eq!(
            (l.skip_block, l.c4_block, l.c5_block()),
            (m.skip_block + 3, m.c4_block + 4, Some(l.blocks.len() - 1))
        );
        // det-s is the one-level model it always was.
        let s = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        assert_eq!((s.heads().len(), s.c5_block(), s.c4_block), (1, None, 6));
    }

    #[test]
    fn checkpoints_from_before_levels_read_as_one_level() {
        let old = r#"{"name":"det-m","width":2.0,"input":256,"classes":3}"#;
        let c: ModelConfig = serde_json::from_str(old).unwrap();
        assert_eq!((c.depth, c.levels), (1, 1));
        assert_eq!(Arch::new(&c).heads().len(), 1);
    }

    #[test]
    fn bad_configs_are_refused_by_name() {
        let e = ModelConfig::named("det-x", 2).unwrap_err();
        assert!(e.to_string().contains("det-x"), "{e}");
        assert!(matches!(
            ModelConfig::named("det-s", 0),
            Err(ConfigError::Classes { classes: 0, .. })
        ));
        let mut c = ModelConfig::named("det-s", 2).unwrap();
        c.input = 100;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of 32"));
        // A checkpoint's config is validated on load: no level count or depth outside the
        // family gets as far as building layers.
        let mut c = ModelConfig::named("det-m", 2).unwrap();
        c.levels = 2;
        assert_eq!(c.validate(), Err(ConfigError::Levels(2)));
        c.levels = 3;
        c.depth = 1_000_000;
        assert!(matches!(c.validate(), Err(ConfigError::Depth { .. })));
    }
}
