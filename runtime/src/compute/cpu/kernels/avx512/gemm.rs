//! The GEMM panels in AVX-512: a panel row of 16 columns is one register.

use super::super::operands::{Epilogue, Mat};
use super::super::panel::{self, drive_pairs, each_row, PairRows, PanelRows, RowTiles};
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
/// [`TILE_ROWS`] rows × 32 columns (two registers a row, [`RowTiles::pair512`]) where B's
/// panels come two at a time, else × 16; each panel row loaded once per row set, each A
/// element broadcast once a tile row (into both FMAs), each result stored once. The sums are
/// the AVX2 set's, in the same order: each lane adds its products over k one at a time.
///
/// Two registers a row: the eight rows of a 16-column tile keep exactly the eight FMAs in
/// flight that two FMA units of latency 4 need, with nine loads for eight FMAs; sixteen
/// accumulators in 32 columns leave slack and need ten loads for sixteen FMAs. det-s's
/// forward pass took 0.85× the time with them on a Sapphire Rapids core (0.86× on two
/// cores), the training step at batch 2 0.93× (`fulcrum bench compute --cpu-only --ab`, the
/// 16-column tiles as variant A).
///
/// The loops around the tiles (B's packed panels, k blocks) are [`drive_pairs`]'.
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
    drive_pairs(
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
            unsafe {
                if t.ep.residual.is_some() {
                    tile_rows::<_, true, false>(t, i, j, w, rows)
                } else {
                    tile_rows::<_, false, false>(t, i, j, w, rows)
                }
            }
        },
        |t, i, j, w, rows| {
            // SAFETY: as the single tile's: columns j..j + w (w ≤ 32) lie among the
            // elements of C the caller vouched for.
            unsafe {
                if t.ep.residual.is_some() {
                    pair_rows::<_, true, false>(t, i, j, w, rows)
                } else {
                    pair_rows::<_, false, false>(t, i, j, w, rows)
                }
            }
        },
    );
}

/// `$call` with the const `$r` set to `$rows` (1 to [`TILE_ROWS`], anything else taken as 1):
/// a tile's height chosen at run time among its monomorphs.
macro_rules! by_rows {
    ($rows:expr, $r:ident => $call:expr) => {
        by_rows!(@ $rows, $r => $call; 8 7 6 5 4 3 2)
    };
    (@ $rows:expr, $r:ident => $call:expr; $($n:literal)*) => {
        match $rows {
            $($n => {
                const $r: usize = $n;
                $call
            })*
            _ => {
                const $r: usize = 1;
                $call
            }
        }
    };
}

/// [`RowTiles::tile512`] for `rows ≤ TILE_ROWS` chosen at run time.
///
/// Safety: as [`RowTiles::tile512`]'s.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile_rows<P: PanelRows, const RES: bool, const COLUMNS: bool>(
    t: &RowTiles<'_, P>,
    i: usize,
    j: usize,
    w: usize,
    rows: usize,
) {
    // SAFETY: passed on from the caller.
    unsafe { by_rows!(rows, R => t.tile512::<R, RES, COLUMNS>(i, j, w)) }
}

/// [`RowTiles::pair512`] for `rows ≤ TILE_ROWS` chosen at run time where `w > 16`, else
/// [`RowTiles::tile512`] over the pair's first 16 columns.
///
/// Safety: as [`RowTiles::pair512`]'s.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn pair_rows<P: PairRows, const RES: bool, const COLUMNS: bool>(
    t: &RowTiles<'_, P>,
    i: usize,
    j: usize,
    w: usize,
    rows: usize,
) {
    // SAFETY: passed on from the caller.
    unsafe {
        if w > 16 {
            by_rows!(rows, R => t.pair512::<R, RES, COLUMNS>(i, j, w))
        } else {
            tile_rows::<P, RES, COLUMNS>(t, i, j, w, rows)
        }
    }
}

