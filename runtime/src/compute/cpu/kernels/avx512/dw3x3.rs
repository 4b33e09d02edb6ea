//! The stride-1 3×3 depthwise plane in AVX-512: 16 outputs a vector, the plane's zero border
//! by lane masks. A masked-off lane of a load reads zero and touches no memory, so the
//! edges need no code of their own (the AVX2 kernel builds them by lane shifts and blends,
//! in a variant per edge), and a plane narrower than 16 columns whose width divides 16
//! (det-s's 8 × 8) fills a vector with whole rows. The stride-2 plane likewise, its even and
//! odd input columns split by lane permutations.

use std::arch::x86_64::{
    __m512, __m512i, __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_max_ps, _mm512_permutex2var_ps, _mm512_set1_ps,
    _mm512_setr_epi32, _mm512_setzero_ps,
};

/// Every lane.
const ALL: __mmask16 = 0xFFFF;

/// For a plane `2^s` columns wide (`s ≤ 4`), filling a vector with whole rows: the lanes
/// whose column has one to its left (`l % 2^s ≠ 0`), and one to its right. Tabled: worked out
/// lane by lane with a division each, on every call, they had made the kernel slower than the
/// AVX2 one.
const HAS_LEFT: [__mmask16; 5] = [0, 0xAAAA, 0xEEEE, 0xFEFE, 0xFFFE];
const HAS_RIGHT: [__mmask16; 5] = [0, 0x5555, 0x7777, 0x7F7F, 0x7FFF];

/// The lanes below `n` (all of them from 16 up).
#[inline(always)]
fn lanes_below(n: usize) -> __mmask16 {
    if n >= 16 {
        ALL
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// See [`super::super::Dw3x3InPlace`] (stride 1, and its safety). Each output is summed as
/// the AVX2 kernel sums it: the row above's taps onto the bias, plus the middle row's, plus
/// the row below's (a row past the plane's edge adds nothing).
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(in super::super) unsafe fn same(
    x: &[f32],
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
    oy0: usize,
    oh: usize,
) {
    let (k, rows) = Plane::new(x, w, bias, relu, out.len(), ow, (oy0, oh), 1);
    let o = out.as_mut_ptr();
    if ow.is_power_of_two() && ow < 16 {
        // Whole rows a vector: lane l is column l % ow of its row (ow = 2^s).
        let s = ow.trailing_zeros() as usize;
        let (left, right) = (HAS_LEFT[s], HAS_RIGHT[s]);
        let (start, end) = (oy0 * ow, (oy0 + rows) * ow);
        for f in (start..end).step_by(16) {
            let live = lanes_below(end - f);
            // Lanes whose row has one above (f + l ≥ ow), and one below.
            let above = !lanes_below(ow.saturating_sub(f));
            let below = lanes_below((oh * ow - ow).saturating_sub(f));
            // SAFETY: AVX-512F as for this function; output lanes f − start + l < end −
            // start = out.len() for the live lanes; the taps as `Plane::chunk` requires.
            unsafe {
                k.chunk::<true, true>(
                    f,
                    [left & live, live, right & live],
                    [above, ALL, below],
                    o.wrapping_add(f - start),
                )
            };
        }
    } else {
        let mut oy = oy0;
        // Two rows at a time where the band has two left: the input rows between them are
        // loaded once for both (12 loads for two vectors, not 18).
        while oy + 1 < oy0 + rows {
            let o = o.wrapping_add((oy - oy0) * ow);
            // SAFETY: AVX-512F as for this function; output rows oy − oy0 and the next are
            // rows of `out`.
            unsafe {
                match (oy > 0, oy + 2 < oh) {
                    (true, true) => k.pair_row::<true, true>(oy, o),
                    (true, false) => k.pair_row::<true, false>(oy, o),
                    (false, true) => k.pair_row::<false, true>(oy, o),
                    (false, false) => k.pair_row::<false, false>(oy, o),
                }
            }
            oy += 2;
        }
        if oy < oy0 + rows {
            let o = o.wrapping_add((oy - oy0) * ow);
            // SAFETY: AVX-512F as for this function; output row oy − oy0 < rows of `out`.
            unsafe {
                match (oy > 0, oy + 1 < oh) {
                    (true, true) => k.row::<true, true>(oy, o),
                    (true, false) => k.row::<true, false>(oy, o),
                    (false, true) => k.row::<false, true>(oy, o),
                    (false, false) => k.row::<false, false>(oy, o),
                }
            }
        }
    }
}

/// See [`super::super::Dw3x3InPlace`] (stride 2, and its safety). 16 outputs a vector from
/// 32 input columns: the centre taps are their even floats, the right taps their odd ones,
/// and the left taps the odd floats of the 32 columns two earlier (zero left of the plane,
/// under a mask). An even-sized input has no right edge and no bottom one: only the row
/// above the first is missing. Each output is summed as the AVX2 kernel sums it.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(in super::super) unsafe fn half(
    x: &[f32],
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
    oy0: usize,
    oh: usize,
) {
    let (k, rows) = Plane::new(x, w, bias, relu, out.len(), ow, (oy0, oh), 2);
    // Indices into (a, b) pairs, b's lanes numbered from 16.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    if ow == 8 {
        for oy in (oy0..oy0 + rows).step_by(2) {
            let o = out.as_mut_ptr().wrapping_add((oy - oy0) * ow);
            let two = oy + 1 < oy0 + rows;
            // SAFETY: AVX-512F as for this function; output rows oy − oy0 (and the next,
            // where `two`) of `out`, input rows 2·oy − 1 (when oy > 0) ..= 2·oy + 3 (when
            // `two`) < 2·oh of the plane.
            unsafe { k.half_rows8(oy, o, two, [even, odd]) };
        }
        return;
    }
    for oy in oy0..oy0 + rows {
        let o = out.as_mut_ptr().wrapping_add((oy - oy0) * ow);
        // SAFETY: AVX-512F as for this function; output row oy − oy0 < rows of `out`, and
        // input rows 2·oy − 1 (when oy > 0) ..= 2·oy + 1 < 2·oh of the plane.
        unsafe {
            if oy > 0 {
                k.half_row::<true>(oy, o, [even, odd]);
            } else {
                k.half_row::<false>(oy, o, [even, odd]);
            }
        }
    }
}

