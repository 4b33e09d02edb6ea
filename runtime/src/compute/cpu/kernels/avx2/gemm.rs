//! The GEMM panels in AVX2 + FMA.

use super::super::operands::{Epilogue, Mat};
use super::super::panel::{self, drive, each_row, PanelRows, RowTiles};
use super::super::portable;
use super::super::Dense3x3Input;
use super::dw3x3::even_odd;

/// `C += alpha·A·B`: the dot kernel where both operands are contiguous along k, the portable
/// loops compiled for AVX2 + FMA elsewhere. Safety: see [`super::super::GemmAccumulate`].
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(in super::super) unsafe fn accumulate(
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
        // SAFETY: AVX2 and FMA as for this function.
        unsafe { dots(m, k, n, alpha, a, b, c, ldc) };
    } else {
        portable::gemm_body(m, k, n, alpha, a, b, c, ldc);
    }
}

/// Rows of C per register tile: 6 × 16 columns is twelve accumulators, with the two B rows and
/// a broadcast fifteen of the sixteen registers. Two FMA pipes of four cycles' latency need
/// eight sums in flight; a 4-row tile had exactly eight, and stalled on them.
const TILE_ROWS: usize = 6;

/// `C ← ep(alpha·A·B + beta·C)` with explicit FMA and the epilogue fused: C in register tiles
/// of up to [`TILE_ROWS`] rows × 16 columns, each B row of the tile loaded once per row set
/// and each A element broadcast once, stored once.
///
/// The loops around the tiles (B's packed panels, k blocks) are [`drive`]'s.
///
/// Safety: see [`super::super::GemmFused`].
#[target_feature(enable = "avx2,fma")]
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
        TILE_ROWS,
        |src, dst| {
            // SAFETY: AVX2 as for this function.
            unsafe { transpose8(src, dst) }
        },
        |t, i, j, w, rows| {
            // SAFETY: AVX2 and FMA as for this function; the tile (rows i.., columns j..j + w) lies inside A, whose last
            // element the caller checked, and among the elements of C it vouched for.
            unsafe {
                match (rows, t.ep.residual.is_some()) {
                    (6, false) => t.tile::<6, false, false>(i, j, w),
                    (5, false) => t.tile::<5, false, false>(i, j, w),
                    (4, false) => t.tile::<4, false, false>(i, j, w),
                    (3, false) => t.tile::<3, false, false>(i, j, w),
                    (2, false) => t.tile::<2, false, false>(i, j, w),
                    (_, false) => t.tile::<1, false, false>(i, j, w),
                    (6, true) => t.tile::<6, true, false>(i, j, w),
                    (5, true) => t.tile::<5, true, false>(i, j, w),
                    (4, true) => t.tile::<4, true, false>(i, j, w),
                    (3, true) => t.tile::<3, true, false>(i, j, w),
                    (2, true) => t.tile::<2, true, false>(i, j, w),
                    (_, true) => t.tile::<1, true, false>(i, j, w),
                }
            }
        },
    );
}

/// [`drive`]'s transposing copy of an 8 × 8 block of B (see there): eight unpacks, eight
/// shuffles and eight 128-bit lane permutations instead of 64 single-float copies. The AVX-512
/// set's too.
///
/// Safety: the CPU has AVX2. Panics unless each `src` holds 8 floats and `dst` 7·16 + 8.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(in super::super) unsafe fn transpose8(src: [&[f32]; 8], dst: &mut [f32]) {
    use std::arch::x86_64::{
        _mm256_loadu_ps, _mm256_permute2f128_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
        _mm256_unpackhi_ps, _mm256_unpacklo_ps,
    };
    let dst = &mut dst[..7 * 16 + 8];
    // Column q of the block in register r[q] (its rows p .. p + 8 in the lanes).
    // SAFETY (loads and stores): each `src[q]` holds 8 floats (cut to 8 here, which panics
    // otherwise) and row r of the block is stored at 16·r .. 16·r + 8 ≤ dst.len().
    unsafe {
        let r = src.map(|s| _mm256_loadu_ps(s[..8].as_ptr()));
        // Pairs of columns interleaved: (c0 c1) rows 0 1 | 4 5, and rows 2 3 | 6 7.
        let lo = |a: usize| _mm256_unpacklo_ps(r[a], r[a + 1]);
        let hi = |a: usize| _mm256_unpackhi_ps(r[a], r[a + 1]);
        let t = [lo(0), hi(0), lo(2), hi(2), lo(4), hi(4), lo(6), hi(6)];
        // Four columns of one row per 128-bit half: rows 0 | 4, 1 | 5, 2 | 6, 3 | 7.
        let u = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        let d = dst.as_mut_ptr();
        for row in 0..4 {
            let (a, b) = (u[row], u[row + 4]);
            _mm256_storeu_ps(d.add(16 * row), _mm256_permute2f128_ps::<0x20>(a, b));
            _mm256_storeu_ps(d.add(16 * (row + 4)), _mm256_permute2f128_ps::<0x31>(a, b));
        }
    }
}

