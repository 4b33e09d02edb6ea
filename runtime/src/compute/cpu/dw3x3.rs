//! The 3×3 depthwise plane kernels (every depthwise conv of det-s), portable and in AVX2 + FMA.
//!
//! A kernel works on one channel plane whose input has been laid out so that tap `t = 3·ky + kx`
//! of output row `oy` reads the contiguous run `src[at[t] + oy·step ..][.. ow]` (the phases of
//! [`super::depthwise`]). The AVX2 versions do all nine taps in one pass over a row, eight
//! outputs at a time, with explicit FMA; the portable ones are plain loops the compiler
//! vectorises at its baseline width (and the reference the AVX2 ones are tested against).

/// Where the nine taps of a plane read (see the module docs).
#[derive(Clone, Copy)]
pub(super) struct Taps<'a> {
    pub src: &'a [f32],
    pub at: [usize; 9],
    pub step: usize,
}

impl<'a> Taps<'a> {
    /// The runs of row `oy`, each `ow` long (panics when a run leaves `src`).
    #[inline(always)]
    fn row(&self, oy: usize, ow: usize) -> [&'a [f32]; 9] {
        self.at.map(|a| &self.src[a + oy * self.step..][..ow])
    }

    /// Where the runs of row `oy` start, unchecked: for the AVX2 loops, after [`Taps::check`].
    #[inline(always)]
    #[cfg(target_arch = "x86_64")]
    fn ptrs(&self, oy: usize) -> [*const f32; 9] {
        let base = self.src.as_ptr();
        self.at.map(|a| base.wrapping_add(a + oy * self.step))
    }

    /// Panics unless every run of rows `0..oh` lies inside `src` (the AVX2 loops read raw).
    fn check(&self, oh: usize, ow: usize) {
        for a in self.at {
            assert!(
                oh == 0 || a + (oh - 1) * self.step + ow <= self.src.len(),
                "depthwise taps outside their plane"
            );
        }
    }
}

/// Proof that the CPU has AVX2 and FMA: only [`Avx2::detect`] makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx2(());

/// No AVX2 off x86-64: a type with no values.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy)]
pub(super) enum Avx2 {}

impl Avx2 {
    pub(super) fn detect() -> Option<Avx2> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Some(Avx2(()));
        }
        None
    }
}

/// `out[oy][·] = relu?(bias + Σ_t w[t]·tap_t[oy][·])` for an `oh × ow` output plane.
pub(super) fn conv(
    isa: Option<Avx2>,
    taps: Taps<'_>,
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
) {
    let oh = out.len() / ow;
    taps.check(oh, ow);
    #[cfg(target_arch = "x86_64")]
    if let Some(Avx2(())) = isa {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA; the taps were checked.
        unsafe { avx2::conv(taps, w, bias, relu, out, ow) };
        return;
    }
    let _ = isa;
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

/// The masked output gradient of a plane and what it gives the weights and the bias, in one
/// pass: `g = gy ⊙ [y > 0]` (just `gy` without `y`) is written to row `oy` of `dst`
/// (`dst[at + oy·ld ..][.. ow]`), and the result is `([Σ g·tap_t], Σ g)`.
pub(super) struct WeightGrad<'a> {
    pub gy: &'a [f32],
    pub y: Option<&'a [f32]>,
    pub dst: &'a mut [f32],
    pub at: usize,
    pub ld: usize,
}

pub(super) fn weight_grad(
    isa: Option<Avx2>,
    taps: Taps<'_>,
    wg: WeightGrad<'_>,
    ow: usize,
) -> ([f32; 9], f32) {
    let oh = wg.gy.len() / ow;
    taps.check(oh, ow);
    assert!(wg.y.is_none_or(|y| y.len() == wg.gy.len()));
    assert!(oh == 0 || wg.at + (oh - 1) * wg.ld + ow <= wg.dst.len());
    #[cfg(target_arch = "x86_64")]
    if let Some(Avx2(())) = isa {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA; taps, y and dst were
        // checked just above.
        return unsafe { avx2::weight_grad(taps, wg, ow) };
    }
    let _ = isa;
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
            super::depthwise::dot_lanes(lane, d, tap);
        }
        for (l, v) in d.iter().enumerate() {
            lanes[9][l % 8] += v;
        }
    }
    let sums: [f32; 10] = std::array::from_fn(|t| super::depthwise::hsum(&lanes[t]));
    (std::array::from_fn(|t| sums[t]), sums[9])
}

/// Input gradient of a 3×3, stride-2, pad-1 depthwise conv whose input is exactly twice its
/// output (`2·oh × 2·ow`), as a gather: `g` is the masked output gradient, `oh + 1` rows of
/// `ow + 1` with a zero last row and column. Input pixel `(2a + u, 2b + v)` gets
/// taps `ky ∈ {1}` (u = 0) or `{0 → a + 1, 2 → a}` (u = 1), and likewise for columns.
pub(super) fn input_grad_s2(isa: Option<Avx2>, g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize) {
    let oh = gx.len() / (4 * ow);
    assert_eq!(gx.len(), 4 * oh * ow);
    assert!(g.len() >= (oh + 1) * (ow + 1));
    #[cfg(target_arch = "x86_64")]
    if let Some(Avx2(())) = isa {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA; sizes checked above.
        unsafe { avx2::input_grad_s2(g, w, gx, ow) };
        return;
    }
    let _ = isa;
    for a in 0..oh {
        s2_pixels(g, w, gx, ow, a, 0..ow);
    }
}

/// Row pair `2a, 2a + 1` of [`input_grad_s2`], columns `2b, 2b + 1` for `b` in `cols`.
#[inline(always)]
fn s2_pixels(
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{s2_pixels, Taps, WeightGrad};
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_and_ps, _mm256_cmp_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
        _mm256_max_ps, _mm256_mul_ps, _mm256_permute2f128_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_storeu_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps, _CMP_GT_OQ,
    };

    /// Horizontal sum of eight lanes, in the pairwise order of `depthwise::hsum`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn hsum(v: __m256) -> f32 {
        let mut l = [0f32; 8];
        // SAFETY: `l` holds eight floats; storeu needs no alignment.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
        super::super::depthwise::hsum(&l)
    }

    /// See [`super::conv`]. Safety: AVX2 and FMA; `taps` checked for `out.len()/ow` rows.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn conv(
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

    /// See [`super::weight_grad`]. Safety: AVX2 and FMA; taps, `y` and `dst` checked for the
    /// plane's rows.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weight_grad(
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

    /// See [`super::input_grad_s2`]. Safety: AVX2 and FMA; `gx` is `2·oh × 2·ow` and `g`
    /// holds `(oh + 1) × (ow + 1)`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn input_grad_s2(g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize) {
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
}
