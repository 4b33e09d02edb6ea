//! The detector's loss ([`CenterLoss`]): focal loss on the heat maps plus masked L1 on offsets
//! and log sizes and GIoU on the boxes, and its gradient with respect to the predictions.
//!
//! Sums are taken in `f64` (the reference the GPU's `f32` reduction is checked against).

use crate::compute::ops::{giou, CenterLoss};

/// The loss and its parts, as the loss tensor holds them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossParts {
    pub total: f32,
    pub focal: f32,
    pub offset: f32,
    pub size: f32,
    /// Centre cells in the batch (the `N` everything is divided by, before `max(1, ·)`).
    pub centres: f32,
    /// The weighted `1 − GIoU` term.
    pub giou: f32,
}

impl LossParts {
    /// `[total, focal, offset, size, centres, giou]`: the layout of the loss tensor.
    pub fn to_array(&self) -> [f32; 6] {
        [
            self.total,
            self.focal,
            self.offset,
            self.size,
            self.centres,
            self.giou,
        ]
    }

    pub fn from_array(a: [f32; 6]) -> LossParts {
        LossParts {
            total: a[0],
            focal: a[1],
            offset: a[2],
            size: a[3],
            centres: a[4],
            giou: a[5],
        }
    }
}

/// One heat-map value's focal term (CenterNet's, with `p = sigmoid(z)`): its loss and the
/// loss's derivative by the logit `z`.
///
/// - `y = 1`: `−(1 − p)^α · ln p`, derivative `(1 − p)^α · (α·p·ln p − (1 − p))`;
/// - else: `−(1 − y)^β · p^α · ln(1 − p)`, derivative `(1 − y)^β · p^α · (p − α(1 − p) ln(1 − p))`.
///
/// With `ln p = −softplus(−z)` and `ln(1 − p) = −softplus(z)`, both sigmoids and both softpluses
/// come from one `exp(−|z|)` and one `ln_1p`, and the powers are multiplications (see
/// [`power`]): with 80 classes the heat maps are most of a step's values, and the powers and
/// logarithms made a quarter of its time.
#[inline]
fn focal_term(z: f32, y: f32, alpha: f32, beta: f32) -> (f32, f32) {
    let e = (-z.abs()).exp();
    let tail = e.ln_1p(); // softplus(−|z|)
    let r = 1.0 / (1.0 + e);
    // sigmoid(z) and sigmoid(−z), each without cancellation.
    let (sp, sn) = if z >= 0.0 { (r, e * r) } else { (e * r, r) };
    if y == 1.0 {
        let softplus_neg = (-z).max(0.0) + tail;
        let w = power(sn, alpha);
        (w * softplus_neg, w * (-alpha * sp * softplus_neg - sn))
    } else {
        let softplus_pos = z.max(0.0) + tail;
        let w = power(1.0 - y, beta) * power(sp, alpha);
        (w * softplus_pos, w * (sp + alpha * sn * softplus_pos))
    }
}

/// `x^a`: by multiplication for whole exponents up to 8 (the family's α = 2 and β = 4), `powf`
/// otherwise. The same rule, multiplied in the same order, as `pow_e` in `shaders/loss.glsl`:
/// keep the two in step.
#[inline]
fn power(x: f32, a: f32) -> f32 {
    if a == a.floor() && (0.0..=8.0).contains(&a) {
        (0..a as u32).fold(1.0, |r, _| r * x)
    } else {
        x.powf(a)
    }
}

/// `1 / (1 + e^−x)` without overflow (also the decoder's score).
pub(crate) fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn check(op: &CenterLoss, pred: &[f32], target: &[f32]) {
    assert!(
        pred.len() >= op.pred_len() && target.len() >= op.target_len(),
        "loss: short tensors"
    );
}

/// The loss of `pred` against `target`.
pub fn center_loss(op: &CenterLoss, pred: &[f32], target: &[f32]) -> LossParts {
    check(op, pred, target);
    let plane = op.grid_h as usize * op.grid_w as usize;
    let c = op.classes as usize;
    let (mut focal, mut offset, mut size, mut boxes, mut centres) = (0f64, 0f64, 0f64, 0f64, 0u64);
    for b in 0..op.n as usize {
        let p = &pred[b * (c + 4) * plane..(b + 1) * (c + 4) * plane];
        let t = &target[b * (c + 5) * plane..(b + 1) * (c + 5) * plane];
        for (&z, &y) in p[..c * plane].iter().zip(&t[..c * plane]) {
            focal += focal_term(z, y, op.alpha, op.beta).0 as f64;
        }
        let mask = &t[(c + 4) * plane..(c + 5) * plane];
        for (cell, &m) in mask.iter().enumerate().filter(|(_, &m)| m > 0.0) {
            centres += u64::from(m == 1.0);
            let m = m as f64;
            for k in 0..2 {
                offset += m * (p[(c + k) * plane + cell] - t[(c + k) * plane + cell]).abs() as f64;
                size += m
                    * (p[(c + 2 + k) * plane + cell] - t[(c + 2 + k) * plane + cell]).abs() as f64;
            }
            boxes +=
                m * giou(regression(p, c, plane, cell), regression(t, c, plane, cell)).0 as f64;
        }
    }
    let norm = centres.max(1) as f64;
    let focal = focal / norm;
    let offset = op.offset_weight as f64 * offset / norm;
    let size = op.size_weight as f64 * size / norm;
    let boxes = op.giou_weight as f64 * boxes / norm;
    LossParts {
        total: (focal + offset + size + boxes) as f32,
        focal: focal as f32,
        offset: offset as f32,
        size: size as f32,
        centres: centres as f32,
        giou: boxes as f32,
    }
}

