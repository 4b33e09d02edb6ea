//! The 3×3 depthwise plane kernels in AVX2 + FMA: all nine taps in one pass over a row,
//! eight outputs at a time.
use super::super::operands::{Taps, WeightGrad};
use super::super::plane;
use super::super::portable::{self, s2_pixels};
use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_and_ps, _mm256_blend_ps, _mm256_broadcast_ss, _mm256_castpd_ps,
    _mm256_castps_pd, _mm256_cmp_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_max_ps,
    _mm256_mul_ps, _mm256_permute2f128_ps, _mm256_permute4x64_pd, _mm256_permutevar8x32_ps,
    _mm256_set1_ps, _mm256_setr_epi32, _mm256_setzero_ps, _mm256_shuffle_ps, _mm256_storeu_ps,
    _mm256_unpackhi_ps, _mm256_unpacklo_ps, _CMP_GT_OQ,
};

/// Horizontal sum of eight lanes, in the pairwise order of `portable::hsum`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let mut l = [0f32; 8];
    // SAFETY: `l` holds eight floats; storeu needs no alignment.
    unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
    portable::hsum(&l)
}

/// See [`super::super::Dw3x3Conv`] (and its safety).
#[target_feature(enable = "avx2,fma")]
pub(in super::super) unsafe fn conv(
    taps: Taps<'_>,
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
) {
    let wv = w.map(|v| _mm256_set1_ps(v));
    let (bv, zero) = (_mm256_set1_ps(bias), _mm256_setzero_ps());
    let ow8 = ow - ow % 8;
    for (oy, o) in out.chunks_exact_mut(ow).enumerate() {
        let t = taps.ptrs(oy);
        for x in (0..ow8).step_by(8) {
            // SAFETY: every run of `t` (checked by the caller) and `o` is `ow ≥ x + 8` long.
            unsafe {
                let ld = |i: usize| _mm256_loadu_ps(t[i].add(x));
                // One accumulator per kernel row: three short FMA chains, not one long one.
                let mut a0 = _mm256_fmadd_ps(wv[0], ld(0), bv);
                let mut a1 = _mm256_mul_ps(wv[3], ld(3));
                let mut a2 = _mm256_mul_ps(wv[6], ld(6));
                a0 = _mm256_fmadd_ps(wv[1], ld(1), a0);
                a1 = _mm256_fmadd_ps(wv[4], ld(4), a1);
                a2 = _mm256_fmadd_ps(wv[7], ld(7), a2);
                a0 = _mm256_fmadd_ps(wv[2], ld(2), a0);
                a1 = _mm256_fmadd_ps(wv[5], ld(5), a1);
                a2 = _mm256_fmadd_ps(wv[8], ld(8), a2);
                let mut v = _mm256_add_ps(_mm256_add_ps(a0, a1), a2);
                if relu {
                    v = _mm256_max_ps(v, zero);
                }
                _mm256_storeu_ps(o.as_mut_ptr().add(x), v);
            }
        }
        for (i, out) in o.iter_mut().enumerate().skip(ow8) {
            // SAFETY: as above, i < ow.
            let a = bias + (0..9).map(|k| w[k] * unsafe { *t[k].add(i) }).sum::<f32>();
            *out = if relu { a.max(0.0) } else { a };
        }
    }
}

