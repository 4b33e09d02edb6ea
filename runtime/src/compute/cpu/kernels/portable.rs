//! The portable set: plain loops the compiler vectorises at its baseline width (SSE2 on
//! x86-64, NEON on aarch64). Every other set is tested against these.

use super::operands::{Mat, Taps, WeightGrad};
use super::KernelSet;
use super::Kernels;

pub(super) static KERNELS: Kernels = Kernels {
    set: KernelSet::Portable,
    gemm_fused: None,
    gemm_accumulate: accumulate,
    dw3x3_conv,
    dw3x3_same: None,
    dw3x3_half: None,
    dense3x3_half: None,
    dw3x3_weight_grad,
    dw3x3_input_grad_s2,
    rgb_row,
    weighted_rows,
    gather_taps: None,
};

/// See [`super::WeightedRows`] (and its safety): a row at a time, in the order every set
/// sums (the first row's product, then each further row's added), zero weights skipped.
pub(super) unsafe fn weighted_rows(src: &[u8], stride: usize, weights: &[f32], out: &mut [f32]) {
    let n = out.len();
    for (o, &b) in out.iter_mut().zip(&src[..n]) {
        *o = weights[0] * f32::from(b);
    }
    for (t, &w) in weights.iter().enumerate().skip(1) {
        if w == 0.0 {
            continue;
        }
        for (o, &b) in out.iter_mut().zip(&src[t * stride..t * stride + n]) {
            *o += w * f32::from(b);
        }
    }
}

/// `C += alpha·A·B` (see [`super::GemmAccumulate`]).
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
) {
    gemm_body(m, k, n, alpha, a, b, c, ldc);
}

/// `C(i, cols) += Σ_p A(i, p)·B(p, cols)` (B's rows contiguous).
#[inline(always)]
fn edge_row(
    i: usize,
    cols: std::ops::Range<usize>,
    k: usize,
    at: &impl Fn(usize, usize) -> f32,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
) {
    if cols.is_empty() {
        return;
    }
    let row = &mut c[i * ldc + cols.start..i * ldc + cols.end];
    for p in 0..k {
        let av = at(i, p);
        let brow = &b.data[p * b.rs + cols.start..p * b.rs + cols.end];
        for (cv, bv) in row.iter_mut().zip(brow) {
            *cv += av * bv;
        }
    }
}

/// `C += alpha·A·B` in loops shaped for the compiler's vectoriser; inlined into the SIMD sets
/// too (compiled with their features) for the layouts they have no explicit kernel for.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_body(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
) {
    let at = |i: usize, p: usize| alpha * a.data[i * a.rs + p * a.cs];
    if b.cs == 1 {
        // Rows of B are contiguous. Register tiles of 4 rows × 16 columns of C are summed
        // over all of k in fixed-size arrays (which the compiler keeps in vector
        // registers), then added to C once; what is left over goes element by element.
        let (m4, n16) = (m - m % 4, n - n % 16);
        for i in (0..m4).step_by(4) {
            for j in (0..n16).step_by(16) {
                let mut acc = [[0f32; 16]; 4];
                for p in 0..k {
                    let brow: &[f32; 16] =
                        b.data[p * b.rs + j..][..16].try_into().expect("16 columns");
                    for (r, acc_row) in acc.iter_mut().enumerate() {
                        let av = at(i + r, p);
                        for l in 0..16 {
                            acc_row[l] += av * brow[l];
                        }
                    }
                }
                for (r, acc_row) in acc.iter().enumerate() {
                    let out = &mut c[(i + r) * ldc + j..][..16];
                    for l in 0..16 {
                        out[l] += acc_row[l];
                    }
                }
            }
        }
        // The right-hand columns of the tiled rows, then the bottom rows.
        for i in 0..m4 {
            edge_row(i, n16..n, k, &at, b, c, ldc);
        }
        for i in m4..m {
            edge_row(i, 0..n, k, &at, b, c, ldc);
        }
    } else if a.cs == 1 && b.rs == 1 {
        // Both operands contiguous along k: each element of C is a dot product, summed in
        // eight lanes (so it vectorises without reordering the caller cannot allow).
        for i in 0..m {
            let arow = &a.data[i * a.rs..][..k];
            for j in 0..n {
                let bcol = &b.data[j * b.cs..][..k];
                let mut lanes = [0f32; 8];
                let (ac, bc) = (arow.chunks_exact(8), bcol.chunks_exact(8));
                let (ar, br) = (ac.remainder(), bc.remainder());
                for (x, y) in ac.zip(bc) {
                    for l in 0..8 {
                        lanes[l] += x[l] * y[l];
                    }
                }
                let mut sum = lanes.iter().sum::<f32>();
                for (x, y) in ar.iter().zip(br) {
                    sum += x * y;
                }
                c[i * ldc + j] += alpha * sum;
            }
        }
    } else {
        for i in 0..m {
            for p in 0..k {
                let av = at(i, p);
                for j in 0..n {
                    c[i * ldc + j] += av * b.data[p * b.rs + j * b.cs];
                }
            }
        }
    }
}

