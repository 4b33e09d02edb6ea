//! The detector's loss ([`CenterLoss`]): focal loss on the heat maps plus masked L1 on offsets
//! and log sizes and GIoU on the boxes, and its gradient with respect to the predictions.
//!
//! Sums are taken in `f64` (the reference the GPU's `f32` reduction is checked against).

use super::pool::{Pool, MAX_THREADS};
use super::scratch::{part_range, run_parts, split_parts};
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
/// come from one `exp(−|z|)` and one `ln(1 + that)`, and the powers are multiplications (see
/// [`power`]): with 80 classes the heat maps are most of a step's values, and the powers and
/// logarithms made a quarter of its time.
#[inline]
fn focal_term(z: f32, y: f32, alpha: f32, beta: f32) -> (f32, f32) {
    focal_term_by(z, y, alpha, |x| power(x, alpha), |x| power(x, beta))
}

/// [`focal_term`] with the powers `x^α` and `x^β` given, and without branches: both cases are
/// computed and one chosen, and the exponential and logarithm are [`exp_non_positive`] and
/// [`ln_1p_unit`], so that with [`power_whole`] a loop over values runs in vector lanes.
#[inline(always)]
fn focal_term_by(
    z: f32,
    y: f32,
    alpha: f32,
    pow_alpha: impl Fn(f32) -> f32,
    pow_beta: impl Fn(f32) -> f32,
) -> (f32, f32) {
    let e = exp_non_positive(-z.abs());
    let tail = ln_1p_unit(e); // softplus(−|z|)
    let r = 1.0 / (1.0 + e);
    // sigmoid(z) and sigmoid(−z), each without cancellation.
    let (sp, sn) = if z >= 0.0 { (r, e * r) } else { (e * r, r) };
    let softplus_neg = if z < 0.0 { -z } else { 0.0 } + tail;
    let softplus_pos = if z > 0.0 { z } else { 0.0 } + tail;
    let w1 = pow_alpha(sn);
    let centre = (w1 * softplus_neg, w1 * (-alpha * sp * softplus_neg - sn));
    let w0 = pow_beta(1.0 - y) * pow_alpha(sp);
    let other = (w0 * softplus_pos, w0 * (sp + alpha * sn * softplus_pos));
    if y == 1.0 {
        centre
    } else {
        other
    }
}

/// Most whole exponent [`power`] takes by multiplication (as `pow_e` in `shaders/loss.glsl`).
const WHOLE_POWERS: u32 = 8;

/// Whether [`power`] multiplies for exponent `a`.
fn is_whole_power(a: f32) -> bool {
    a == a.floor() && (0.0..=WHOLE_POWERS as f32).contains(&a)
}

/// `x^a`: by multiplication for whole exponents up to 8 (the family's α = 2 and β = 4), `powf`
/// otherwise. The same rule, multiplied in the same order, as `pow_e` in `shaders/loss.glsl`:
/// keep the two in step.
#[inline]
fn power(x: f32, a: f32) -> f32 {
    if is_whole_power(a) {
        power_whole(x, a as u32)
    } else {
        x.powf(a)
    }
}

/// `x^k` for `k ≤ 8` as [`power`] multiplies it, in a fixed count of steps that each keep or
/// multiply (no loop whose length depends on `k`, so the callers' loops vectorize).
#[inline(always)]
fn power_whole(x: f32, k: u32) -> f32 {
    let mut r = 1.0;
    for i in 0..WHOLE_POWERS {
        r = if i < k { r * x } else { r };
    }
    r
}

/// `e^x` for `x ≤ 0` (Cephes' `expf`: `x = n·ln 2 + r`, a degree-6 polynomial in `r`, `2^n`
/// from the exponent bits; within 2 ulp of the true value), without branches or a library
/// call. Below −87 it gives `e^−87` (the smallest normal float's order), which no caller can
/// tell from the true value: they add it to 1 or multiply it into a term it makes vanish.
#[inline(always)]
fn exp_non_positive(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first exact in few bits, so that n·LN2_HI is exact.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2²³ rounds to a whole number in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // Written so that a NaN passes through (the trainer stops on a NaN loss).
    let x = if x < -87.0 { -87.0 } else { x };
    let t = x * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * r * r + r + 1.0;
    // n is in −126..=0: 2^n is a normal float with exponent bits n + 127.
    let whole = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    p * f32::from_bits(((whole + 127) as u32) << 23)
}