/// The four regression channels (offset x/y, log w/h) of `cell`, in a tensor of `classes`
/// heat-map channels before them.
fn regression(x: &[f32], classes: usize, plane: usize, cell: usize) -> [f32; 4] {
    std::array::from_fn(|k| x[(classes + k) * plane + cell])
}

/// The gradient of [`center_loss`] with respect to `pred`, into `grad` (overwritten);
/// `centres` is the count [`center_loss`] reported.
pub fn center_loss_backward(
    op: &CenterLoss,
    pred: &[f32],
    target: &[f32],
    centres: f32,
    grad: &mut [f32],
) {
    check(op, pred, target);
    assert!(grad.len() >= op.pred_len(), "loss: short gradient");
    let plane = op.grid_h as usize * op.grid_w as usize;
    let c = op.classes as usize;
    let inv = 1.0 / centres.max(1.0);
    for b in 0..op.n as usize {
        let p = &pred[b * (c + 4) * plane..(b + 1) * (c + 4) * plane];
        let t = &target[b * (c + 5) * plane..(b + 1) * (c + 5) * plane];
        let g = &mut grad[b * (c + 4) * plane..(b + 1) * (c + 4) * plane];
        for ((gi, &z), &y) in g[..c * plane]
            .iter_mut()
            .zip(&p[..c * plane])
            .zip(&t[..c * plane])
        {
            *gi = inv * focal_term(z, y, op.alpha, op.beta).1;
        }
        let mask = &t[(c + 4) * plane..(c + 5) * plane];
        for k in 0..4 {
            let weight = if k < 2 {
                op.offset_weight
            } else {
                op.size_weight
            };
            let ch = (c + k) * plane;
            for (cell, &m) in mask.iter().enumerate() {
                let d = p[ch + cell] - t[ch + cell];
                g[ch + cell] = if m > 0.0 && d != 0.0 {
                    m * weight * inv * d.signum()
                } else {
                    0.0
                };
            }
        }
        for (cell, &m) in mask.iter().enumerate().filter(|(_, &m)| m > 0.0) {
            let (_, d) = giou(regression(p, c, plane, cell), regression(t, c, plane, cell));
            for (k, dk) in d.into_iter().enumerate() {
                g[(c + k) * plane + cell] += m * op.giou_weight * inv * dk;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::SplitMix64;
    use crate::compute::cpu::gradcheck::{
        assert_close, numeric_grad_f64, random_vec, sign_signature,
    };

    /// A small random problem: heat targets in [0, 1) with some exact 1s and centre cells
    /// (mask 1), and neighbour cells of mask 0.4 between them.
    fn problem(rng: &mut SplitMix64, op: &CenterLoss) -> (Vec<f32>, Vec<f32>) {
        let plane = (op.grid_h * op.grid_w) as usize;
        let c = op.classes as usize;
        let pred = random_vec(rng, op.pred_len(), -3.0, 3.0);
        let mut target = random_vec(rng, op.target_len(), 0.0, 0.95);
        for b in 0..op.n as usize {
            let t = &mut target[b * (c + 5) * plane..(b + 1) * (c + 5) * plane];
            t[(c + 4) * plane..].fill(0.0);
            for cell in (0..plane).step_by(3) {
                t[(cell % c) * plane + cell] = 1.0;
                t[(c + 4) * plane + cell] = 1.0;
            }
            for cell in (1..plane).step_by(6) {
                t[(c + 4) * plane + cell] = 0.4;
            }
        }
        (pred, target)
    }

    /// An independent `f64` transcription of the loss (from the ops.rs formulas, not this
    /// module's), returning the signs of the L1 differences as the kink signature.
    fn reference(op: &CenterLoss, pred: &[f64], target: &[f32]) -> (f64, u64) {
        let plane = (op.grid_h * op.grid_w) as usize;
        let c = op.classes as usize;
        let (mut sum, mut n, mut diffs) = (0.0, 0.0, Vec::new());
        for b in 0..op.n as usize {
            let p = &pred[b * (c + 4) * plane..];
            let t = &target[b * (c + 5) * plane..];
            for i in 0..c * plane {
                let prob = 1.0 / (1.0 + (-p[i]).exp());
                let y = t[i] as f64;
                sum += if y == 1.0 {
                    -(1.0 - prob).powf(op.alpha as f64) * prob.ln()
                } else {
                    -(1.0 - y).powf(op.beta as f64) * prob.powf(op.alpha as f64) * (1.0 - prob).ln()
                };
            }
            for cell in 0..plane {
                let m = t[(c + 4) * plane + cell] as f64;
                if m == 1.0 {
                    n += 1.0;
                }
                if m > 0.0 {
                    for k in 0..4 {
                        let d = p[(c + k) * plane + cell] - t[(c + k) * plane + cell] as f64;
                        let w = if k < 2 {
                            op.offset_weight
                        } else {
                            op.size_weight
                        } as f64;
                        sum += m * w * d.abs();
                        diffs.push(d);
                    }
                    let at = |x: &[f64], k: usize| x[(c + k) * plane + cell];
                    let tf: Vec<f64> = (0..4).map(|k| t[(c + k) * plane + cell] as f64).collect();
                    let pf: Vec<f64> = (0..4).map(|k| at(p, k)).collect();
                    let (loss, edges) = giou_reference(&pf, &tf);
                    sum += m * op.giou_weight as f64 * loss;
                    diffs.extend(edges);
                }
            }
        }
        (sum / f64::max(n, 1.0), sign_signature(diffs))
    }

    /// `1 − GIoU` in `f64` from the definition (areas of boxes and their enclosure), and the
    /// differences of edges whose order decides a kink.
    fn giou_reference(p: &[f64], t: &[f64]) -> (f64, Vec<f64>) {
        let corners = |b: &[f64]| {
            let (w, h) = (b[2].exp(), b[3].exp());
            [
                b[0] - w / 2.0,
                b[1] - h / 2.0,
                b[0] + w / 2.0,
                b[1] + h / 2.0,
            ]
        };
        let (a, b) = (corners(p), corners(t));
        let area = |r: [f64; 4]| (r[2] - r[0]) * (r[3] - r[1]);
        let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
        let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
        let inter = iw * ih;
        let union = area(a) + area(b) - inter;
        let encl = area([
            a[0].min(b[0]),
            a[1].min(b[1]),
            a[2].max(b[2]),
            a[3].max(b[3]),
        ]);
        let giou = inter / union - (encl - union) / encl;
        let kinks = (0..4).map(|k| a[k] - b[k]).chain([
            a[2].min(b[2]) - a[0].max(b[0]),
            a[3].min(b[3]) - a[1].max(b[1]),
        ]);
        (1.0 - giou, kinks.collect())
    }

    #[test]
    fn giou_of_known_boxes_and_its_gradient() {
        // The same box: 0. Half overlapping on x (unit squares): I = 0.5, U = 1.5, C = 1.5.
        assert!(giou([0.3, 0.4, 0.2, -0.1], [0.3, 0.4, 0.2, -0.1]).0.abs() < 1e-6);
        let (l, _) = giou([0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]);
        assert!((l - (1.0 - 1.0 / 3.0)).abs() < 1e-6, "{l}");
        // Apart by one width: I = 0, U = 2, C = 3: 1 + 1/3, and it still pulls them together.
        let (l, g) = giou([2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]);
        assert!((l - 4.0 / 3.0).abs() < 1e-6, "{l}");
        assert!(g[0] > 0.0 && g[1] == 0.0, "{g:?}");
        // Against central differences of the f64 definition, many random pairs.
        let mut rng = SplitMix64::new(21);
        for _ in 0..200 {
            let p = random_vec(&mut rng, 4, -1.5, 1.5);
            let t = random_vec(&mut rng, 4, -1.5, 1.5);
            let (l, g) = giou(p.clone().try_into().unwrap(), t.clone().try_into().unwrap());
            let p64: Vec<f64> = p.iter().map(|&v| v as f64).collect();
            let t64: Vec<f64> = t.iter().map(|&v| v as f64).collect();
            let (want, _) = giou_reference(&p64, &t64);
            assert!((l as f64 - want).abs() < 1e-5, "{p:?} {t:?}: {l} vs {want}");
            let numeric = numeric_grad_f64(&p64, 1e-6, |x| {
                let (v, kinks) = giou_reference(x, &t64);
                (v, sign_signature(kinks))
            });
            assert_close("giou gradient", &g, &numeric, 1e-4);
        }
    }

    #[test]
    fn loss_matches_the_reference_and_its_parts_add_up() {
        let mut rng = SplitMix64::new(11);
        let op = CenterLoss {
            offset_weight: 0.7,
            size_weight: 1.3,
            ..CenterLoss::det_s(2, 3, 5, 7)
        };
        let (pred, target) = problem(&mut rng, &op);
        let parts = center_loss(&op, &pred, &target);
        let pred64: Vec<f64> = pred.iter().map(|&v| v as f64).collect();
        let (want, _) = reference(&op, &pred64, &target);
        assert!(
            (parts.total as f64 / want - 1.0).abs() < 1e-5,
            "{parts:?} vs {want}"
        );
        assert_eq!(parts.centres, 24.0);
        let sum = parts.focal + parts.offset + parts.size + parts.giou;
        assert!((sum / parts.total - 1.0).abs() < 1e-6);
        assert_eq!(LossParts::from_array(parts.to_array()), parts);
    }

    /// The gradient against central differences of the `f64` reference (tight, 1e-4).
    #[test]
    fn gradient_matches_central_differences() {
        let mut rng = SplitMix64::new(12);
        for op in [
            CenterLoss::det_s(1, 2, 4, 3),
            CenterLoss {
                alpha: 1.5,
                beta: 3.0,
                offset_weight: 0.5,
                giou_weight: 2.5,
                ..CenterLoss::det_s(2, 1, 3, 5)
            },
        ] {
            let (pred, target) = problem(&mut rng, &op);
            let parts = center_loss(&op, &pred, &target);
            let mut grad = vec![f32::NAN; op.pred_len()];
            center_loss_backward(&op, &pred, &target, parts.centres, &mut grad);
            let pred64: Vec<f64> = pred.iter().map(|&v| v as f64).collect();
            let want = numeric_grad_f64(&pred64, 1e-6, |p| reference(&op, p, &target));
            assert_close("center loss gradient", &grad, &want, 1e-4);
        }
    }

    /// Extreme logits stay finite (the `softplus` forms), and a confident right answer costs
    /// almost nothing.
    #[test]
    fn extreme_logits_are_finite() {
        let op = CenterLoss::det_s(1, 1, 1, 2);
        let pred = [200.0, -200.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let target = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        let parts = center_loss(&op, &pred, &target);
        assert!(parts.total.is_finite() && parts.total < 1e-6, "{parts:?}");
        let wrong = [-200.0, 200.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let parts = center_loss(&op, &wrong, &target);
        assert!(parts.total.is_finite() && parts.total > 100.0, "{parts:?}");
        let mut grad = [0.0; 10];
        center_loss_backward(&op, &wrong, &target, parts.centres, &mut grad);
        assert!(grad.iter().all(|g| g.is_finite()), "{grad:?}");
    }

    /// The one-`exp` focal term against the textbook formulas in `f64` (with `powf`), for
    /// the family's exponents and for others that take `powf`, across the logits a heat map
    /// holds: value and derivative both.
    #[test]
    fn focal_term_matches_the_formulas_in_f64() {
        // In f64, with ln p = −softplus(−z) and ln(1 − p) = −softplus(z): `(1 − p).ln()` loses
        // the digits a central difference needs at large logits.
        let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
        let softplus = |z: f64| z.max(0.0) + (-z.abs()).exp().ln_1p();
        for (alpha, beta) in [(2.0f32, 4.0f32), (1.5, 3.0), (1.0, 2.5)] {
            for y in [1.0f32, 0.0, 0.3, 0.9] {
                let loss = |z: f64| {
                    let (p, y) = (sigmoid(z), f64::from(y));
                    if y == 1.0 {
                        sigmoid(-z).powf(alpha.into()) * softplus(-z)
                    } else {
                        (1.0 - y).powf(beta.into()) * p.powf(alpha.into()) * softplus(z)
                    }
                };
                for i in -60..=60 {
                    let z = i as f32 * 0.25;
                    let (value, slope) = focal_term(z, y, alpha, beta);
                    let zd = f64::from(z);
                    let (want, h) = (loss(zd), 1e-6);
                    let want_slope = (loss(zd + h) - loss(zd - h)) / (2.0 * h);
                    let close = |got: f32, want: f64| {
                        (f64::from(got) - want).abs() <= 1e-5 * want.abs().max(1e-3)
                    };
                    assert!(
                        close(value, want),
                        "α {alpha} β {beta} y {y} z {z}: {value} vs {want}"
                    );
                    assert!(
                        close(slope, want_slope),
                        "α {alpha} β {beta} y {y} z {z}: slope {slope} vs {want_slope}"
                    );
                }
            }
        }
    }
}
