//! Initial weights: deterministic for a seed, each tensor from its own stream (so adding a
//! layer does not change the others).
//!
//! Convolutions followed by a ReLU get He-uniform weights, `U(−√(6/fan_in), √(6/fan_in))`,
//! and zero biases. The output convolution starts small (`U(−0.01, 0.01)`), and its heat-map
//! biases at `−2.19 = −ln((1 − 0.1)/0.1)`: every cell starts at probability 0.1, so the focal
//! loss of the (mostly empty) heat map starts small and stable (CenterNet's prior).

use super::arch::Arch;
use crate::base::{derive_seed, SplitMix64};

/// The heat-map bias at start: `sigmoid(−2.19) ≈ 0.1`.
pub const HEAT_BIAS: f32 = -2.19;

/// The initial values of every parameter tensor, in [`Arch::params`] order.
pub fn init_params(arch: &Arch, seed: u64) -> Vec<Vec<f32>> {
    let classes = arch.config.classes as usize;
    arch.params()
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let (name, len, fan_in) = (&spec.name, &spec.len(), &spec.fan_in);
            let mut rng = SplitMix64::new(derive_seed(&[seed, 0x1417, i as u64]));
            let mut uniform = |bound: f32| (2.0 * rng.next_f32() - 1.0) * bound;
            // Every level's output conv: head.out, head16.out, head32.out.
            let is_out = name.starts_with("head") && name.contains(".out.");
            if name.ends_with(".bias") {
                (0..*len)
                    .map(|c| {
                        if is_out && c < classes {
                            HEAT_BIAS
                        } else {
                            0.0
                        }
                    })
                    .collect()
            } else if is_out {
                (0..*len).map(|_| uniform(0.01)).collect()
            } else {
                let bound = (6.0 / *fan_in as f32).sqrt();
                (0..*len).map(|_| uniform(bound)).collect()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::ModelConfig;

    #[test]
    fn deterministic_bounded_and_with_the_heat_prior() {
        let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
        let a = init_params(&arch, 7);
        assert_eq!(a, init_params(&arch, 7));
        assert_ne!(a, init_params(&arch, 8));
        let names = arch.params();
        for (spec, v) in names.iter().zip(&a) {
            let (name, len, fan_in) = (&spec.name, &spec.len(), &spec.fan_in);
            assert_eq!(v.len(), *len, "{name}");
            let bound = (6.0 / *fan_in as f32).sqrt();
            if name.ends_with(".weight") {
                assert!(v.iter().all(|x| x.abs() <= bound), "{name}");
            }
        }
        let out_bias = a.last().unwrap();
        assert_eq!(out_bias, &[HEAT_BIAS, HEAT_BIAS, 0.0, 0.0, 0.0, 0.0]);
        let stem = &a[0];
        let mean = stem.iter().sum::<f32>() / stem.len() as f32;
        let spread = stem.iter().map(|x| x * x).sum::<f32>() / stem.len() as f32;
        // U(−b, b) has variance b²/3 = 2/fan_in = 2/27.
        assert!(
            mean.abs() < 0.05 && (spread - 2.0 / 27.0).abs() < 0.015,
            "{mean} {spread}"
        );
    }
}