/// See [`super::super::Dw3x3InPlace`] (stride 1, and its safety). Eight outputs at a time,
/// two output rows at a time where the band has two left (the input rows between them loaded
/// once for both); a row's neighbours to the left and right are unaligned loads, or the row's
/// own lanes shifted one place with a zero brought in at the plane's edges. The edges are
/// const parameters of [`Plane::chunk`] and [`Plane::pair_chunk`], so the loop over a row's
/// middle has no branch.
#[target_feature(enable = "avx2,fma")]
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
    let k = Plane::new(w, bias, relu);
    plane::row_pairs(
        x,
        w,
        bias,
        relu,
        out,
        ow,
        (oy0, oh),
        8,
        |t, o, n| {
            // SAFETY: AVX2 as for this function; `plane::row_pairs` hands over rows of `ow`
            // floats, present as `t` says, and both `o` pointing at `ow`, as `pair_row`
            // requires.
            unsafe {
                match (t.top, t.bottom, relu) {
                    (true, true, true) => k.pair_row::<true, true, true>(t.rows, o, ow, n),
                    (true, false, true) => k.pair_row::<true, false, true>(t.rows, o, ow, n),
                    (false, true, true) => k.pair_row::<false, true, true>(t.rows, o, ow, n),
                    (false, false, true) => k.pair_row::<false, false, true>(t.rows, o, ow, n),
                    (true, true, false) => k.pair_row::<true, true, false>(t.rows, o, ow, n),
                    (true, false, false) => k.pair_row::<true, false, false>(t.rows, o, ow, n),
                    (false, true, false) => k.pair_row::<false, true, false>(t.rows, o, ow, n),
                    (false, false, false) => k.pair_row::<false, false, false>(t.rows, o, ow, n),
                }
            }
        },
        |t, o, n| {
            // SAFETY: AVX2 as for this function; `plane::row_pairs` hands over rows of `ow`
            // floats, present as `t` says, and `o` pointing at `ow`, as `row` requires.
            unsafe {
                match (t.top, t.bottom) {
                    (true, true) => k.row::<true, true>(t.rows, o, ow, n),
                    (false, true) => k.row::<false, true>(t.rows, o, ow, n),
                    (true, false) => k.row::<true, false>(t.rows, o, ow, n),
                    (false, false) => k.row::<false, false>(t.rows, o, ow, n),
                }
            }
        },
    );
}

/// See [`super::super::Dw3x3InPlace`] (stride 2, and its safety). Eight outputs at a time from
/// sixteen input columns, split into even (the centre taps) and odd (the right taps) lanes;
/// the left taps are the even lanes of the run one column earlier, or the odd lanes shifted
/// one place with a zero brought in at the plane's left edge. An even-sized input has no
/// right edge and no bottom one: only the top row and the left column are special.
#[target_feature(enable = "avx2,fma")]
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
    let k = Plane::new(w, bias, relu);
    plane::rows(x, w, bias, relu, out, ow, (oy0, oh), 2, 8, |t, o, n| {
        // SAFETY: AVX2 as for this function; `plane::rows` hands over rows of `2·ow` floats
        // (all but the one above present unless `t.top`) and `o` pointing at `ow`, as
        // `half_row` requires.
        unsafe {
            if t.top {
                k.half_row::<true>(t.rows, o, n);
            } else {
                k.half_row::<false>(t.rows, o, n);
            }
        }
    });
}

/// The broadcast weights and bias of one plane.
struct Plane {
    w: [__m256; 9],
    bias: __m256,
    relu: bool,
}

impl Plane {
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn new(w: &[f32; 9], bias: f32, relu: bool) -> Plane {
        Plane {
            w: w.map(|v| _mm256_set1_ps(v)),
            bias: _mm256_set1_ps(bias),
            relu,
        }
    }