/// `ln(1 + e)` for `0 ≤ e ≤ 1`: `2·atanh(s)` with `s = e / (2 + e) ≤ 1/3`, its series to `s¹⁵`
/// (the next term is under 10⁻⁸ of the sum), without branches or a library call.
#[inline(always)]
fn ln_1p_unit(e: f32) -> f32 {
    let s = e / (2.0 + e);
    let s2 = s * s;
    let series = 1.0
        + s2 * (1.0 / 3.0
            + s2 * (1.0 / 5.0
                + s2 * (1.0 / 7.0
                    + s2 * (1.0 / 9.0 + s2 * (1.0 / 11.0 + s2 * (1.0 / 13.0 + s2 / 15.0))))));
    2.0 * s * series
}

/// Values a heat-map row is cut into: the focal terms of a block are computed first (in vector
/// lanes), then added to the `f64` sum in order.
const FOCAL_BLOCK: usize = 64;

/// The sum of the focal terms of logits `z` against targets `y`.
fn focal_sum(z: &[f32], y: &[f32], alpha: f32, beta: f32) -> f64 {
    let mut sum = 0f64;
    let mut terms = [0f32; FOCAL_BLOCK];
    for (zb, yb) in z.chunks(FOCAL_BLOCK).zip(y.chunks(FOCAL_BLOCK)) {
        let terms = &mut terms[..zb.len()];
        focal_terms::<TERM>(zb, yb, alpha, beta, 1.0, terms);
        sum = terms.iter().fold(sum, |s, &t| s + t as f64);
    }
    sum
}

/// The focal terms' derivatives by the logits `z` (targets `y`), times `scale`, into `grad`.
fn focal_gradient(z: &[f32], y: &[f32], alpha: f32, beta: f32, scale: f32, grad: &mut [f32]) {
    focal_terms::<DERIVATIVE>(z, y, alpha, beta, scale, grad);
}

/// Which half of [`focal_term`]'s pair [`focal_terms`] writes: the term, or its derivative.
const TERM: usize = 0;
const DERIVATIVE: usize = 1;

