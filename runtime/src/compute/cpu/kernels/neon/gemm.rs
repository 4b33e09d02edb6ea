//! The GEMM panels in NEON: the same register tiles as the AVX2 set, four 4-lane vectors
//! where AVX2 has two 8-lane ones (4 rows × 16 columns: 16 accumulators and 4 B vectors of
//! the 32 registers).

use std::arch::aarch64::{
    float32x4_t, vaddq_f32, vaddvq_f32, vdupq_n_f32, vfmaq_f32, vfmaq_n_f32, vld1q_f32, vld2q_f32,
    vmaxq_f32, vmulq_n_f32, vreinterpretq_f32_f64, vreinterpretq_f64_f32, vst1q_f32, vtrn1q_f32,
    vtrn1q_f64, vtrn2q_f32, vtrn2q_f64,
};

use super::super::operands::{Epilogue, Mat};
use super::super::panel::{self, drive, PanelRows, RowTiles};
use super::super::portable;
use super::super::Dense3x3Input;

/// `C += alpha·A·B`: the dot kernel where both operands are contiguous along k, the portable
/// loops elsewhere. Safety: see [`super::super::GemmAccumulate`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
) {
    if a.cs == 1 && b.rs == 1 {
        dots(m, k, n, alpha, a, b, c, ldc);
    } else {
        portable::gemm_body(m, k, n, alpha, a, b, c, ldc);
    }
}

/// `C ← ep(alpha·A·B + beta·C)` with explicit FMA and the epilogue fused: C in register tiles
/// of up to 4 rows × 16 columns; the loops around them (B's packed panels, k blocks) are
/// [`drive`]'s.
///
/// Safety: see [`super::super::GemmFused`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn fused(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    ep: Epilogue<'_>,
) {
    drive(
        (m, k, n),
        alpha,
        a,
        b,
        beta,
        c,
        ldc,
        ep,
        4,
        transpose4,
        |t, i, j, w, rows| {
            // SAFETY: The tile (rows i.., columns j..j + w) lies inside A, whose last
            // element the caller checked, and among the elements of C it vouched for.
            unsafe {
                match rows {
                    4 => t.tile::<4>(i, j, w),
                    3 => t.tile::<3>(i, j, w),
                    2 => t.tile::<2>(i, j, w),
                    _ => t.tile::<1>(i, j, w),
                }
            }
        },
    );
}

/// [`drive`]'s transposing copy of a 4 × 4 block of B (see there): two 32-bit and two
/// 64-bit transposing permutations of each pair instead of 16 single-float copies. Panics
/// unless each `src` holds 4 floats and `dst` 3·16 + 4.
fn transpose4(src: [&[f32]; 4], dst: &mut [f32]) {
    let dst = &mut dst[..3 * 16 + 4];
    // SAFETY: NEON is baseline; each `src` holds 4 floats (cut to 4 here, which panics
    // otherwise) and row r of the block is stored at 16·r .. 16·r + 4 ≤ dst.len().
    unsafe {
        let r = src.map(|s| vld1q_f32(s[..4].as_ptr()));
        // Rows 0 2 and 1 3 of columns (0, 1) and (2, 3), interleaved.
        let (t0, t1) = (vtrn1q_f32(r[0], r[1]), vtrn2q_f32(r[0], r[1]));
        let (t2, t3) = (vtrn1q_f32(r[2], r[3]), vtrn2q_f32(r[2], r[3]));
        let pairs = |a: float32x4_t, b: float32x4_t| {
            let (a, b) = (vreinterpretq_f64_f32(a), vreinterpretq_f64_f32(b));
            (
                vreinterpretq_f32_f64(vtrn1q_f64(a, b)),
                vreinterpretq_f32_f64(vtrn2q_f64(a, b)),
            )
        };
        let (row0, row2) = pairs(t0, t2);
        let (row1, row3) = pairs(t1, t3);
        let d = dst.as_mut_ptr();
        for (r, v) in [row0, row1, row2, row3].into_iter().enumerate() {
            vst1q_f32(d.add(16 * r), v);
        }
    }
}