    /// `init` plus kernel row `ky`'s three taps (`t`: left, centre, right) times its weights,
    /// in that order: every plane kernel sums a row this way, so their results agree bit for
    /// bit.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn row_sum(&self, t: [__m256; 3], ky: usize, init: __m256) -> __m256 {
        let a = _mm256_fmadd_ps(self.w[3 * ky], t[0], init);
        let a = _mm256_fmadd_ps(self.w[3 * ky + 1], t[1], a);
        _mm256_fmadd_ps(self.w[3 * ky + 2], t[2], a)
    }

    /// Columns `0 .. w8` of one output row from input rows `p` (`p[0]` above, present when
    /// `TOP`; `p[2]` below, present when `BOTTOM`).
    ///
    /// Safety: AVX2 + FMA; the present rows and `o` point at `width` floats, `w8 = width −
    /// width % 8`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn row<const TOP: bool, const BOTTOM: bool>(
        &self,
        p: [*const f32; 3],
        o: *mut f32,
        width: usize,
        w8: usize,
    ) {
        if w8 == 0 {
            return;
        }
        // SAFETY (all four runs): the caller's; a chunk at `c` reads `c − 1` only when it is
        // not the first (c ≥ 8) and `c + 8` only when it is not the last (c + 8 < width).
        unsafe {
            if width == 8 {
                self.chunk::<TOP, BOTTOM, true, true>(p, o, 0);
                return;
            }
            self.chunk::<TOP, BOTTOM, true, false>(p, o, 0);
            let mut c = 8;
            while c + 8 < width && c < w8 {
                self.chunk::<TOP, BOTTOM, false, false>(p, o, c);
                c += 8;
            }
            if c < w8 {
                // c + 8 == width: the last column has no right neighbour.
                self.chunk::<TOP, BOTTOM, false, true>(p, o, c);
            }
        }
    }

    /// Outputs `c .. c + 8`. Safety: AVX2 + FMA; the present rows hold `c .. c + 8`, and
    /// `c − 1` unless `LEFT` (the plane's first column), `c + 8` unless `RIGHT` (its last).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn chunk<const TOP: bool, const BOTTOM: bool, const LEFT: bool, const RIGHT: bool>(
        &self,
        p: [*const f32; 3],
        o: *mut f32,
        c: usize,
    ) {
        let zero = _mm256_setzero_ps();
        // SAFETY: the caller's.
        let taps =
            |ky: usize, init| self.row_sum(unsafe { row_taps::<LEFT, RIGHT>(p[ky], c) }, ky, init);
        let a0 = if TOP { taps(0, self.bias) } else { self.bias };
        let a1 = taps(1, zero);
        let v = _mm256_add_ps(a0, a1);
        let v = if BOTTOM {
            _mm256_add_ps(v, taps(2, zero))
        } else {
            v
        };
        let v = if self.relu { _mm256_max_ps(v, zero) } else { v };
        // SAFETY: the caller's: `o` holds c .. c + 8.
        unsafe { _mm256_storeu_ps(o.add(c), v) };
    }

    /// Columns `0 .. w8` of two output rows (`o[0]`, `o[1]` below it) from input rows `p`
    /// (`p[0]` above the first, present when `TOP`; `p[3]` below the second, present when
    /// `BOTTOM`), with ReLU where `RELU`.
    ///
    /// Safety: AVX2 + FMA; the present rows and both `o` point at `width` floats, `w8 =
    /// width − width % 8`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair_row<const TOP: bool, const BOTTOM: bool, const RELU: bool>(
        &self,
        p: [*const f32; 4],
        o: [*mut f32; 2],
        width: usize,
        w8: usize,
    ) {
        if w8 == 0 {
            return;
        }
        // SAFETY (all four runs): as in `row`.
        unsafe {
            if width == 8 {
                self.pair_chunk::<TOP, BOTTOM, true, true, RELU>(p, o, 0);
                return;
            }
            self.pair_chunk::<TOP, BOTTOM, true, false, RELU>(p, o, 0);
            let mut c = 8;
            while c + 8 < width && c < w8 {
                self.pair_chunk::<TOP, BOTTOM, false, false, RELU>(p, o, c);
                c += 8;
            }
            if c < w8 {
                self.pair_chunk::<TOP, BOTTOM, false, true, RELU>(p, o, c);
            }
        }
    }

    /// Outputs `c .. c + 8` of two rows: each input row's three taps loaded once, and summed
    /// into both rows it reaches, each row's sums in [`Plane::chunk`]'s order (the row above's
    /// taps with the bias, plus the middle row's, plus the row below's), so the results are
    /// the same. Safety: as [`Plane::chunk`]'s, for the four rows.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair_chunk<
        const TOP: bool,
        const BOTTOM: bool,
        const LEFT: bool,
        const RIGHT: bool,
        const RELU: bool,
    >(
        &self,
        p: [*const f32; 4],
        o: [*mut f32; 2],
        c: usize,
    ) {
        let zero = _mm256_setzero_ps();
        // SAFETY: the caller's.
        let taps = |r: usize| unsafe { row_taps::<LEFT, RIGHT>(p[r], c) };
        let sum = |t, ky, init| self.row_sum(t, ky, init);
        let store = |o: *mut f32, v: __m256| {
            let v = if RELU { _mm256_max_ps(v, zero) } else { v };
            // SAFETY: the caller's: `o` holds c .. c + 8.
            unsafe { _mm256_storeu_ps(o.add(c), v) };
        };
        let first = if TOP {
            sum(taps(0), 0, self.bias)
        } else {
            self.bias
        };
        let t1 = taps(1);
        let first = _mm256_add_ps(first, sum(t1, 1, zero));
        let second = sum(t1, 0, self.bias);
        let t2 = taps(2);
        store(o[0], _mm256_add_ps(first, sum(t2, 2, zero)));
        let second = _mm256_add_ps(second, sum(t2, 1, zero));
        let second = if BOTTOM {
            _mm256_add_ps(second, sum(taps(3), 2, zero))
        } else {
            second
        };
        store(o[1], second);
    }

    /// Columns `0 .. w8` of one stride-2 output row from input rows `p` (`p[0]` above,
    /// present when `TOP`).
    ///
    /// Safety: AVX2 + FMA; the present rows point at `2·ow` floats and `o` at `ow`, with
    /// `w8 = ow − ow % 8`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn half_row<const TOP: bool>(&self, p: [*const f32; 3], o: *mut f32, w8: usize) {
        if w8 == 0 {
            return;
        }
        // SAFETY: the caller's; a chunk at `c` reads input columns 2c .. 2c + 16 ≤ 2·w8, and
        // 2c − 1 only when it is not the first (c ≥ 8).
        unsafe {
            self.half_chunk::<TOP, true>(p, o, 0);
            for c in (8..w8).step_by(8) {
                self.half_chunk::<TOP, false>(p, o, c);
            }
        }
    }

    /// Outputs `c .. c + 8` of a stride-2 row. Safety: AVX2 + FMA; the present rows hold
    /// input columns `2c .. 2c + 16`, and `2c − 1` unless `LEFT` (the plane's first column).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn half_chunk<const TOP: bool, const LEFT: bool>(
        &self,
        p: [*const f32; 3],
        o: *mut f32,
        c: usize,
    ) {
        let zero = _mm256_setzero_ps();
        // SAFETY: the caller's.
        let taps = |ky: usize, init| self.row_sum(unsafe { half_taps::<LEFT>(p[ky], c) }, ky, init);
        let a0 = if TOP { taps(0, self.bias) } else { self.bias };
        let v = _mm256_add_ps(_mm256_add_ps(a0, taps(1, zero)), taps(2, zero));
        // The taps' lanes are scrambled (see `half_taps`): one permutation puts them in order.
        let v = in_order(v);
        let v = if self.relu { _mm256_max_ps(v, zero) } else { v };
        // SAFETY: the caller's: `o` holds c .. c + 8.
        unsafe { _mm256_storeu_ps(o.add(c), v) };
    }
}

