//! Optimiser updates: [`AdamW`] and [`SgdMomentum`], PyTorch's formulations, and the weight
//! average [`Ema`].

use crate::compute::ops::{AdamW, Ema, GradClip, SgdMomentum, CLIP_NORM, CLIP_SCALE, CLIP_SUMS};
use crate::compute::recording::{HYPER_GRAD_SCALE, HYPER_LEN};

/// `e = d·e + (1 − d)·w` over the op's `len` values (two products and a sum, unfused, as the
/// GPU kernel computes it).
pub fn ema(op: &Ema, decay: f32, w: &[f32], e: &mut [f32]) {
    let n = op.len as usize;
    assert!(
        w.len() >= n && e.len() >= n,
        "ema: tensors shorter than {n}"
    );
    let keep = 1.0 - decay;
    for (e, &w) in e[..n].iter_mut().zip(&w[..n]) {
        *e = decay * *e + keep * w;
    }
}

/// AdamW with the op's `lr` and `step` (the bias corrections from [`AdamW::bias_corrections`]).
pub fn adamw(op: &AdamW, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    adamw_with(op, &op.hyper(), w, g, m, v);
}

/// AdamW with the learning rate, bias corrections and gradient scale of `hyper` (as a
/// training step reads them from its hyper-parameter tensor, like the GPU kernel).
pub fn adamw_with(
    op: &AdamW,
    hyper: &[f32; HYPER_LEN],
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
) {
    let n = op.len as usize;
    assert!(
        w.len() >= n && g.len() >= n && m.len() >= n && v.len() >= n,
        "adamw: tensors shorter than {n}"
    );
    let (lr, c1, c2, scale) = (hyper[0], hyper[2], hyper[3], hyper[HYPER_GRAD_SCALE]);
    let decay = 1.0 - lr * op.weight_decay;
    let (b1, b2) = (op.beta1, op.beta2);
    for i in 0..n {
        let gi = g[i] * scale;
        m[i] = b1 * m[i] + (1.0 - b1) * gi;
        v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        let update = (m[i] / c1) / ((v[i] / c2).sqrt() + op.eps);
        w[i] = w[i] * decay - lr * update;
    }
}

/// `Σ x²`, summed in `f64` (the norm only decides a scale; `f64` keeps it independent of
/// the tensor's length).
pub fn sum_squares(x: &[f32]) -> f32 {
    x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() as f32
}

/// The clip step ([`GradClip`]): the norm from `sums[CLIP_SUMS..]`, then `[norm, scale]`
/// into `sums` and the scale into `hyper`.
pub fn clip_grad(op: &GradClip, sums: &mut [f32], hyper: &mut [f32]) {
    let total: f64 = sums[CLIP_SUMS..op.sums_len()]
        .iter()
        .map(|&s| f64::from(s))
        .sum();
    let norm = total.sqrt() as f32;
    let scale = op.scale(norm);
    sums[CLIP_NORM] = norm;
    sums[CLIP_SCALE] = scale;
    hyper[HYPER_GRAD_SCALE] = scale;
}