impl<P: PairRows> RowTiles<'_, P> {
    /// Rows `i .. i + R`, columns `j .. j + w` (`16 < w ≤ 32`) of C from two panels, two
    /// registers a row (the second's ragged lanes under a mask); otherwise as
    /// [`RowTiles::tile512`], whose epilogue passes it repeats for both.
    ///
    /// Safety: as [`RowTiles::tile512`]'s, for columns `j .. j + w`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn pair512<const R: usize, const RES: bool, const COLUMNS: bool>(
        &self,
        i: usize,
        j: usize,
        w: usize,
    ) {
        let a = &self.a;
        let mask = live(w - 16);
        // SAFETY: as `tile512`'s, the second register of a row 16 columns on.
        unsafe {
            let a0 = a.data.as_ptr().wrapping_add(i * a.rs + self.k0 * a.cs);
            let mut lo = [_mm512_setzero_ps(); R];
            let mut hi = [_mm512_setzero_ps(); R];
            if COLUMNS {
                debug_assert_eq!(a.rs, 1);
                let mut ac = a0;
                for p in 0..self.panel.rows() {
                    let b0 = _mm512_loadu_ps(self.panel.row(p));
                    let b1 = _mm512_loadu_ps(self.panel.row2(p));
                    for r in 0..R {
                        let av = _mm512_set1_ps(*ac.add(r));
                        lo[r] = _mm512_fmadd_ps(av, b0, lo[r]);
                        hi[r] = _mm512_fmadd_ps(av, b1, hi[r]);
                    }
                    ac = ac.wrapping_add(a.cs);
                }
            } else {
                let mut ap: [*const f32; R] = std::array::from_fn(|r| a0.wrapping_add(r * a.rs));
                for p in 0..self.panel.rows() {
                    let b0 = _mm512_loadu_ps(self.panel.row(p));
                    let b1 = _mm512_loadu_ps(self.panel.row2(p));
                    for r in 0..R {
                        let av = _mm512_set1_ps(*ap[r]);
                        ap[r] = ap[r].wrapping_add(a.cs);
                        lo[r] = _mm512_fmadd_ps(av, b0, lo[r]);
                        hi[r] = _mm512_fmadd_ps(av, b1, hi[r]);
                    }
                }
            }
            let at = |r: usize| (i + r) * self.ldc + j;
            if self.alpha != 1.0 {
                let al = _mm512_set1_ps(self.alpha);
                each_row::<R>(|r| {
                    lo[r] = _mm512_mul_ps(al, lo[r]);
                    hi[r] = _mm512_mul_ps(al, hi[r]);
                });
            }
            if self.beta != 0.0 {
                let be = _mm512_set1_ps(self.beta);
                each_row::<R>(|r| {
                    let c = self.c.wrapping_add(at(r));
                    lo[r] = _mm512_fmadd_ps(be, _mm512_loadu_ps(c), lo[r]);
                    let old = _mm512_maskz_loadu_ps(mask, c.wrapping_add(16));
                    hi[r] = _mm512_fmadd_ps(be, old, hi[r]);
                });
            }
            each_row::<R>(|r| {
                let bias = _mm512_set1_ps(self.ep.bias.map_or(-0.0, |bs| bs[i + r]));
                lo[r] = _mm512_add_ps(lo[r], bias);
                hi[r] = _mm512_add_ps(hi[r], bias);
            });
            if self.ep.relu {
                let zero = _mm512_setzero_ps();
                each_row::<R>(|r| {
                    lo[r] = _mm512_max_ps(lo[r], zero);
                    hi[r] = _mm512_max_ps(hi[r], zero);
                });
            }
            if let (true, Some(res)) = (RES, self.ep.residual) {
                each_row::<R>(|r| {
                    let s = res.as_ptr().wrapping_add(at(r));
                    lo[r] = _mm512_add_ps(lo[r], _mm512_loadu_ps(s));
                    let old = _mm512_maskz_loadu_ps(mask, s.wrapping_add(16));
                    hi[r] = _mm512_add_ps(hi[r], old);
                });
            }
            each_row::<R>(|r| {
                let c = self.c.wrapping_add(at(r));
                _mm512_storeu_ps(c, lo[r]);
                _mm512_mask_storeu_ps(c.wrapping_add(16), mask, hi[r]);
            });
        }
    }
}

/// See [`super::super::Dense3x3Half`] (and its safety): [`panel::dense3x3_half`]'s loops,
/// 16 output columns' even and odd input columns split by two lane permutations, the tiles of
/// [`fused`] (32 columns where the strip has them: det-s's forward 0.98–0.99× the time with
/// 16-column tiles, `bench compute --ab`).
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
        32,
        [TILE_ROWS; 2],
        super::elementwise::rgb_row,
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
            unsafe {
                if t.a.rs == 1 {
                    pair_rows::<_, false, true>(t, i, j, w, rows)
                } else {
                    pair_rows::<_, false, false>(t, i, j, w, rows)
                }
            }
        },
    );
}

