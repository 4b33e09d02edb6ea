//! The 3×3 depthwise plane kernels (every depthwise conv of det-s): the operands checked once,
//! then the active kernel set's loops (see [`super::kernels`]).
//!
//! A kernel works on one channel plane whose input has been laid out so that tap `t = 3·ky + kx`
//! of output row `oy` reads the contiguous run `src[at[t] + oy·step ..][.. ow]` (the phases of
//! [`super::depthwise`]).

use super::kernels::{Kernels, Taps, WeightGrad};

/// `out[oy][·] = relu?(bias + Σ_t w[t]·tap_t[oy][·])` for an `oh × ow` output plane.
pub(super) fn conv(
    k: &Kernels,
    taps: Taps<'_>,
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
) {
    assert!(
        ow > 0 && out.len().is_multiple_of(ow),
        "depthwise plane of {} for rows of {ow}",
        out.len()
    );
    taps.check(out.len() / ow, ow);
    // SAFETY: a `Kernels` comes only from the table of a set this CPU runs; the plane's shape
    // and taps were checked just above.
    unsafe { (k.dw3x3_conv)(taps, w, bias, relu, out, ow) }
}

/// Rows `oy0 .. oy0 + out.len() / ow` of an `oh`-row pad-1 plane of stride 1 or 2 read in
/// place (no phases; see [`super::kernels::Dw3x3InPlace`]), where the set has a kernel for
/// it; `false` when it has none and the caller must go through phases.
#[allow(clippy::too_many_arguments)]
pub(super) fn in_place(
    k: &Kernels,
    stride: usize,
    x: &[f32],
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
    (oy0, oh): (usize, usize),
) -> bool {
    let kernel = match stride {
        1 => k.dw3x3_same,
        2 => k.dw3x3_half,
        _ => None,
    };
    let Some(kernel) = kernel else {
        return false;
    };
    assert!(
        ow > 0
            && out.len().is_multiple_of(ow)
            && oy0 + out.len() / ow <= oh
            && x.len() == stride * stride * oh * ow,
        "stride-{stride} depthwise rows {oy0}.. ({}) of {oh} from {} for rows of {ow}",
        out.len(),
        x.len()
    );
    // SAFETY: a table of a set this CPU runs; the planes' shapes were checked just above.
    unsafe { kernel(x, w, bias, relu, out, ow, oy0, oh) };
    true
}

/// The masked output gradient of a plane and its sums against the taps (see [`WeightGrad`]).
pub(super) fn weight_grad(
    k: &Kernels,
    taps: Taps<'_>,
    wg: WeightGrad<'_>,
    ow: usize,
) -> ([f32; 9], f32) {
    assert!(
        ow > 0 && wg.gy.len().is_multiple_of(ow),
        "depthwise gradient of {} for rows of {ow}",
        wg.gy.len()
    );
    let oh = wg.gy.len() / ow;
    taps.check(oh, ow);
    assert!(wg.y.is_none_or(|y| y.len() == wg.gy.len()));
    assert!(oh == 0 || wg.at + (oh - 1) * wg.ld + ow <= wg.dst.len());
    // SAFETY: a table of a set this CPU runs; taps, y and dst were checked just above.
    unsafe { (k.dw3x3_weight_grad)(taps, wg, ow) }
}

/// Input gradient of a 3×3, stride-2, pad-1 depthwise conv whose input is exactly twice its
/// output, as a gather (see [`super::kernels::Dw3x3InputGradS2`]).
pub(super) fn input_grad_s2(k: &Kernels, g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize) {
    assert!(ow > 0);
    let oh = gx.len() / (4 * ow);
    assert_eq!(gx.len(), 4 * oh * ow);
    assert!(g.len() >= (oh + 1) * (ow + 1));
    // SAFETY: a table of a set this CPU runs; sizes checked above.
    unsafe { (k.dw3x3_input_grad_s2)(g, w, gx, ow) }
}