/// See [`super::super::Dense3x3Half`] (and its safety): [`panel::dense3x3_half`]'s loops,
/// four output columns' even and odd input columns split by one de-interleaving load, the
/// tiles of [`fused`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dense3x3_half(
    x: Dense3x3Input<'_>,
    c_in: usize,
    weight: &[f32],
    m: usize,
    ep: Epilogue<'_>,
    out: *mut f32,
    (oh, ow): (usize, usize),
    rows: std::ops::Range<usize>,
) {
    panel::dense3x3_half(
        x,
        c_in,
        weight,
        m,
        ep,
        out,
        (oh, ow),
        rows,
        4,
        16,
        [4, 4],
        super::elementwise::rgb_row,
        |src, [e, o]| {
            // SAFETY: NEON is baseline; `panel::dense3x3_half` hands over eight floats at
            // `src` and four at `e` and at `o`.
            unsafe {
                let v = vld2q_f32(src);
                vst1q_f32(e, v.0);
                vst1q_f32(o, v.1);
            }
        },
        |t, i, j, w, rows| {
            // SAFETY: the tile (rows i.., columns j..j + w) lies inside the weights and the
            // output, as the contract says.
            unsafe {
                match rows {
                    4 => t.tile::<4>(i, j, w),
                    3 => t.tile::<3>(i, j, w),
                    2 => t.tile::<2>(i, j, w),
                    _ => t.tile::<1>(i, j, w),
                }
            }
        },
    );
}

impl<P: PanelRows> RowTiles<'_, P> {
    /// Rows `i .. i + R`, columns `j .. j + w` (`w ≤ 16`) of C.
    ///
    /// Safety: rows `i .. i + R` and columns `k0 .. k0 + kl` are inside A, and rows
    /// `i .. i + R`, columns `j .. j + w` inside C (whose last elements the caller checked
    /// against their slices).
    #[inline(always)]
    unsafe fn tile<const R: usize>(&self, i: usize, j: usize, w: usize) {
        let a = &self.a;
        // SAFETY (all raw accesses below): the panel's rows p < rows(), 16 floats each
        // (`PanelRows`' contract); A reads (i + r, k0 + p) with r < R, p < kl; C accesses
        // (i + r)·ldc + j .. + w, the residual the same elements (a ragged tile goes through
        // 16-float buffers); all inside the checked views. Pointers that may point past them are formed with wrapping
        // arithmetic.
        unsafe {
            let mut ap: [*const f32; R] = std::array::from_fn(|r| {
                a.data
                    .as_ptr()
                    .wrapping_add((i + r) * a.rs + self.k0 * a.cs)
            });
            let mut acc = [[vdupq_n_f32(0.0); 4]; R];
            for row in 0..self.panel.rows() {
                let p = self.panel.row(row);
                let bv = [
                    vld1q_f32(p),
                    vld1q_f32(p.add(4)),
                    vld1q_f32(p.add(8)),
                    vld1q_f32(p.add(12)),
                ];
                for r in 0..R {
                    let av = *ap[r];
                    ap[r] = ap[r].wrapping_add(a.cs);
                    for h in 0..4 {
                        acc[r][h] = vfmaq_n_f32(acc[r][h], bv[h], av);
                    }
                }
            }
            let zero = vdupq_n_f32(0.0);
            for (r, acc_r) in acc.iter().enumerate() {
                let row = self.c.wrapping_add((i + r) * self.ldc + j);
                let mut buf = [0f32; 16];
                let out = if w == 16 {
                    row
                } else {
                    if self.beta != 0.0 {
                        std::ptr::copy_nonoverlapping(row, buf.as_mut_ptr(), w);
                    }
                    buf.as_mut_ptr()
                };
                let bias = self.ep.bias.map(|bs| vdupq_n_f32(bs[i + r]));
                // The residual's row, likewise through a buffer when ragged.
                let mut res_buf = [0f32; 16];
                let res = self.ep.residual.map(|rs| {
                    let at = rs.as_ptr().wrapping_add((i + r) * self.ldc + j);
                    if w == 16 {
                        at
                    } else {
                        std::ptr::copy_nonoverlapping(at, res_buf.as_mut_ptr(), w);
                        res_buf.as_ptr()
                    }
                });
                for (h, v) in acc_r.iter().enumerate() {
                    let o = out.add(4 * h);
                    let mut v = vmulq_n_f32(*v, self.alpha);
                    if self.beta != 0.0 {
                        v = vfmaq_n_f32(v, vld1q_f32(o), self.beta);
                    }
                    if let Some(bv) = bias {
                        v = vaddq_f32(v, bv);
                    }
                    if self.ep.relu {
                        v = vmaxq_f32(v, zero);
                    }
                    if let Some(rp) = res {
                        v = vaddq_f32(v, vld1q_f32(rp.add(4 * h)));
                    }
                    vst1q_f32(o, v);
                }
                if w < 16 {
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), row, w);
                }
            }
        }
    }
}

