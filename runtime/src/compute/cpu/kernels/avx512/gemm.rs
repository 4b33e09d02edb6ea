//! The GEMM panels in AVX-512: a panel row of 16 columns is one register.

use super::super::operands::{Epilogue, Mat};
use super::super::panel::{self, drive, PanelRows, RowTiles};
use super::super::Dense3x3Input;
use std::arch::x86_64::{
    __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_max_ps, _mm512_mul_ps, _mm512_permutex2var_ps, _mm512_set1_ps,
    _mm512_setr_epi32, _mm512_setzero_ps, _mm512_storeu_ps,
};

/// Rows of C in one register tile of [`fused`]: eight accumulators of the 32 registers,
/// leaving room for the panel row and the broadcasts in flight.
const TILE_ROWS: usize = 8;

/// The lanes below `w` (`w ≤ 16`).
#[inline(always)]
fn live(w: usize) -> __mmask16 {
    ((1u32 << w) - 1) as __mmask16
}

/// `C ← ep(alpha·A·B + beta·C)` with the epilogue fused: C in register tiles of up to
/// [`TILE_ROWS`] rows × 16 columns, each panel row loaded once per row set, each A element
/// broadcast once (into the FMA), each result stored once. The sums are the AVX2 set's, in
/// the same order: each lane adds its products over k one at a time.
///
/// The loops around the tiles (B's packed panels, k blocks) are [`drive`]'s.
///
/// Safety: see [`super::super::GemmFused`].
#[target_feature(enable = "avx512f,avx2,fma")]
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
            // SAFETY: AVX2 (every AVX-512 CPU of this set has it) as for this function.
            unsafe { super::avx2::gemm::transpose8(src, dst) }
        },
        |t, i, j, w, rows| {
            // SAFETY: AVX-512F as for this function; the tile (rows i.., columns j..j + w)
            // lies inside A, whose last element the caller checked, and among the elements
            // of C it vouched for.
            unsafe { tile_any(t, i, j, w, rows, t.ep.residual.is_some()) }
        },
    );
}

/// [`RowTiles::tile512`] for `rows ≤ TILE_ROWS` chosen at run time.
///
/// Safety: as [`RowTiles::tile512`]'s.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile_any<P: PanelRows>(
    t: &RowTiles<'_, P>,
    i: usize,
    j: usize,
    w: usize,
    rows: usize,
    res: bool,
) {
    // SAFETY: passed on from the caller.
    unsafe {
        match (rows, res) {
            (8, false) => t.tile512::<8, false>(i, j, w),
            (7, false) => t.tile512::<7, false>(i, j, w),
            (6, false) => t.tile512::<6, false>(i, j, w),
            (5, false) => t.tile512::<5, false>(i, j, w),
            (4, false) => t.tile512::<4, false>(i, j, w),
            (3, false) => t.tile512::<3, false>(i, j, w),
            (2, false) => t.tile512::<2, false>(i, j, w),
            (_, false) => t.tile512::<1, false>(i, j, w),
            (8, true) => t.tile512::<8, true>(i, j, w),
            (7, true) => t.tile512::<7, true>(i, j, w),
            (6, true) => t.tile512::<6, true>(i, j, w),
            (5, true) => t.tile512::<5, true>(i, j, w),
            (4, true) => t.tile512::<4, true>(i, j, w),
            (3, true) => t.tile512::<3, true>(i, j, w),
            (2, true) => t.tile512::<2, true>(i, j, w),
            (_, true) => t.tile512::<1, true>(i, j, w),
        }
    }
}