/// Half `PART` of each value's [`focal_term`], times `scale`, into `out`. Whole exponents
/// (the family's) take the loop of multiplied powers, which runs in vector lanes; others take
/// `powf`. `scale` 1 leaves the terms' bits as they are.
#[inline(always)]
fn focal_terms<const PART: usize>(
    z: &[f32],
    y: &[f32],
    alpha: f32,
    beta: f32,
    scale: f32,
    out: &mut [f32],
) {
    let half = |t: (f32, f32)| if PART == TERM { t.0 } else { t.1 };
    let values = out.iter_mut().zip(z).zip(y);
    if is_whole_power(alpha) && is_whole_power(beta) {
        let (ka, kb) = (alpha as u32, beta as u32);
        for ((o, &z), &y) in values {
            let pa = |x| power_whole(x, ka);
            *o = scale * half(focal_term_by(z, y, alpha, pa, |x| power_whole(x, kb)));
        }
    } else {
        for ((o, &z), &y) in values {
            *o = scale * half(focal_term(z, y, alpha, beta));
        }
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

/// The sums of one image's (or a run of images') loss parts, before the normalisation by the
/// count of centres.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    focal: f64,
    offset: f64,
    size: f64,
    boxes: f64,
    centres: u64,
}

impl Sums {
    fn add(&mut self, o: &Sums) {
        self.focal += o.focal;
        self.offset += o.offset;
        self.size += o.size;
        self.boxes += o.boxes;
        self.centres += o.centres;
    }
}

/// The loss sums of image `b`.
fn image_sums(op: &CenterLoss, pred: &[f32], target: &[f32], b: usize) -> Sums {
    let plane = op.grid_h as usize * op.grid_w as usize;
    let c = op.classes as usize;
    let p = &pred[b * (c + 4) * plane..(b + 1) * (c + 4) * plane];
    let t = &target[b * (c + 5) * plane..(b + 1) * (c + 5) * plane];
    let mut s = Sums {
        focal: focal_sum(&p[..c * plane], &t[..c * plane], op.alpha, op.beta),
        ..Sums::default()
    };
    let mask = &t[(c + 4) * plane..(c + 5) * plane];
    for (cell, &m) in mask.iter().enumerate().filter(|(_, &m)| m > 0.0) {
        s.centres += u64::from(m == 1.0);
        let m = m as f64;
        for k in 0..2 {
            s.offset += m * (p[(c + k) * plane + cell] - t[(c + k) * plane + cell]).abs() as f64;
            s.size +=
                m * (p[(c + 2 + k) * plane + cell] - t[(c + 2 + k) * plane + cell]).abs() as f64;
        }
        s.boxes += m * giou(regression(p, c, plane, cell), regression(t, c, plane, cell)).0 as f64;
    }
    s
}

/// The loss of `pred` against `target`, on the calling thread.
pub fn center_loss(op: &CenterLoss, pred: &[f32], target: &[f32]) -> LossParts {
    center_loss_split(op, pred, target, None, 1)
}

/// [`center_loss`] with the images split over `parts` of `pool`'s threads: with 80 classes the
/// heat maps' focal terms are a fifth of a training step, and on one thread the others waited.
/// Each part sums its own images in order and the parts are added in order, so a given count
/// of parts always gives the same result (another count can differ in the last bits).
pub fn center_loss_split(
    op: &CenterLoss,
    pred: &[f32],
    target: &[f32],
    pool: Option<&Pool>,
    parts: usize,
) -> LossParts {
    check(op, pred, target);
    let n = op.n as usize;
    let parts = parts.clamp(1, MAX_THREADS).min(n.max(1));
    let mut sums = [Sums::default(); MAX_THREADS];
    let items = sums[..parts]
        .iter_mut()
        .enumerate()
        .map(|(i, s)| (part_range(n, parts, i), s));
    run_parts(pool, items, |(images, s)| {
        for b in images {
            s.add(&image_sums(op, pred, target, b));
        }
    });
    let mut all = Sums::default();
    sums[..parts].iter().for_each(|s| all.add(s));
    let norm = all.centres.max(1) as f64;
    let focal = all.focal / norm;
    let offset = op.offset_weight as f64 * all.offset / norm;
    let size = op.size_weight as f64 * all.size / norm;
    let boxes = op.giou_weight as f64 * all.boxes / norm;
    LossParts {
        total: (focal + offset + size + boxes) as f32,
        focal: focal as f32,
        offset: offset as f32,
        size: size as f32,
        centres: all.centres as f32,
        giou: boxes as f32,
    }
}

/// The four regression channels (offset x/y, log w/h) of `cell`, in a tensor of `classes`
/// heat-map channels before them.
fn regression(x: &[f32], classes: usize, plane: usize, cell: usize) -> [f32; 4] {
    std::array::from_fn(|k| x[(classes + k) * plane + cell])
}

/// The gradient of [`center_loss`] with respect to `pred`, into `grad` (overwritten);
/// `centres` is the count [`center_loss`] reported. On the calling thread.
pub fn center_loss_backward(
    op: &CenterLoss,
    pred: &[f32],
    target: &[f32],
    centres: f32,
    grad: &mut [f32],
) {
    center_loss_backward_split(op, pred, target, centres, grad, None, 1);
}

/// [`center_loss_backward`] with the images split over `parts` of `pool`'s threads (each
/// image's gradient is its own, so the result does not depend on the split).
pub fn center_loss_backward_split(
    op: &CenterLoss,
    pred: &[f32],
    target: &[f32],
    centres: f32,
    grad: &mut [f32],
    pool: Option<&Pool>,
    parts: usize,
) {
    check(op, pred, target);
    assert!(grad.len() >= op.pred_len(), "loss: short gradient");
    let n = op.n as usize;
    let parts = parts.clamp(1, MAX_THREADS).min(n.max(1));
    let per_image = (op.classes as usize + 4) * op.grid_h as usize * op.grid_w as usize;
    let inv = 1.0 / centres.max(1.0);
    let items = split_parts(&mut grad[..op.pred_len()], n, per_image, parts);
    run_parts(pool, items, |(images, g)| {
        for (b, gb) in images.zip(g.chunks_exact_mut(per_image)) {
            image_gradient(op, pred, target, b, inv, gb);
        }
    });
}

/// The gradient of image `b` into `g` (that image's part of the gradient), `inv` being one
/// over the batch's count of centres.
fn image_gradient(
    op: &CenterLoss,
    pred: &[f32],
    target: &[f32],
    b: usize,
    inv: f32,
    g: &mut [f32],
) {
    let plane = op.grid_h as usize * op.grid_w as usize;
    let c = op.classes as usize;
    let p = &pred[b * (c + 4) * plane..(b + 1) * (c + 4) * plane];
    let t = &target[b * (c + 5) * plane..(b + 1) * (c + 5) * plane];
    let heat = c * plane;
    focal_gradient(
        &p[..heat],
        &t[..heat],
        op.alpha,
        op.beta,
        inv,
        &mut g[..heat],
    );
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

    #[test]
    fn the_exponential_and_logarithm_are_within_a_few_ulp() {
        // Relative error against f64, in units of f32's epsilon.
        let ulps =
            |got: f32, want: f64| (f64::from(got) / want - 1.0).abs() / f64::from(f32::EPSILON);
        let mut worst = (0f64, 0f64);
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            worst.0 = worst.0.max(ulps(exp_non_positive(x), f64::from(x).exp()));
            let e = i as f32 / 200_000.0;
            if e > 0.0 {
                worst.1 = worst.1.max(ulps(ln_1p_unit(e), f64::from(e).ln_1p()));
            }
        }
        assert!(
            worst.0 < 3.0 && worst.1 < 3.0,
            "exp {} ulp, ln_1p {} ulp",
            worst.0,
            worst.1
        );
        assert_eq!(ln_1p_unit(0.0), 0.0);
        assert_eq!(exp_non_positive(0.0), 1.0);
        // Far below the clamp: the smallest value it gives, not a denormal or NaN.
        assert!(exp_non_positive(-1e30) > 0.0 && exp_non_positive(f32::NEG_INFINITY) > 0.0);
        // A diverged prediction shows in the loss and its gradient, not hidden by the clamp.
        assert!(exp_non_positive(f32::NAN).is_nan() && ln_1p_unit(f32::NAN).is_nan());
        for y in [1.0, 0.0, 0.5] {
            let (value, slope) = focal_term(f32::NAN, y, 2.0, 4.0);
            assert!(value.is_nan() && slope.is_nan(), "y {y}: {value}, {slope}");
        }
        let op = CenterLoss::det_s(1, 2, 3, 3);
        let target = vec![0.0; op.target_len()];
        assert!(center_loss(&op, &vec![f32::NAN; op.pred_len()], &target)
            .total
            .is_nan());
    }

    #[test]
    fn whole_powers_are_multiplied_in_the_shaders_order() {
        let mut rng = SplitMix64::new(5);
        for x in random_vec(&mut rng, 100, 0.0, 1.0) {
            for k in 0..=WHOLE_POWERS {
                let want = (0..k).fold(1.0f32, |r, _| r * x);
                assert_eq!(power_whole(x, k).to_bits(), want.to_bits(), "{x}^{k}");
                assert_eq!(power(x, k as f32).to_bits(), want.to_bits(), "{x}^{k}");
            }
            assert_eq!(power(x, 2.5), x.powf(2.5));
        }
    }

    #[test]
    fn rows_and_thread_splits_agree_with_the_single_values() {
        let mut rng = SplitMix64::new(17);
        for (alpha, beta) in [(2.0f32, 4.0f32), (1.5, 3.0)] {
            let op = CenterLoss {
                alpha,
                beta,
                ..CenterLoss::det_s(5, 3, 6, 7)
            };
            let (pred, target) = problem(&mut rng, &op);
            let heat = 3 * 6 * 7;
            // The rows (vector lanes where the exponents are whole) give each value's term.
            let (z, y) = (&pred[..heat], &target[..heat]);
            let mut grad = vec![0.0; heat];
            focal_gradient(z, y, alpha, beta, 0.5, &mut grad);
            let mut sum = 0f64;
            for i in 0..heat {
                let (value, slope) = focal_term(z[i], y[i], alpha, beta);
                sum += value as f64;
                assert_eq!(grad[i].to_bits(), (0.5 * slope).to_bits(), "value {i}");
            }
            assert_eq!(focal_sum(z, y, alpha, beta), sum);
            // Images split over threads: the same loss up to the order of the sums, the
            // same gradient bit for bit.
            let one = center_loss(&op, &pred, &target);
            let pool = Pool::new(2);
            let two = center_loss_split(&op, &pred, &target, Some(&pool), 2);
            assert!(
                (one.total / two.total - 1.0).abs() < 1e-6,
                "{one:?} vs {two:?}"
            );
            assert_eq!(one.centres, two.centres);
            let mut g1 = vec![0.0; op.pred_len()];
            let mut g2 = vec![1.0; op.pred_len()];
            center_loss_backward(&op, &pred, &target, one.centres, &mut g1);
            center_loss_backward_split(&op, &pred, &target, one.centres, &mut g2, Some(&pool), 2);
            assert!(g1.iter().zip(&g2).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