/// See [`super::super::Dense3x3Half`] (and its safety): [`panel::dense3x3_half`]'s loops,
/// eight output columns' even and odd input columns split by [`even_odd`], the tiles of
/// [`fused`].
#[target_feature(enable = "avx2,fma")]
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
    use std::arch::x86_64::_mm256_storeu_ps;
    panel::dense3x3_half(
        x,
        c_in,
        weight,
        m,
        ep,
        out,
        (oh, ow),
        rows,
        8,
        16,
        // Row-major weights: not TILE_ROWS: with B's rows gathered by pointer, a 5- or 6-row
        // tile runs out of registers and recomputes its A pointers every step; timed against
        // 4 rows, alternating run by run in one process, it was no faster. By columns, one
        // pointer reaches every row.
        [4, TILE_ROWS],
        super::elementwise::rgb_row,
        |src, [e, o]| {
            // SAFETY: AVX2 as for this function; `panel::dense3x3_half` hands over 16 floats
            // at `src` and eight at `e` and at `o`.
            unsafe {
                let [even, odd] = even_odd(src);
                _mm256_storeu_ps(e, even);
                _mm256_storeu_ps(o, odd);
            }
        },
        |t, i, j, w, rows| {
            // SAFETY: AVX2 and FMA as for this function; the tile (rows i.., columns
            // j..j + w) lies inside the weights and the output, as the contract says.
            unsafe {
                match (t.a.rs == 1, rows) {
                    (true, 6) => t.tile::<6, false, true>(i, j, w),
                    (true, 5) => t.tile::<5, false, true>(i, j, w),
                    (true, 4) => t.tile::<4, false, true>(i, j, w),
                    (true, 3) => t.tile::<3, false, true>(i, j, w),
                    (true, 2) => t.tile::<2, false, true>(i, j, w),
                    (true, _) => t.tile::<1, false, true>(i, j, w),
                    (false, 4) => t.tile::<4, false, false>(i, j, w),
                    (false, 3) => t.tile::<3, false, false>(i, j, w),
                    (false, 2) => t.tile::<2, false, false>(i, j, w),
                    (false, _) => t.tile::<1, false, false>(i, j, w),
                }
            }
        },
    );
}