/// The left, centre and right taps of outputs `c .. c + 8` of a stride-1, pad-1 row `r`:
/// input columns `c + l − 1`, `c + l` and `c + l + 1` for lane `l`, unaligned loads, or the
/// centre lanes shifted one place with a zero brought in at the row's left edge (`LEFT`) or
/// its right one (`RIGHT`).
///
/// Safety: AVX2; `r` holds columns `c .. c + 8`, and `c − 1` unless `LEFT`, `c + 8` unless
/// `RIGHT`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn row_taps<const LEFT: bool, const RIGHT: bool>(r: *const f32, c: usize) -> [__m256; 3] {
    let zero = _mm256_setzero_ps();
    // SAFETY: the caller's.
    unsafe {
        let mid = _mm256_loadu_ps(r.add(c));
        let left = if LEFT {
            let shifted = _mm256_permutevar8x32_ps(mid, _mm256_setr_epi32(0, 0, 1, 2, 3, 4, 5, 6));
            _mm256_blend_ps::<0b0000_0001>(shifted, zero)
        } else {
            _mm256_loadu_ps(r.add(c - 1))
        };
        let right = if RIGHT {
            let shifted = _mm256_permutevar8x32_ps(mid, _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7));
            _mm256_blend_ps::<0b1000_0000>(shifted, zero)
        } else {
            _mm256_loadu_ps(r.add(c + 1))
        };
        [left, mid, right]
    }
}