/// See [`super::super::Dense3x3Half`] (and its safety): [`panel::dense3x3_half`]'s loops,
/// 16 output columns' even and odd input columns split by two lane permutations, the tiles of
/// [`fused`].
#[target_feature(enable = "avx512f,avx2,fma")]
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
    // Indices into (a, b) pairs, b's lanes numbered from 16.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    panel::dense3x3_half(
        x,
        c_in,
        weight,
        m,
        ep,
        out,
        (oh, ow),
        rows,
        16,
        [TILE_ROWS; 2],
        super::avx2::elementwise::rgb_row,
        |src, [e, o]| {
            // SAFETY: AVX-512F as for this function; `panel::dense3x3_half` hands over 32
            // floats at `src` and 16 at `e` and at `o`.
            unsafe {
                let (lo, hi) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16)));
                _mm512_storeu_ps(e, _mm512_permutex2var_ps(lo, even, hi));
                _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo, odd, hi));
            }
        },
        |t, i, j, w, rows| {
            // SAFETY: AVX-512F as for this function; the tile (rows i.., columns
            // j..j + w) lies inside the weights and the output, as the contract says.
            unsafe { tile_any(t, i, j, w, rows, false) }
        },
    );
}

impl<P: PanelRows> RowTiles<'_, P> {
    /// Rows `i .. i + R`, columns `j .. j + w` (`w ≤ 16`) of C; with `RES`, the epilogue's
    /// residual added (which must then be given).
    ///
    /// Safety: the CPU has AVX-512F; rows `i .. i + R` and columns `k0 .. k0 + kl` are
    /// inside A, and rows `i .. i + R`, columns `j .. j + w` inside C (whose last elements
    /// the caller checked against their slices).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn tile512<const R: usize, const RES: bool>(&self, i: usize, j: usize, w: usize) {
        let a = &self.a;
        let mask = live(w);
        // SAFETY (all raw accesses below): the panel's rows p < rows(), 16 floats each
        // (`PanelRows`' contract); A reads (i + r, k0 + p) with r < R, p < kl; C accesses
        // (i + r)·ldc + j .. + w, and the residual the same elements, under the mask of the
        // live lanes (masked-off lanes are never touched, so cannot fault); all inside the
        // checked views. Pointers that may point past them are formed with wrapping
        // arithmetic.
        unsafe {
            let mut ap: [*const f32; R] = std::array::from_fn(|r| {
                a.data
                    .as_ptr()
                    .wrapping_add((i + r) * a.rs + self.k0 * a.cs)
            });
            let mut acc = [_mm512_setzero_ps(); R];
            for p in 0..self.panel.rows() {
                let bv = _mm512_loadu_ps(self.panel.row(p));
                for r in 0..R {
                    let av = _mm512_set1_ps(*ap[r]);
                    ap[r] = ap[r].wrapping_add(a.cs);
                    acc[r] = _mm512_fmadd_ps(av, bv, acc[r]);
                }
            }
            let (al, be) = (_mm512_set1_ps(self.alpha), _mm512_set1_ps(self.beta));
            // With a residual, every value first, then every store (4K aliasing: see the
            // AVX2 tile); without one, each row is stored as soon as it is done.
            for r in 0..R {
                let o = self.c.wrapping_add((i + r) * self.ldc + j);
                let mut v = _mm512_mul_ps(al, acc[r]);
                if self.beta != 0.0 {
                    v = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(mask, o), v);
                }
                if let Some(bs) = self.ep.bias {
                    v = _mm512_add_ps(v, _mm512_set1_ps(bs[i + r]));
                }
                if self.ep.relu {
                    v = _mm512_max_ps(v, _mm512_setzero_ps());
                }
                if let (true, Some(res)) = (RES, self.ep.residual) {
                    let rp = res.as_ptr().wrapping_add((i + r) * self.ldc + j);
                    v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, rp));
                }
                if RES {
                    acc[r] = v;
                } else {
                    _mm512_mask_storeu_ps(o, mask, v);
                }
            }
            if RES {
                for (r, v) in acc.iter().enumerate() {
                    let o = self.c.wrapping_add((i + r) * self.ldc + j);
                    _mm512_mask_storeu_ps(o, mask, *v);
                }
            }
        }
    }
}
