//! The detector's architecture as data: a [`ModelConfig`] (variant, width, input size,
//! classes) and the layers it implies ([`Arch`]), from which [`super::graph`] builds the
//! recordings and [`super::init`] the initial weights.
//!
//! `det-s` (DESIGN.md, "The reference detector"): input 3×128×128, a 3×3 stride-2 stem, seven
//! depthwise-separable blocks (three with stride 2, four residual), a neck that projects the
//! last feature map with a pointwise conv (at its own 8×8 size: the conv and nearest
//! upsampling commute), upsamples it and adds it to the 16×16 one (`c4`), and a head of depthwise, pointwise and
//! a final 1×1 convolution to `K + 4` channels at stride 8. Wider or bigger variants come from
//! the width multiplier and the input size, not from new code.

use serde::{Deserialize, Serialize};

/// Which detector and at what size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// `det-s` or `det-m`.
    pub name: String,
    /// Channel multiplier (det-s: 1.0); every width is rounded to a multiple of 8.
    pub width: f32,
    /// Square input side in pixels: the packed records' size, a multiple of 32 from
    /// [`ModelConfig::MIN_INPUT`] to [`ModelConfig::MAX_INPUT`] for a trained model (the
    /// deepest stride is 16 and the output stride 8).
    pub input: u32,
    /// Object classes (`K`).
    pub classes: u32,
}

impl ModelConfig {
    /// A named variant at its usual input size: `det-s` (width 1, input 128) or `det-m`
    /// (width 2, input 256); training takes the size from the data ([`Self::named_at`]).
    pub fn named(name: &str, classes: u32) -> Result<ModelConfig, String> {
        let (width, input) = match name {
            "det-s" => (1.0, 128),
            "det-m" => (2.0, 256),
            _ => return Err(format!("unknown model {name:?}: use det-s or det-m")),
        };
        let config = ModelConfig {
            name: name.to_owned(),
            width,
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
    pub fn named_at(name: &str, classes: u32, input: u32) -> Result<ModelConfig, String> {
        if input % 32 != 0 || !(Self::MIN_INPUT..=Self::MAX_INPUT).contains(&input) {
            return Err(format!(
                "input size {input}: a model trains at a multiple of 32 from {} to {}",
                Self::MIN_INPUT,
                Self::MAX_INPUT
            ));
        }
        let config = ModelConfig {
            input,
            ..Self::named(name, classes)?
        };
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.classes == 0 || self.classes > 1000 {
            return Err(format!("{} classes: a model needs 1 to 1000", self.classes));
        }
        if self.input == 0 || self.input % 32 != 0 || self.input > 1024 {
            return Err(format!(
                "input size {}: it must be a multiple of 32, at most 1024",
                self.input
            ));
        }
        if !(self.width.is_finite() && (0.25..=8.0).contains(&self.width)) {
            return Err(format!("width {}: use 0.25 to 8", self.width));
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

    /// Input pixels per output cell.
    pub const STRIDE: u32 = 8;

    /// Output grid side (`input / 8`).
    pub fn grid(&self) -> u32 {
        self.input / Self::STRIDE
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
    /// Index in `blocks` of the block whose output the neck adds (`c4`, stride 8).
    pub skip_block: usize,
    /// Neck pointwise channels (= the skip block's channels).
    pub neck: u32,
    /// Head depthwise + pointwise width.
    pub head: u32,
}

impl Arch {
    pub fn new(config: &ModelConfig) -> Arch {
        let c = |b| config.channels(b);
        let block = |c_in, c_out, stride, residual| SepBlock {
            c_in: c(c_in),
            c_out: c(c_out),
            stride,
            residual,
        };
        Arch {
            config: config.clone(),
            stem_out: c(16),
            blocks: vec![
                block(16, 32, 2, false),
                block(32, 32, 1, true),
                block(32, 64, 2, false),
                block(64, 64, 1, true),
                block(64, 64, 1, true),
                block(64, 128, 2, false),
                block(128, 128, 1, true),
            ],
            skip_block: 4,
            neck: c(64),
            head: c(64),
        }
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
        let last = self.blocks.last().expect("blocks").c_out;
        conv("neck.pw", last, self.neck, 1);
        conv("head.dw", 1, self.neck, 3);
        conv("head.pw", self.neck, self.head, 1);
        conv("head.out", self.head, self.config.out_channels(), 1);
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
            (256, 32, 32, 256)
        );
        assert!(Arch::new(&m).param_count() > 3 * 54_758);
    }

    #[test]
    fn bad_configs_are_refused_by_name() {
        assert!(ModelConfig::named("det-x", 2)
            .unwrap_err()
            .contains("det-x"));
        assert!(ModelConfig::named("det-s", 0)
            .unwrap_err()
            .contains("classes"));
        let mut c = ModelConfig::named("det-s", 2).unwrap();
        c.input = 100;
        assert!(c.validate().unwrap_err().contains("multiple of 32"));
    }
}