/// The left, centre and right taps of outputs `c .. c + 8` of a stride-2, pad-1 row (input
/// columns `2(c + l) − 1`, `2(c + l)` and `2(c + l) + 1` for output column `c + l`), with the
/// lanes in the order [`scrambled_pairs`] leaves them (output columns 0 1 4 5 2 3 6 7): the
/// centre and right taps are the even and odd floats of sixteen columns without the two lane
/// permutations that put them in order, and the left taps are the right ones moved one column
/// on, the column left of the run (or zero at the row's left edge, `LEFT`) brought in from a
/// broadcast. One permutation of the result ([`in_order`]) puts the outputs in order: 10
/// shuffles an output vector where in-order taps took 18, and 7–10 % less time for the plane
/// (`dw3x3_half` alone, 16–32 planes of 16–32 columns).
///
/// Safety: AVX2; `r` holds input columns `2c .. 2c + 16`, and `2c − 1` unless `LEFT`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn half_taps<const LEFT: bool>(r: *const f32, c: usize) -> [__m256; 3] {
    // SAFETY: the caller's.
    unsafe {
        let [mid, right] = scrambled_pairs(r.add(2 * c));
        // Left tap of output column j is the right tap of column j − 1: in the scrambled
        // order (columns 0 1 4 5 | 2 3 6 7) lane k takes the lane holding column
        // (its column) − 1; lane 0 (column 0) takes the column left of the run.
        let moved = _mm256_permutevar8x32_ps(right, _mm256_setr_epi32(0, 0, 5, 2, 1, 4, 3, 6));
        let before = if LEFT {
            _mm256_setzero_ps()
        } else {
            _mm256_broadcast_ss(&*r.add(2 * c - 1))
        };
        [_mm256_blend_ps::<0b0000_0001>(moved, before), mid, right]
    }
}

/// The even floats and the odd ones of the sixteen at `r`, each in the order one shuffle of
/// the two halves leaves them: floats 0 2 8 10 4 6 12 14 and 1 3 9 11 5 7 13 15 (output
/// columns 0 1 4 5 2 3 6 7); [`in_order`] puts a vector so scrambled in order.
///
/// Safety: AVX2; `r` holds 16 floats.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scrambled_pairs(r: *const f32) -> [__m256; 2] {
    // SAFETY: the caller's.
    let (a, b) = unsafe { (_mm256_loadu_ps(r), _mm256_loadu_ps(r.add(8))) };
    [
        _mm256_shuffle_ps::<0b10_00_10_00>(a, b),
        _mm256_shuffle_ps::<0b11_01_11_01>(a, b),
    ]
}

/// The 64-bit pairs of `t` in the order (0, 2, 1, 3): what puts the lanes of a shuffle of two
/// halves ([`scrambled_pairs`]) in order.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn in_order(t: __m256) -> __m256 {
    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(t)))
}

/// The even floats (0, 2, …, 14) and the odd ones (1, 3, …, 15) of the sixteen at `r`, each
/// in order: a shuffle of the two halves, then the 64-bit pairs in order (0, 2, 1, 3).
///
/// Safety: AVX2; `r` holds 16 floats.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn even_odd(r: *const f32) -> [__m256; 2] {
    // SAFETY: the caller's.
    let [even, odd] = unsafe { scrambled_pairs(r) };
    [in_order(even), in_order(odd)]
}