/// SGD with momentum and L2 weight decay, the gradient multiplied by `grad_scale` first.
pub fn sgd_momentum(
    op: &SgdMomentum,
    grad_scale: f32,
    w: &mut [f32],
    g: &[f32],
    velocity: &mut [f32],
) {
    let n = op.len as usize;
    assert!(
        w.len() >= n && g.len() >= n && velocity.len() >= n,
        "sgd: tensors shorter than {n}"
    );
    for i in 0..n {
        let gi = g[i] * grad_scale + op.weight_decay * w[i];
        velocity[i] = op.momentum * velocity[i] + gi;
        w[i] -= op.lr * velocity[i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adam(len: u32, step: u32, weight_decay: f32) -> AdamW {
        AdamW {
            len,
            lr: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            step,
        }
    }

    /// First step, no decay: `m/c1 = g` and `v/c2 = g²`, so every weight moves by `lr` against
    /// the sign of its gradient, whatever the gradient's size.
    #[test]
    fn first_adamw_step_moves_by_lr_against_the_gradient() {
        let op = adam(3, 1, 0.0);
        let mut w = [1.0, 1.0, 1.0];
        let (mut m, mut v) = ([0.0; 3], [0.0; 3]);
        adamw(&op, &mut w, &[1e-3, -5.0, 0.0], &mut m, &mut v);
        assert!((w[0] - 0.99).abs() < 1e-6, "{w:?}");
        assert!((w[1] - 1.01).abs() < 1e-6, "{w:?}");
        assert_eq!(w[2], 1.0);
    }

    /// Three steps against an `f64` transcription of PyTorch's AdamW.
    #[test]
    fn adamw_matches_a_reference_over_steps() {
        let grads = [[0.5f32, -0.25], [0.1, 0.3], [-0.7, 0.05]];
        let mut w = [0.8f32, -1.2];
        let (mut m, mut v) = ([0.0f32; 2], [0.0f32; 2]);
        let (mut rw, mut rm, mut rv) = ([0.8f64, -1.2], [0.0f64; 2], [0.0f64; 2]);
        for (t, g) in grads.iter().enumerate() {
            let op = adam(2, t as u32 + 1, 0.05);
            adamw(&op, &mut w, g, &mut m, &mut v);
            let (lr, b1, b2) = (op.lr as f64, op.beta1 as f64, op.beta2 as f64);
            for i in 0..2 {
                let gi = g[i] as f64;
                rw[i] *= 1.0 - lr * op.weight_decay as f64;
                rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
                rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
                let mh = rm[i] / (1.0 - b1.powi(t as i32 + 1));
                let vh = rv[i] / (1.0 - b2.powi(t as i32 + 1));
                rw[i] -= lr * mh / (vh.sqrt() + op.eps as f64);
            }
        }
        for i in 0..2 {
            assert!((w[i] as f64 - rw[i]).abs() < 1e-6, "{w:?} vs {rw:?}");
        }
    }

    #[test]
    fn clipping_scales_only_a_norm_above_the_limit() {
        let op = GradClip {
            tensors: 2,
            max_norm: 2.5,
        };
        // Two gradients [3] and [0, 4]: norm 5, twice the limit.
        let mut sums = [9.0, 9.0, sum_squares(&[3.0]), sum_squares(&[0.0, 4.0])];
        let mut hyper = AdamW::frozen_hyper();
        clip_grad(&op, &mut sums, &mut hyper);
        assert_eq!(sums[CLIP_NORM], 5.0);
        assert!((sums[CLIP_SCALE] - 0.5).abs() < 1e-6, "{sums:?}");
        assert_eq!(hyper[HYPER_GRAD_SCALE], sums[CLIP_SCALE]);
        let roomy = GradClip {
            max_norm: 6.0,
            ..op
        };
        clip_grad(&roomy, &mut sums, &mut hyper);
        assert_eq!((sums[CLIP_SCALE], hyper[HYPER_GRAD_SCALE]), (1.0, 1.0));
        assert!(GradClip {
            max_norm: 0.0,
            ..op
        }
        .validate()
        .is_err());
        assert!(GradClip { tensors: 0, ..op }.validate().is_err());
    }

    #[test]
    fn a_scaled_gradient_updates_as_the_scaled_values_would() {
        let op = adam(3, 4, 0.01);
        let g = [0.5f32, -2.0, 0.125];
        let half: Vec<f32> = g.iter().map(|x| x * 0.5).collect();
        let mut hyper = op.hyper();
        hyper[HYPER_GRAD_SCALE] = 0.5;
        let start = (
            [0.3f32, -0.1, 0.7],
            [0.02f32, 0.01, -0.03],
            [0.01f32, 0.2, 0.05],
        );
        let (mut w1, mut m1, mut v1) = start;
        adamw_with(&op, &hyper, &mut w1, &g, &mut m1, &mut v1);
        let (mut w2, mut m2, mut v2) = start;
        adamw(&op, &mut w2, &half, &mut m2, &mut v2);
        assert_eq!((w1, m1, v1), (w2, m2, v2));
        assert_ne!(w1, start.0, "the step moved the weights");
    }

    #[test]
    fn sgd_momentum_accumulates_velocity() {
        let op = SgdMomentum {
            len: 1,
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.5,
        };
        let (mut w, mut vel) = ([2.0f32], [0.0f32]);
        sgd_momentum(&op, 1.0, &mut w, &[1.0], &mut vel);
        // g = 1 + 0.5·2 = 2; v = 2; w = 2 − 0.2.
        assert!((w[0] - 1.8).abs() < 1e-6 && (vel[0] - 2.0).abs() < 1e-6);
        sgd_momentum(&op, 1.0, &mut w, &[1.0], &mut vel);
        // g = 1 + 0.9 = 1.9; v = 1.8 + 1.9 = 3.7; w = 1.8 − 0.37.
        assert!(
            (w[0] - 1.43).abs() < 1e-6 && (vel[0] - 3.7).abs() < 1e-6,
            "{w:?} {vel:?}"
        );
    }

    #[test]
    fn ema_averages_with_the_decay_of_each_step() {
        use crate::compute::ops::{ema_decay, EMA_MAX_DECAY};
        let op = Ema { len: 2 };
        let mut e = [1.0f32, -4.0];
        ema(&op, 0.75, &[3.0, 4.0, 99.0], &mut e);
        assert_eq!(e, [1.5, -2.0]);
        // Decay 0 copies the weights; the schedule rises from 2/11 towards its cap.
        ema(&op, 0.0, &[7.0, 8.0], &mut e);
        assert_eq!(e, [7.0, 8.0]);
        assert!((ema_decay(1) - 2.0 / 11.0).abs() < 1e-7);
        assert!((ema_decay(90) - 91.0 / 100.0).abs() < 1e-7);
        assert_eq!(ema_decay(1_000_000), EMA_MAX_DECAY);
        let d: Vec<f32> = (1..10_000).map(ema_decay).collect();
        assert!(d.windows(2).all(|w| w[0] <= w[1]));
    }
}