/// One plane's broadcast weights and bias, and its input.
struct Plane {
    w: [__m512; 9],
    bias: __m512,
    relu: bool,
    x: *const f32,
    ow: usize,
}

impl Plane {
    /// The plane's broadcast weights and bias, once the contract is checked again (before any
    /// pointer is formed): `out_len` floats for rows `oy0 ..` of an `oh × ow` output plane
    /// read from `x` at `stride`. With the band's rows.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn new(
        x: &[f32],
        w: &[f32; 9],
        bias: f32,
        relu: bool,
        out_len: usize,
        ow: usize,
        (oy0, oh): (usize, usize),
        stride: usize,
    ) -> (Plane, usize) {
        let rows = out_len / ow;
        let input = stride * stride * oh * ow;
        assert!(out_len.is_multiple_of(ow) && oy0 + rows <= oh && x.len() >= input);
        let plane = Plane {
            w: w.map(|v| _mm512_set1_ps(v)),
            bias: _mm512_set1_ps(bias),
            relu,
            x: x.as_ptr(),
            ow,
        };
        (plane, rows)
    }

    /// Output row `oy` (into `o`, `ow` floats), 16 columns a vector, the last ragged; the
    /// rows above and below it are read where `TOP` and `BOTTOM` say they exist.
    ///
    /// Safety: AVX-512F; `oy` is a row of the plane and `o` holds `ow` floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn row<const TOP: bool, const BOTTOM: bool>(&self, oy: usize, o: *mut f32) {
        let ow = self.ow;
        for x0 in (0..ow).step_by(16) {
            // SAFETY: the caller's: the kept lanes read columns 0 .. ow of rows oy − 1 (when
            // TOP) ..= oy + 1 (when BOTTOM), and store columns x0 .. ow of `o`.
            unsafe {
                self.chunk::<TOP, BOTTOM>(
                    oy * ow + x0,
                    self.columns(x0),
                    [ALL; 3],
                    o.wrapping_add(x0),
                )
            };
        }
    }

    /// Output rows `oy` and `oy + 1` (into `o`, `2·ow` floats) as [`Plane::row`] would
    /// write them one by one (the same sums in the same order), each input row's taps loaded
    /// once for both; the row above the first is read where `TOP`, the one below the second
    /// where `BOTTOM`.
    ///
    /// Safety: AVX-512F; `oy + 1` is a row of the plane and `o` holds `2·ow` floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn pair_row<const TOP: bool, const BOTTOM: bool>(&self, oy: usize, o: *mut f32) {
        let (ow, zero) = (self.ow, _mm512_setzero_ps());
        for x0 in (0..ow).step_by(16) {
            let cols = self.columns(x0);
            // Input row oy − 1 + r's three taps from column x0 − 1.
            let taps = |r: usize| -> [__m512; 3] {
                let p = self.x.wrapping_add((oy + r) * ow + x0).wrapping_sub(ow + 1);
                // SAFETY: the caller's: rows oy − 1 (when TOP) ..= oy + 2 (when BOTTOM)
                // are the plane's, and the kept lanes read its columns 0 .. ow.
                std::array::from_fn(|kx| unsafe {
                    _mm512_maskz_loadu_ps(cols[kx], p.wrapping_add(kx))
                })
            };
            let first = if TOP {
                self.row_sum(taps(0), 0, self.bias)
            } else {
                self.bias
            };
            let t1 = taps(1);
            let first = _mm512_add_ps(first, self.row_sum(t1, 1, zero));
            let second = self.row_sum(t1, 0, self.bias);
            let t2 = taps(2);
            let first = _mm512_add_ps(first, self.row_sum(t2, 2, zero));
            let second = _mm512_add_ps(second, self.row_sum(t2, 1, zero));
            let second = if BOTTOM {
                _mm512_add_ps(second, self.row_sum(taps(3), 2, zero))
            } else {
                second
            };
            // SAFETY: the caller's: `o` holds both rows' columns x0 .. ow.
            unsafe {
                _mm512_mask_storeu_ps(o.wrapping_add(x0), cols[1], self.relu(first));
                _mm512_mask_storeu_ps(o.wrapping_add(ow + x0), cols[1], self.relu(second));
            }
        }
    }

    /// Output row `oy` of a stride-2 plane (into `o`, `ow` floats) from input rows
    /// `2·oy − 1` (where `TOP`), `2·oy` and `2·oy + 1`, each `2·ow` floats; `split` holds the
    /// even and the odd lanes' indices for two-vector permutations.
    ///
    /// Safety: AVX-512F; those rows are the plane's and `o` holds `ow` floats.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn half_row<const TOP: bool>(&self, oy: usize, o: *mut f32, split: [__m512i; 2]) {
        let (ow, zero) = (self.ow, _mm512_setzero_ps());
        let iw = 2 * ow;
        for c in (0..ow).step_by(16) {
            let live = lanes_below(ow - c);
            // Input floats 2c .. 2c + 2n for the n live outputs.
            let n2 = 2 * (ow - c).min(16);
            // Row iy's taps: 32 floats from `p` (lanes past n2, and those in `skip`, zero)
            // split into even and odd lanes.
            let taps = |iy: usize| -> [__m512; 3] {
                let row = self.x.wrapping_add(iy * iw + 2 * c);
                let pair = |p: *const f32, skip: __mmask16| {
                    // SAFETY: the caller's: the kept lanes read input columns
                    // 2c − 1 ..= 2c + n2 − 1 < iw of row iy (2c − 2 and, at c = 0, 2c − 1
                    // are skipped).
                    unsafe {
                        (
                            _mm512_maskz_loadu_ps(lanes_below(n2) & !skip, p),
                            _mm512_maskz_loadu_ps(
                                lanes_below(n2.saturating_sub(16)),
                                p.wrapping_add(16),
                            ),
                        )
                    }
                };
                let (a, b) = pair(row, 0);
                let (la, lb) = pair(row.wrapping_sub(2), if c == 0 { 0b11 } else { 0b01 });
                [
                    _mm512_permutex2var_ps(la, split[1], lb),
                    _mm512_permutex2var_ps(a, split[0], b),
                    _mm512_permutex2var_ps(a, split[1], b),
                ]
            };
            let a0 = if TOP {
                self.row_sum(taps(2 * oy - 1), 0, self.bias)
            } else {
                self.bias
            };
            let v = _mm512_add_ps(a0, self.row_sum(taps(2 * oy), 1, zero));
            let v = _mm512_add_ps(v, self.row_sum(taps(2 * oy + 1), 2, zero));
            // SAFETY: the caller's: `o` holds columns c .. c + n of the row.
            unsafe { _mm512_mask_storeu_ps(o.wrapping_add(c), live, self.relu(v)) };
        }
    }

    /// Output rows `oy` and, where `two`, `oy + 1` of a stride-2 plane 8 columns wide
    /// (into `o`), one in each half of a vector: input rows 16 floats wide, the second
    /// half's two rows below the first's. A row above the plane reads zeros; `split` as for
    /// [`Plane::half_row`].
    ///
    /// Safety: AVX-512F; input rows `2·oy − 1` (when oy > 0) ..= `2·oy + 1` (`+ 3` where
    /// `two`) are the plane's, and `o` holds 8 floats (16 where `two`).
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn half_rows8(&self, oy: usize, o: *mut f32, two: bool, split: [__m512i; 2]) {
        let zero = _mm512_setzero_ps();
        let second = if two { ALL } else { 0 };
        // Kernel row ky's taps: input row 2·oy + ky − 1 for the first half, two below it
        // for the second.
        let taps = |ky: usize| -> [__m512; 3] {
            let first = if ky == 0 && oy == 0 { 0 } else { ALL };
            let row = self.x.wrapping_add((2 * oy + ky) * 16).wrapping_sub(16);
            // SAFETY: the caller's: the kept lanes read columns 0 .. 16 of the rows it
            // vouches for (the left taps' first two lanes, columns −2 and −1, are skipped).
            let (a, b, la, lb) = unsafe {
                (
                    _mm512_maskz_loadu_ps(first, row),
                    _mm512_maskz_loadu_ps(second, row.wrapping_add(32)),
                    _mm512_maskz_loadu_ps(first & !0b11, row.wrapping_sub(2)),
                    _mm512_maskz_loadu_ps(second & !0b11, row.wrapping_add(30)),
                )
            };
            [
                _mm512_permutex2var_ps(la, split[1], lb),
                _mm512_permutex2var_ps(a, split[0], b),
                _mm512_permutex2var_ps(a, split[1], b),
            ]
        };
        let v = _mm512_add_ps(
            self.row_sum(taps(0), 0, self.bias),
            self.row_sum(taps(1), 1, zero),
        );
        let v = _mm512_add_ps(v, self.row_sum(taps(2), 2, zero));
        // SAFETY: the caller's: 8 floats at `o`, 16 where `two`.
        unsafe { _mm512_mask_storeu_ps(o, if two { ALL } else { 0xFF }, self.relu(v)) };
    }

    /// The kept lanes of the left, centre and right taps of a row's 16 outputs from column
    /// `x0`: the live ones, less the plane's first column on the left and its last on the
    /// right.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    fn columns(&self, x0: usize) -> [__mmask16; 3] {
        let live = lanes_below(self.ow - x0);
        let left = if x0 == 0 { !1 } else { ALL };
        [left & live, live, lanes_below(self.ow - x0 - 1) & live]
    }

    /// `v`, or its ReLU where the plane has one.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    fn relu(&self, v: __m512) -> __m512 {
        if self.relu {
            _mm512_max_ps(v, _mm512_setzero_ps())
        } else {
            v
        }
    }

    /// `init` plus kernel row `ky`'s three taps (`t`: left, centre, right) times its
    /// weights, in that order, as every plane kernel sums a row.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    fn row_sum(&self, t: [__m512; 3], ky: usize, init: __m512) -> __m512 {
        let a = _mm512_fmadd_ps(self.w[3 * ky], t[0], init);
        let a = _mm512_fmadd_ps(self.w[3 * ky + 1], t[1], a);
        _mm512_fmadd_ps(self.w[3 * ky + 2], t[2], a)
    }

    /// The 16 outputs at input index `f ..` (the same place in the output plane) into `o`:
    /// tap `(ky, kx)` of lane l reads input `f + l + (ky − 1)·ow + kx − 1` under
    /// `cols[kx] & rows[ky]`, the row above only where `TOP` and the one below only where
    /// `BOTTOM` (else they add nothing), and lane l is stored under `cols[1]`. The sums are
    /// the AVX2 kernel's, in its order.
    ///
    /// Safety: AVX-512F; every lane those masks keep reads inside the plane at `x` and is
    /// stored inside the output at `o`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn chunk<const TOP: bool, const BOTTOM: bool>(
        &self,
        f: usize,
        cols: [__mmask16; 3],
        rows: [__mmask16; 3],
        o: *mut f32,
    ) {
        let zero = _mm512_setzero_ps();
        let at = |ky: usize, kx: usize| {
            let p = self.x.wrapping_add(f + ky * self.ow + kx);
            // SAFETY: the caller's, for the lanes of this mask (the rest touch no memory).
            unsafe { _mm512_maskz_loadu_ps(cols[kx] & rows[ky], p.wrapping_sub(self.ow + 1)) }
        };
        // The taps as an array literal: built by `[0, 1, 2].map(..)` instead, they made the
        // 8 × 8 planes 1.5× slower.
        let row_sum = |ky: usize, init| self.row_sum([at(ky, 0), at(ky, 1), at(ky, 2)], ky, init);
        let a0 = if TOP {
            row_sum(0, self.bias)
        } else {
            self.bias
        };
        let v = _mm512_add_ps(a0, row_sum(1, zero));
        let v = if BOTTOM {
            _mm512_add_ps(v, row_sum(2, zero))
        } else {
            v
        };
        // SAFETY: the caller's, for the live lanes.
        unsafe { _mm512_mask_storeu_ps(o, cols[1], self.relu(v)) };
    }
}
