//! The 3×3 depthwise plane kernels in NEON: all nine taps in one pass over a row, four
//! outputs at a time.

use std::arch::aarch64::{
    float32x4_t, float32x4x2_t, vaddq_f32, vaddvq_f32, vandq_u32, vcgtq_f32, vdupq_n_f32,
    vextq_f32, vfmaq_f32, vld1q_f32, vld2q_f32, vmaxq_f32, vmulq_f32, vreinterpretq_f32_u32,
    vreinterpretq_u32_f32, vst1q_f32, vst2q_f32,
};

use super::super::operands::{Taps, WeightGrad};
use super::super::plane;
use super::super::portable::s2_pixels;

/// See [`super::super::Dw3x3Conv`] (and its safety).
pub(super) unsafe fn conv(
    taps: Taps<'_>,
    w: &[f32; 9],
    bias: f32,
    relu: bool,
    out: &mut [f32],
    ow: usize,
) {
    // SAFETY: NEON is baseline on aarch64; every run of `t` (checked by the caller) and `o`
    // is `ow ≥ x + 4` long where four lanes are read or written.
    unsafe {
        let wv = w.map(|v| vdupq_n_f32(v));
        let (bv, zero) = (vdupq_n_f32(bias), vdupq_n_f32(0.0));
        let ow4 = ow - ow % 4;
        for (oy, o) in out.chunks_exact_mut(ow).enumerate() {
            let t = taps.ptrs(oy);
            for x in (0..ow4).step_by(4) {
                let ld = |i: usize| vld1q_f32(t[i].add(x));
                // One accumulator per kernel row: three short FMA chains, not one long one.
                let mut a0 = vfmaq_f32(bv, wv[0], ld(0));
                let mut a1 = vmulq_f32(wv[3], ld(3));
                let mut a2 = vmulq_f32(wv[6], ld(6));
                a0 = vfmaq_f32(a0, wv[1], ld(1));
                a1 = vfmaq_f32(a1, wv[4], ld(4));
                a2 = vfmaq_f32(a2, wv[7], ld(7));
                a0 = vfmaq_f32(a0, wv[2], ld(2));
                a1 = vfmaq_f32(a1, wv[5], ld(5));
                a2 = vfmaq_f32(a2, wv[8], ld(8));
                let mut v = vaddq_f32(vaddq_f32(a0, a1), a2);
                if relu {
                    v = vmaxq_f32(v, zero);
                }
                vst1q_f32(o.as_mut_ptr().add(x), v);
            }
            for (i, out) in o.iter_mut().enumerate().skip(ow4) {
                let a = bias + (0..9).map(|k| w[k] * *t[k].add(i)).sum::<f32>();
                *out = if relu { a.max(0.0) } else { a };
            }
        }
    }
}