impl<P: PanelRows> RowTiles<'_, P> {
    /// Rows `i .. i + R`, columns `j .. j + w` (`w ≤ 16`) of C; with `RES`, the epilogue's
    /// residual added (which must then be given). With `COLUMNS`, A's columns are contiguous
    /// (`a.rs == 1`: its `R` rows at step `p` are consecutive floats) and read through one
    /// pointer: six rows then fit in the registers where six row pointers, with B's rows
    /// gathered by pointer, did not. (One function with the epilogue inline: with the
    /// epilogue in a function of its own, the sums were stored to the stack at every step.)
    ///
    /// Safety: the CPU has AVX2 and FMA; rows `i .. i + R` and columns `k0 .. k0 + kl`
    /// are inside A (whose `rs` is 1 with `COLUMNS`), and rows `i .. i + R`, columns
    /// `j .. j + w` inside C (whose last elements the caller checked against their slices).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile<const R: usize, const RES: bool, const COLUMNS: bool>(
        &self,
        i: usize,
        j: usize,
        w: usize,
    ) {
        use std::arch::x86_64::{
            __m256i, _mm256_add_ps, _mm256_broadcast_ss, _mm256_cmpgt_epi32, _mm256_fmadd_ps,
            _mm256_loadu_ps, _mm256_maskload_ps, _mm256_maskstore_ps, _mm256_max_ps, _mm256_mul_ps,
            _mm256_set1_epi32, _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps,
            _mm256_storeu_ps,
        };
        let a = &self.a;
        let full = w == 16;
        // Lane l of half h is live when 8·h + l < w.
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mask: [__m256i; 2] = [
            _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32), lanes),
            _mm256_cmpgt_epi32(_mm256_set1_epi32(w as i32 - 8), lanes),
        ];
        // SAFETY (all raw accesses below): the panel's rows p < rows(), 16 floats each
        // (`PanelRows`' contract); A reads (i + r, k0 + p) with r < R, p < kl; C accesses
        // (i + r)·ldc + j + 8h .. + 8, and the residual the same elements, live lanes only
        // when ragged; all inside the checked views. Pointers that may point past them are
        // formed with wrapping arithmetic.
        unsafe {
            // Row i of A at column k0.
            let a0 = a.data.as_ptr().wrapping_add(i * a.rs + self.k0 * a.cs);
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            if COLUMNS {
                debug_assert_eq!(a.rs, 1);
                // A's rows i .. i + R at column k0 + p: the R floats from `ac`.
                let mut ac = a0;
                for p in 0..self.panel.rows() {
                    let row = self.panel.row(p);
                    let b0 = _mm256_loadu_ps(row);
                    let b1 = _mm256_loadu_ps(row.add(8));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm256_broadcast_ss(&*ac.add(r));
                        acc[0] = _mm256_fmadd_ps(av, b0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(av, b1, acc[1]);
                    }
                    ac = ac.wrapping_add(a.cs);
                }
            } else {
                let mut ap: [*const f32; R] = std::array::from_fn(|r| a0.wrapping_add(r * a.rs));
                for p in 0..self.panel.rows() {
                    let row = self.panel.row(p);
                    let b0 = _mm256_loadu_ps(row);
                    let b1 = _mm256_loadu_ps(row.add(8));
                    for r in 0..R {
                        let av = _mm256_broadcast_ss(&*ap[r]);
                        ap[r] = ap[r].wrapping_add(a.cs);
                        acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
                    }
                }
            }
            // The epilogue in passes over the tile, each choice made once a tile rather than at
            // every vector (they had been a fifth of a k = 32 tile's instructions): alpha ≠ 1
            // and beta ≠ 0 (the backward GEMMs) only where they apply, no bias as −0.0 (x + −0
            // is x bit for bit), the ReLU, the residual, then the stores, in the order the
            // sums were always formed. Every residual load comes before every store: a load
            // after the store of the row above it would wait on that store wherever the two
            // tensors lie a multiple of 4 KiB apart (planes of 32×32 floats are 4 KiB), which
            // the load cannot tell from a real dependency (4K aliasing).
            let at = |r: usize, h: usize| (i + r) * self.ldc + j + 8 * h;
            if self.alpha != 1.0 {
                let al = _mm256_set1_ps(self.alpha);
                each_row::<R>(|r| acc[r] = acc[r].map(|v| _mm256_mul_ps(al, v)));
            }
            if self.beta != 0.0 {
                let be = _mm256_set1_ps(self.beta);
                each_row::<R>(|r| {
                    for (h, v) in acc[r].iter_mut().enumerate() {
                        let o = self.c.wrapping_add(at(r, h));
                        let old = if full {
                            _mm256_loadu_ps(o)
                        } else {
                            _mm256_maskload_ps(o, mask[h])
                        };
                        *v = _mm256_fmadd_ps(be, old, *v);
                    }
                });
            }
            each_row::<R>(|r| {
                let bias = _mm256_set1_ps(self.ep.bias.map_or(-0.0, |bs| bs[i + r]));
                acc[r] = acc[r].map(|v| _mm256_add_ps(v, bias));
            });
            if self.ep.relu {
                let zero = _mm256_setzero_ps();
                each_row::<R>(|r| acc[r] = acc[r].map(|v| _mm256_max_ps(v, zero)));
            }
            match (RES, self.ep.residual) {
                (true, Some(res)) if full => each_row::<R>(|r| {
                    for (h, v) in acc[r].iter_mut().enumerate() {
                        *v =
                            _mm256_add_ps(*v, _mm256_loadu_ps(res.as_ptr().wrapping_add(at(r, h))));
                    }
                }),
                (true, Some(res)) => each_row::<R>(|r| {
                    for (h, v) in acc[r].iter_mut().enumerate() {
                        let rp = res.as_ptr().wrapping_add(at(r, h));
                        *v = _mm256_add_ps(*v, _mm256_maskload_ps(rp, mask[h]));
                    }
                }),
                _ => {}
            }
            if full {
                each_row::<R>(|r| {
                    for (h, v) in acc[r].iter().enumerate() {
                        _mm256_storeu_ps(self.c.wrapping_add(at(r, h)), *v);
                    }
                });
            } else {
                each_row::<R>(|r| {
                    for (h, v) in acc[r].iter().enumerate() {
                        _mm256_maskstore_ps(self.c.wrapping_add(at(r, h)), mask[h], *v);
                    }
                });
            }
        }
    }
}