/// See [`super::super::Dw3x3WeightGrad`] (and its safety).
#[target_feature(enable = "avx2,fma")]
pub(in super::super) unsafe fn weight_grad(
    taps: Taps<'_>,
    wg: WeightGrad<'_>,
    ow: usize,
) -> ([f32; 9], f32) {
    let ow8 = ow - ow % 8;
    let zero = _mm256_setzero_ps();
    let mut acc = [zero; 9];
    let mut bacc = zero;
    let (mut tail, mut btail) = ([0f32; 9], 0f32);
    for (oy, grow) in wg.gy.chunks_exact(ow).enumerate() {
        let t = taps.ptrs(oy);
        let yrow = wg.y.map(|y| &y[oy * ow..][..ow]);
        let d = &mut wg.dst[wg.at + oy * wg.ld..][..ow];
        for x in (0..ow8).step_by(8) {
            // SAFETY: every row slice here and every run of `t` (checked by the caller)
            // is `ow ≥ x + 8` long.
            unsafe {
                let mut g = _mm256_loadu_ps(grow.as_ptr().add(x));
                if let Some(y) = yrow {
                    let live =
                        _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_loadu_ps(y.as_ptr().add(x)), zero);
                    g = _mm256_and_ps(g, live);
                }
                _mm256_storeu_ps(d.as_mut_ptr().add(x), g);
                bacc = _mm256_add_ps(bacc, g);
                for (a, tap) in acc.iter_mut().zip(t) {
                    *a = _mm256_fmadd_ps(g, _mm256_loadu_ps(tap.add(x)), *a);
                }
            }
        }
        for i in ow8..ow {
            let g = match yrow {
                Some(y) if y[i] <= 0.0 => 0.0,
                _ => grow[i],
            };
            d[i] = g;
            btail += g;
            for (s, tap) in tail.iter_mut().zip(t) {
                // SAFETY: every run of `t` is `ow > i` long (checked by the caller).
                *s += g * unsafe { *tap.add(i) };
            }
        }
    }
    // SAFETY: AVX2 as for this function.
    let sums: [f32; 9] = std::array::from_fn(|k| unsafe { hsum(acc[k]) } + tail[k]);
    // SAFETY: as above.
    (sums, unsafe { hsum(bacc) } + btail)
}

/// See [`super::super::Dw3x3InputGradS2`] (and its safety).
#[target_feature(enable = "avx2,fma")]
pub(in super::super) unsafe fn input_grad_s2(g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize) {
    let oh = gx.len() / (4 * ow);
    let ld = ow + 1;
    let ow8 = ow - ow % 8;
    let wv = w.map(|v| _mm256_set1_ps(v));
    for a in 0..oh {
        let (r0, r1) = (&g[a * ld..][..ld], &g[(a + 1) * ld..][..ld]);
        let (top, bottom) = gx[2 * a * 2 * ow..][..4 * ow].split_at_mut(2 * ow);
        for b in (0..ow8).step_by(8) {
            // SAFETY: rows of g are ow + 1 ≥ b + 9 long, rows of gx 2·ow ≥ 2b + 16.
            unsafe {
                let g00 = _mm256_loadu_ps(r0.as_ptr().add(b));
                let g01 = _mm256_loadu_ps(r0.as_ptr().add(b + 1));
                let g10 = _mm256_loadu_ps(r1.as_ptr().add(b));
                let g11 = _mm256_loadu_ps(r1.as_ptr().add(b + 1));
                let ee = _mm256_mul_ps(wv[4], g00);
                let eo = _mm256_fmadd_ps(wv[3], g01, _mm256_mul_ps(wv[5], g00));
                let oe = _mm256_fmadd_ps(wv[1], g10, _mm256_mul_ps(wv[7], g00));
                let oo = _mm256_add_ps(
                    _mm256_fmadd_ps(wv[0], g11, _mm256_mul_ps(wv[2], g10)),
                    _mm256_fmadd_ps(wv[6], g01, _mm256_mul_ps(wv[8], g00)),
                );
                interleave_store(top.as_mut_ptr().add(2 * b), ee, eo);
                interleave_store(bottom.as_mut_ptr().add(2 * b), oe, oo);
            }
        }
        s2_pixels(g, w, gx, ow, a, ow8..ow);
    }
}

/// Stores `e0 o0 e1 o1 … e7 o7` at `dst .. dst + 16`. Safety: AVX2; 16 floats writable.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn interleave_store(dst: *mut f32, e: __m256, o: __m256) {
    let lo = _mm256_unpacklo_ps(e, o); // e0 o0 e1 o1 | e4 o4 e5 o5
    let hi = _mm256_unpackhi_ps(e, o); // e2 o2 e3 o3 | e6 o6 e7 o7
                                       // SAFETY: the caller's contract.
    unsafe {
        _mm256_storeu_ps(dst, _mm256_permute2f128_ps::<0x20>(lo, hi));
        _mm256_storeu_ps(dst.add(8), _mm256_permute2f128_ps::<0x31>(lo, hi));
    }
}