/// See [`super::super::Dw3x3InPlace`] (stride 1, and its safety). Four outputs at a time,
/// two output rows at a time where the band has two left (the input rows between them loaded
/// once for both, as the AVX2 set does); a row's neighbours to the left and right are
/// unaligned loads, or the row's own lanes shifted one place (`ext`) with a zero brought in
/// at the plane's edges. The edges are const parameters of [`Plane::chunk`] and
/// [`Plane::pair_chunk`], so the loop over a row's middle has no branch.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn same(
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
        4,
        |t, o, n| {
            // SAFETY: `plane::row_pairs` hands over rows of `ow` floats, present as `t` says,
            // and both `o` pointing at `ow`, as `pair_row` requires.
            unsafe {
                match (t.top, t.bottom) {
                    (true, true) => k.pair_row::<true, true>(t.rows, o, ow, n),
                    (false, true) => k.pair_row::<false, true>(t.rows, o, ow, n),
                    (true, false) => k.pair_row::<true, false>(t.rows, o, ow, n),
                    (false, false) => k.pair_row::<false, false>(t.rows, o, ow, n),
                }
            }
        },
        |t, o, n| {
            // SAFETY: `plane::row_pairs` hands over rows of `ow` floats, present as `t` says,
            // and `o` pointing at `ow`, as `row` requires.
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

/// See [`super::super::Dw3x3InPlace`] (stride 2, and its safety). Four outputs at a time from
/// eight input columns split by `ld2` into even (the centre taps) and odd (the right taps)
/// lanes; the left taps are the even lanes of the run one column earlier, or the odd lanes
/// shifted one place with a zero brought in at the plane's left edge. An even-sized input
/// has no right edge and no bottom one: only the top row and the left column are special.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn half(
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
    plane::rows(x, w, bias, relu, out, ow, (oy0, oh), 2, 4, |t, o, n| {
        // SAFETY: `plane::rows` hands over rows of `2·ow` floats (all but the one above
        // present unless `t.top`) and `o` pointing at `ow`, as `half_row` requires.
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
    w: [float32x4_t; 9],
    bias: float32x4_t,
    relu: bool,
}

impl Plane {
    fn new(w: &[f32; 9], bias: f32, relu: bool) -> Plane {
        // SAFETY: NEON is baseline on aarch64.
        unsafe {
            Plane {
                w: w.map(|v| vdupq_n_f32(v)),
                bias: vdupq_n_f32(bias),
                relu,
            }
        }
    }

    /// `init` plus kernel row `ky`'s three taps (`t`: left, centre, right) times its weights,
    /// in that order: every plane kernel sums a row this way, so their results agree bit for
    /// bit.
    fn row_sum(&self, t: [float32x4_t; 3], ky: usize, init: float32x4_t) -> float32x4_t {
        // SAFETY: NEON is baseline on aarch64.
        unsafe {
            let a = vfmaq_f32(init, self.w[3 * ky], t[0]);
            let a = vfmaq_f32(a, self.w[3 * ky + 1], t[1]);
            vfmaq_f32(a, self.w[3 * ky + 2], t[2])
        }
    }

    /// Columns `0 .. w4` of one output row from input rows `p` (`p[0]` above, present when
    /// `TOP`; `p[2]` below, present when `BOTTOM`).
    ///
    /// Safety: the present rows and `o` point at `width` floats, `w4 = width − width % 4`.
    #[inline(always)]
    unsafe fn row<const TOP: bool, const BOTTOM: bool>(
        &self,
        p: [*const f32; 3],
        o: *mut f32,
        width: usize,
        w4: usize,
    ) {
        if w4 == 0 {
            return;
        }
        // SAFETY (all four runs): the caller's; a chunk at `c` reads `c − 1` only when it is
        // not the first (c ≥ 4) and `c + 4` only when it is not the last (c + 4 < width).
        unsafe {
            if width == 4 {
                self.chunk::<TOP, BOTTOM, true, true>(p, o, 0);
                return;
            }
            self.chunk::<TOP, BOTTOM, true, false>(p, o, 0);
            let mut c = 4;
            while c + 4 < width && c < w4 {
                self.chunk::<TOP, BOTTOM, false, false>(p, o, c);
                c += 4;
            }
            if c < w4 {
                // c + 4 == width: the last column has no right neighbour.
                self.chunk::<TOP, BOTTOM, false, true>(p, o, c);
            }
        }
    }

    /// Outputs `c .. c + 4`. Safety: the present rows hold `c .. c + 4`, and `c − 1` unless
    /// `LEFT` (the plane's first column), `c + 4` unless `RIGHT` (its last).
    #[inline(always)]
    unsafe fn chunk<const TOP: bool, const BOTTOM: bool, const LEFT: bool, const RIGHT: bool>(
        &self,
        p: [*const f32; 3],
        o: *mut f32,
        c: usize,
    ) {
        // SAFETY: NEON is baseline; the reads and the store are the caller's.
        unsafe {
            let zero = vdupq_n_f32(0.0);
            let taps = |ky: usize, init| self.row_sum(row_taps::<LEFT, RIGHT>(p[ky], c), ky, init);
            let a0 = if TOP { taps(0, self.bias) } else { self.bias };
            let v = vaddq_f32(a0, taps(1, zero));
            let v = if BOTTOM {
                vaddq_f32(v, taps(2, zero))
            } else {
                v
            };
            let v = if self.relu { vmaxq_f32(v, zero) } else { v };
            vst1q_f32(o.add(c), v);
        }
    }

    /// Columns `0 .. w4` of two output rows (`o[0]`, `o[1]` below it) from input rows `p`
    /// (`p[0]` above the first, present when `TOP`; `p[3]` below the second, present when
    /// `BOTTOM`).
    ///
    /// Safety: the present rows and both `o` point at `width` floats, `w4 = width − width % 4`.
    #[inline(always)]
    unsafe fn pair_row<const TOP: bool, const BOTTOM: bool>(
        &self,
        p: [*const f32; 4],
        o: [*mut f32; 2],
        width: usize,
        w4: usize,
    ) {
        if w4 == 0 {
            return;
        }
        // SAFETY (all four runs): as in `row`.
        unsafe {
            if width == 4 {
                self.pair_chunk::<TOP, BOTTOM, true, true>(p, o, 0);
                return;
            }
            self.pair_chunk::<TOP, BOTTOM, true, false>(p, o, 0);
            let mut c = 4;
            while c + 4 < width && c < w4 {
                self.pair_chunk::<TOP, BOTTOM, false, false>(p, o, c);
                c += 4;
            }
            if c < w4 {
                self.pair_chunk::<TOP, BOTTOM, false, true>(p, o, c);
            }
        }
    }

    /// Outputs `c .. c + 4` of two rows: each input row's three taps loaded once and summed
    /// into both rows it reaches, each row's sums in [`Plane::chunk`]'s order, so the results
    /// are the same. Safety: as [`Plane::chunk`]'s, for the four rows.
    #[inline(always)]
    unsafe fn pair_chunk<
        const TOP: bool,
        const BOTTOM: bool,
        const LEFT: bool,
        const RIGHT: bool,
    >(
        &self,
        p: [*const f32; 4],
        o: [*mut f32; 2],
        c: usize,
    ) {
        // SAFETY: NEON is baseline; the reads and the stores are the caller's.
        unsafe {
            let zero = vdupq_n_f32(0.0);
            let taps = |r: usize| row_taps::<LEFT, RIGHT>(p[r], c);
            let sum = |t, ky, init| self.row_sum(t, ky, init);
            let store = |o: *mut f32, v: float32x4_t| {
                let v = if self.relu { vmaxq_f32(v, zero) } else { v };
                vst1q_f32(o.add(c), v);
            };
            let first = if TOP {
                sum(taps(0), 0, self.bias)
            } else {
                self.bias
            };
            let t1 = taps(1);
            let first = vaddq_f32(first, sum(t1, 1, zero));
            let second = sum(t1, 0, self.bias);
            let t2 = taps(2);
            store(o[0], vaddq_f32(first, sum(t2, 2, zero)));
            let second = vaddq_f32(second, sum(t2, 1, zero));
            let second = if BOTTOM {
                vaddq_f32(second, sum(taps(3), 2, zero))
            } else {
                second
            };
            store(o[1], second);
        }
    }

    /// Columns `0 .. w4` of one stride-2 output row from input rows `p` (`p[0]` above,
    /// present when `TOP`).
    ///
    /// Safety: the present rows point at `2·ow` floats and `o` at `ow`, `w4 = ow − ow % 4`.
    #[inline(always)]
    unsafe fn half_row<const TOP: bool>(&self, p: [*const f32; 3], o: *mut f32, w4: usize) {
        if w4 == 0 {
            return;
        }
        // SAFETY: the caller's; a chunk at `c` reads input columns 2c .. 2c + 8 ≤ 2·w4, and
        // 2c − 1 only when it is not the first (c ≥ 4).
        unsafe {
            self.half_chunk::<TOP, true>(p, o, 0);
            for c in (4..w4).step_by(4) {
                self.half_chunk::<TOP, false>(p, o, c);
            }
        }
    }

    /// Outputs `c .. c + 4` of a stride-2 row. Safety: the present rows hold input columns
    /// `2c .. 2c + 8`, and `2c − 1` unless `LEFT` (the plane's first column).
    #[inline(always)]
    unsafe fn half_chunk<const TOP: bool, const LEFT: bool>(
        &self,
        p: [*const f32; 3],
        o: *mut f32,
        c: usize,
    ) {
        // SAFETY: NEON is baseline; the reads and the store are the caller's.
        unsafe {
            let zero = vdupq_n_f32(0.0);
            let taps = |ky: usize, init| self.row_sum(half_taps::<LEFT>(p[ky], c), ky, init);
            let a0 = if TOP { taps(0, self.bias) } else { self.bias };
            let v = vaddq_f32(vaddq_f32(a0, taps(1, zero)), taps(2, zero));
            let v = if self.relu { vmaxq_f32(v, zero) } else { v };
            vst1q_f32(o.add(c), v);
        }
    }
}

/// The left, centre and right taps of outputs `c .. c + 4` of a stride-2, pad-1 row: input
/// columns `2(c + l) − 1`, `2(c + l)` and `2(c + l) + 1` for lane `l`. `ld2` splits eight
/// input columns into even (centre) and odd (right) lanes; the left taps are the even lanes
/// of the run one column earlier, or the odd lanes shifted one place with a zero brought in at
/// the row's left edge (`LEFT`).
///
/// Safety: `r` holds input columns `2c .. 2c + 8`, and `2c − 1` unless `LEFT`.
#[inline(always)]
unsafe fn half_taps<const LEFT: bool>(r: *const f32, c: usize) -> [float32x4_t; 3] {
    // SAFETY: NEON is baseline; the reads are the caller's.
    unsafe {
        let pair = vld2q_f32(r.add(2 * c));
        let left = if LEFT {
            vextq_f32::<3>(vdupq_n_f32(0.0), pair.1)
        } else {
            vld2q_f32(r.add(2 * c - 1)).0
        };
        [left, pair.0, pair.1]
    }
}

/// The left, centre and right taps of outputs `c .. c + 4` of a stride-1, pad-1 row `r`:
/// input columns `c + l − 1`, `c + l` and `c + l + 1` for lane `l`, unaligned loads, or the
/// centre lanes shifted one place (`ext`) with a zero brought in at the row's left edge
/// (`LEFT`) or its right one (`RIGHT`).
///
/// Safety: `r` holds columns `c .. c + 4`, and `c − 1` unless `LEFT`, `c + 4` unless `RIGHT`.
#[inline(always)]
unsafe fn row_taps<const LEFT: bool, const RIGHT: bool>(
    r: *const f32,
    c: usize,
) -> [float32x4_t; 3] {
    // SAFETY: NEON is baseline; the reads are the caller's.
    unsafe {
        let zero = vdupq_n_f32(0.0);
        let mid = vld1q_f32(r.add(c));
        let left = if LEFT {
            vextq_f32::<3>(zero, mid)
        } else {
            vld1q_f32(r.add(c - 1))
        };
        let right = if RIGHT {
            vextq_f32::<1>(mid, zero)
        } else {
            vld1q_f32(r.add(c + 1))
        };
        [left, mid, right]
    }
}

/// See [`super::super::Dw3x3WeightGrad`] (and its safety).
pub(super) unsafe fn weight_grad(taps: Taps<'_>, wg: WeightGrad<'_>, ow: usize) -> ([f32; 9], f32) {
    let ow4 = ow - ow % 4;
    // SAFETY: NEON is baseline on aarch64; every row slice here and every run of `t`
    // (checked by the caller) is `ow ≥ x + 4` long where four lanes are read or written.
    unsafe {
        let zero = vdupq_n_f32(0.0);
        let mut acc = [zero; 9];
        let mut bacc = zero;
        let (mut tail, mut btail) = ([0f32; 9], 0f32);
        for (oy, grow) in wg.gy.chunks_exact(ow).enumerate() {
            let t = taps.ptrs(oy);
            let yrow = wg.y.map(|y| &y[oy * ow..][..ow]);
            let d = &mut wg.dst[wg.at + oy * wg.ld..][..ow];
            for x in (0..ow4).step_by(4) {
                let mut g = vld1q_f32(grow.as_ptr().add(x));
                if let Some(y) = yrow {
                    let live = vcgtq_f32(vld1q_f32(y.as_ptr().add(x)), zero);
                    g = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(g), live));
                }
                vst1q_f32(d.as_mut_ptr().add(x), g);
                bacc = vaddq_f32(bacc, g);
                for (a, tap) in acc.iter_mut().zip(t) {
                    *a = vfmaq_f32(*a, g, vld1q_f32(tap.add(x)));
                }
            }
            for i in ow4..ow {
                let g = match yrow {
                    Some(y) if y[i] <= 0.0 => 0.0,
                    _ => grow[i],
                };
                d[i] = g;
                btail += g;
                for (s, tap) in tail.iter_mut().zip(t) {
                    *s += g * *tap.add(i);
                }
            }
        }
        let sums: [f32; 9] = std::array::from_fn(|k| vaddvq_f32(acc[k]) + tail[k]);
        (sums, vaddvq_f32(bacc) + btail)
    }
}