/// The dot path (both operands contiguous along k, as in `dW += G·Xᵀ`): tiles of 4 rows ×
/// 2 columns of C share their loads, and k is cut into blocks so that the block's rows of B
/// stay in cache while every row tile passes over them.
#[allow(clippy::too_many_arguments)]
fn dots(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: Mat<'_>,
    b: Mat<'_>,
    c: &mut [f32],
    ldc: usize,
) {
    const KC: usize = 512;
    let (m4, n2) = (m - m % 4, n - n % 2);
    for k0 in (0..k).step_by(KC) {
        let kl = KC.min(k - k0);
        let arow = |i: usize| &a.data[i * a.rs + k0..][..kl];
        let bcol = |j: usize| &b.data[j * b.cs + k0..][..kl];
        for i in (0..m4).step_by(4) {
            let ar = [arow(i), arow(i + 1), arow(i + 2), arow(i + 3)];
            for j in (0..n2).step_by(2) {
                let s = dot_tile(ar, [bcol(j), bcol(j + 1)]);
                for (r, sr) in s.iter().enumerate() {
                    for (q, v) in sr.iter().enumerate() {
                        c[(i + r) * ldc + j + q] += alpha * v;
                    }
                }
            }
            for j in n2..n {
                let s = dot_tile(ar, [bcol(j)]);
                for (r, sr) in s.iter().enumerate() {
                    c[(i + r) * ldc + j] += alpha * sr[0];
                }
            }
        }
        for i in m4..m {
            for j in 0..n {
                c[i * ldc + j] += alpha * dot_tile([arow(i)], [bcol(j)])[0][0];
            }
        }
    }
}

/// `R × Q` dot products of equally long rows; every loaded vector of `a` serves `Q`
/// products and every one of `b` serves `R`.
#[inline(always)]
fn dot_tile<const R: usize, const Q: usize>(a: [&[f32]; R], b: [&[f32]; Q]) -> [[f32; Q]; R] {
    let kl = a[0].len();
    let n4 = kl / 4;
    // Cut every row to kl first (panics if one is shorter), so reading 4 floats at 4·p for
    // p < n4 stays inside each of them.
    let ap = a.map(|s| s[..kl].as_ptr());
    let bp = b.map(|s| s[..kl].as_ptr());
    let mut out = [[0f32; Q]; R];
    // SAFETY: NEON is baseline on aarch64; every load reads 4·p .. 4·p + 4 ≤ kl floats of a
    // row checked above, and vld1q needs no alignment.
    unsafe {
        let mut acc: [[float32x4_t; Q]; R] = [[vdupq_n_f32(0.0); Q]; R];
        for p in 0..n4 {
            let bv: [float32x4_t; Q] = std::array::from_fn(|q| vld1q_f32(bp[q].add(4 * p)));
            for r in 0..R {
                let av = vld1q_f32(ap[r].add(4 * p));
                for q in 0..Q {
                    acc[r][q] = vfmaq_f32(acc[r][q], av, bv[q]);
                }
            }
        }
        for r in 0..R {
            for q in 0..Q {
                let mut s = vaddvq_f32(acc[r][q]);
                for p in n4 * 4..kl {
                    s += a[r][p] * b[q][p];
                }
                out[r][q] = s;
            }
        }
    }
    out
}