/// `lanes += a·b` in eight independent partial sums (so the compiler can vectorise it); the
/// lanes carry over from row to row, so a tap pays one horizontal sum, not one per row.
#[inline(always)]
pub(crate) fn dot_lanes(lanes: &mut [f32; 8], a: &[f32], b: &[f32]) {
    let b = &b[..a.len()];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ar.iter().zip(br).enumerate() {
        lanes[l] += x * y;
    }
}

/// The sum of eight lanes, pairwise (every set sums its lanes in this order).
#[inline(always)]
pub(crate) fn hsum(acc: &[f32; 8]) -> f32 {
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// See [`super::Dw3x3Conv`].
unsafe fn dw3x3_conv(
    taps: Taps<'_>,
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
) {
    for (oy, o) in out.chunks_exact_mut(ow).enumerate() {
        let t = taps.row(oy, ow);
        for i in 0..ow {
            let a = bias
                + w[0] * t[0][i]
                + w[1] * t[1][i]
                + w[2] * t[2][i]
                + w[3] * t[3][i]
                + w[4] * t[4][i]
                + w[5] * t[5][i]
                + w[6] * t[6][i]
                + w[7] * t[7][i]
                + w[8] * t[8][i];
            o[i] = if relu { a.max(0.0) } else { a };
        }
    }
}

/// See [`super::Dw3x3WeightGrad`].
unsafe fn dw3x3_weight_grad(taps: Taps<'_>, wg: WeightGrad<'_>, ow: usize) -> ([f32; 9], f32) {
    let mut lanes = [[0f32; 8]; 10];
    for (oy, grow) in wg.gy.chunks_exact(ow).enumerate() {
        let d = &mut wg.dst[wg.at + oy * wg.ld..][..ow];
        match wg.y {
            Some(y) => {
                for ((dv, &gv), &yv) in d.iter_mut().zip(grow).zip(&y[oy * ow..][..ow]) {
                    *dv = if yv > 0.0 { gv } else { 0.0 };
                }
            }
            None => d.copy_from_slice(grow),
        }
        let t = taps.row(oy, ow);
        for (lane, tap) in lanes.iter_mut().zip(t) {
            dot_lanes(lane, d, tap);
        }
        for (l, v) in d.iter().enumerate() {
            lanes[9][l % 8] += v;
        }
    }
    let sums: [f32; 10] = std::array::from_fn(|t| hsum(&lanes[t]));
    (std::array::from_fn(|t| sums[t]), sums[9])
}

/// See [`super::Dw3x3InputGradS2`].
unsafe fn dw3x3_input_grad_s2(g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize) {
    let oh = gx.len() / (4 * ow);
    for a in 0..oh {
        s2_pixels(g, w, gx, ow, a, 0..ow);
    }
}

/// Row pair `2a, 2a + 1` of the stride-2 input gradient, columns `2b, 2b + 1` for `b` in
/// `cols` (see [`super::Dw3x3InputGradS2`]): the SIMD sets finish their rows with it.
#[inline(always)]
pub(super) fn s2_pixels(
    g: &[f32],
    w: &[f32; 9],
    gx: &mut [f32],
    ow: usize,
    a: usize,
    cols: std::ops::Range<usize>,
) {
    let ld = ow + 1;
    let (r0, r1) = (&g[a * ld..][..ld], &g[(a + 1) * ld..][..ld]);
    let (top, bottom) = gx[2 * a * 2 * ow..][..4 * ow].split_at_mut(2 * ow);
    for b in cols {
        let (g00, g01, g10, g11) = (r0[b], r0[b + 1], r1[b], r1[b + 1]);
        top[2 * b] = w[4] * g00;
        top[2 * b + 1] = w[3] * g01 + w[5] * g00;
        bottom[2 * b] = w[1] * g10 + w[7] * g00;
        bottom[2 * b + 1] = w[0] * g11 + w[2] * g10 + w[6] * g01 + w[8] * g00;
    }
}

/// See [`super::RgbRow`].
pub(super) unsafe fn rgb_row(src: &[u8], flip: bool, dst: [&mut [f32]; 3]) {
    let w = src.len() / 3;
    for (c, row) in dst.into_iter().enumerate() {
        for (x, px) in src.chunks_exact(3).enumerate() {
            row[if flip { w - 1 - x } else { x }] = px[c] as f32 / 255.0;
        }
    }
}