impl<P: PanelRows> RowTiles<'_, P> {
    /// Rows `i .. i + R`, columns `j .. j + w` (`w ≤ 16`) of C; with `RES`, the epilogue's
    /// residual added (which must then be given). With `COLUMNS`, A's columns are contiguous
    /// (`a.rs == 1`: its `R` rows at step `p` are consecutive floats) and read through one
    /// pointer instead of one a row. The epilogue is the AVX2 tile's, in passes over the
    /// tile (see there), ragged columns under a lane mask.
    ///
    /// Safety: the CPU has AVX-512F; rows `i .. i + R` and columns `k0 .. k0 + kl` are
    /// inside A (whose `rs` is 1 with `COLUMNS`), and rows `i .. i + R`, columns
    /// `j .. j + w` inside C (whose last elements the caller checked against their slices).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn tile512<const R: usize, const RES: bool, const COLUMNS: bool>(
        &self,
        i: usize,
        j: usize,
        w: usize,
    ) {
        let a = &self.a;
        let mask = live(w);
        // SAFETY (all raw accesses below): the panel's rows p < rows(), 16 floats each
        // (`PanelRows`' contract); A reads (i + r, k0 + p) with r < R, p < kl; C accesses
        // (i + r)·ldc + j .. + w, and the residual the same elements, under the mask of the
        // live lanes (masked-off lanes are never touched, so cannot fault); all inside the
        // checked views. Pointers that may point past them are formed with wrapping
        // arithmetic.
        unsafe {
            // Row i of A at column k0.
            let a0 = a.data.as_ptr().wrapping_add(i * a.rs + self.k0 * a.cs);
            let mut acc = [_mm512_setzero_ps(); R];
            if COLUMNS {
                debug_assert_eq!(a.rs, 1);
                // A's rows i .. i + R at column k0 + p: the R floats from `ac`.
                let mut ac = a0;
                for p in 0..self.panel.rows() {
                    let bv = _mm512_loadu_ps(self.panel.row(p));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        *acc = _mm512_fmadd_ps(_mm512_set1_ps(*ac.add(r)), bv, *acc);
                    }
                    ac = ac.wrapping_add(a.cs);
                }
            } else {
                let mut ap: [*const f32; R] = std::array::from_fn(|r| a0.wrapping_add(r * a.rs));
                for p in 0..self.panel.rows() {
                    let bv = _mm512_loadu_ps(self.panel.row(p));
                    for r in 0..R {
                        let av = _mm512_set1_ps(*ap[r]);
                        ap[r] = ap[r].wrapping_add(a.cs);
                        acc[r] = _mm512_fmadd_ps(av, bv, acc[r]);
                    }
                }
            }
            // Each choice once a tile, every residual load before any store: see the AVX2
            // tile's epilogue.
            let at = |r: usize| (i + r) * self.ldc + j;
            if self.alpha != 1.0 {
                let al = _mm512_set1_ps(self.alpha);
                each_row::<R>(|r| acc[r] = _mm512_mul_ps(al, acc[r]));
            }
            if self.beta != 0.0 {
                let be = _mm512_set1_ps(self.beta);
                each_row::<R>(|r| {
                    let old = _mm512_maskz_loadu_ps(mask, self.c.wrapping_add(at(r)));
                    acc[r] = _mm512_fmadd_ps(be, old, acc[r]);
                });
            }
            each_row::<R>(|r| {
                let bias = _mm512_set1_ps(self.ep.bias.map_or(-0.0, |bs| bs[i + r]));
                acc[r] = _mm512_add_ps(acc[r], bias);
            });
            if self.ep.relu {
                let zero = _mm512_setzero_ps();
                each_row::<R>(|r| acc[r] = _mm512_max_ps(acc[r], zero));
            }
            if let (true, Some(res)) = (RES, self.ep.residual) {
                each_row::<R>(|r| {
                    let old = _mm512_maskz_loadu_ps(mask, res.as_ptr().wrapping_add(at(r)));
                    acc[r] = _mm512_add_ps(acc[r], old);
                });
            }
            each_row::<R>(|r| _mm512_mask_storeu_ps(self.c.wrapping_add(at(r)), mask, acc[r]));
        }
    }
}