/// The dot path of [`portable::gemm_body`] (both operands contiguous along k, as in `dW += G·Xᵀ`) with
/// explicit AVX2: the compiler's own vectoriser makes a shuffle-bound mess of a register
/// tile. Tiles of 4 rows × 2 columns of C share their loads (6 vector loads per 8 FMAs
/// instead of 16), and k is cut into blocks so that the block's rows of B stay in cache
/// while every row tile passes over them.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn dots(
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
                // SAFETY: dots runs only on CPUs with AVX2 and FMA.
                let s = unsafe { dot_tile(ar, [bcol(j), bcol(j + 1)]) };
                for (r, sr) in s.iter().enumerate() {
                    for (q, v) in sr.iter().enumerate() {
                        c[(i + r) * ldc + j + q] += alpha * v;
                    }
                }
            }
            for j in n2..n {
                // SAFETY: as above.
                let s = unsafe { dot_tile(ar, [bcol(j)]) };
                for (r, sr) in s.iter().enumerate() {
                    c[(i + r) * ldc + j] += alpha * sr[0];
                }
            }
        }
        for i in m4..m {
            for j in 0..n {
                // SAFETY: as above.
                let s = unsafe { dot_tile([arow(i)], [bcol(j)]) };
                c[i * ldc + j] += alpha * s[0][0];
            }
        }
    }
}

/// `R × Q` dot products of equally long rows; every loaded vector of `a` serves `Q`
/// products and every one of `b` serves `R`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_tile<const R: usize, const Q: usize>(
    a: [&[f32]; R],
    b: [&[f32]; Q],
) -> [[f32; Q]; R] {
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    };
    let kl = a[0].len();
    let n8 = kl / 8;
    // Cut every row to kl first (panics if one is shorter), so reading 8 floats at 8·p
    // for p < n8 stays inside each of them.
    let ap = a.map(|s| s[..kl].as_ptr());
    let bp = b.map(|s| s[..kl].as_ptr());
    let mut out = [[0f32; Q]; R];
    // SAFETY: the CPU has AVX2 and FMA (the caller's contract); every load reads
    // 8·p .. 8·p + 8 ≤ kl floats of a row checked above, and loadu/storeu need no
    // alignment.
    unsafe {
        let mut acc: [[__m256; Q]; R] = [[_mm256_setzero_ps(); Q]; R];
        for p in 0..n8 {
            let mut bv = [_mm256_setzero_ps(); Q];
            for q in 0..Q {
                bv[q] = _mm256_loadu_ps(bp[q].add(8 * p));
            }
            for r in 0..R {
                let av = _mm256_loadu_ps(ap[r].add(8 * p));
                for q in 0..Q {
                    acc[r][q] = _mm256_fmadd_ps(av, bv[q], acc[r][q]);
                }
            }
        }
        for r in 0..R {
            for q in 0..Q {
                let mut v = [0f32; 8];
                _mm256_storeu_ps(v.as_mut_ptr(), acc[r][q]);
                let mut s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
                for p in n8 * 8..kl {
                    s += a[r][p] * b[q][p];
                }
                out[r][q] = s;
            }
        }
    }
    out
}