/// See [`super::super::Dw3x3InputGradS2`] (and its safety).
pub(super) unsafe fn input_grad_s2(g: &[f32], w: &[f32; 9], gx: &mut [f32], ow: usize) {
    let oh = gx.len() / (4 * ow);
    let ld = ow + 1;
    let ow4 = ow - ow % 4;
    // SAFETY: NEON is baseline on aarch64.
    let wv = w.map(|v| unsafe { vdupq_n_f32(v) });
    for a in 0..oh {
        let (r0, r1) = (&g[a * ld..][..ld], &g[(a + 1) * ld..][..ld]);
        let (top, bottom) = gx[2 * a * 2 * ow..][..4 * ow].split_at_mut(2 * ow);
        for b in (0..ow4).step_by(4) {
            // SAFETY: NEON is baseline on aarch64; rows of g are ow + 1 ≥ b + 5 long, rows
            // of gx 2·ow ≥ 2b + 8; vst2q stores e0 o0 e1 o1 … e3 o3, eight floats.
            unsafe {
                let g00 = vld1q_f32(r0.as_ptr().add(b));
                let g01 = vld1q_f32(r0.as_ptr().add(b + 1));
                let g10 = vld1q_f32(r1.as_ptr().add(b));
                let g11 = vld1q_f32(r1.as_ptr().add(b + 1));
                let ee = vmulq_f32(wv[4], g00);
                let eo = vfmaq_f32(vmulq_f32(wv[5], g00), wv[3], g01);
                let oe = vfmaq_f32(vmulq_f32(wv[7], g00), wv[1], g10);
                let oo = vaddq_f32(
                    vfmaq_f32(vmulq_f32(wv[2], g10), wv[0], g11),
                    vfmaq_f32(vmulq_f32(wv[8], g00), wv[6], g01),
                );
                vst2q_f32(top.as_mut_ptr().add(2 * b), float32x4x2_t(ee, eo));
                vst2q_f32(bottom.as_mut_ptr().add(2 * b), float32x4x2_t(oe, oo));
            }
        }
        s2_pixels(g, w, gx, ow, a, ow4..ow);
    }
}
