//! Depthwise convolution (`groups = c_in = c_out`) by direct loops, one channel plane at a time.
//!
//! Each input plane is first copied, zero-padded, into *phases*: with stride `s`, phase `q`
//! holds the padded columns `q, q + s, q + 2s, …`, so tap `(ky, kx)` of output row `oy` reads
//! the contiguous run `phase[kx % s][oy·s + ky][kx/s ..][.. out_w]`. Every inner loop then walks
//! contiguous memory with no branch and no bounds check, which the compiler vectorises (3×3 taps
//! are unrolled by hand into one pass over the row). The backward pass accumulates the input
//! gradient into phases the same way and copies it out.
//!
//! The forward 3×3, pad-1 planes of stride 1 and of stride 2 from an even-sized input (all of
//! det-s's) skip the phases where the kernel set reads the plane in place
//! (`kernels::Dw3x3InPlace`): the copy cost more than the convolution on the small planes of a
//! batch-1 forward. So does the stride-1 input gradient (the masked output gradient convolved
//! with the flipped taps), which saved 13 % of the depthwise backward of a det-s step.

use std::ops::Range;

use super::dw3x3;
use super::kernels::{self, dot_lanes, hsum, Kernels, Taps, WeightGrad};
use crate::compute::ops::Conv2d;

/// Sizes of the phase planes for one op.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    k: usize,
    s: usize,
    p: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    /// Padded rows any output reads: `(oh − 1)·s + k`.
    rows: usize,
    /// Entries per phase row: `ow + (k − 1)/s`.
    pwid: usize,
}

impl Geometry {
    fn new(op: &Conv2d) -> Self {
        let (k, s, p) = (op.kernel as usize, op.stride as usize, op.pad as usize);
        Self::of(k, s, p, op.h as usize, op.w as usize)
    }

    fn of(k: usize, s: usize, p: usize, h: usize, w: usize) -> Self {
        let (oh, ow) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
        Geometry {
            k,
            s,
            p,
            h,
            w,
            oh,
            ow,
            rows: (oh - 1) * s + k,
            pwid: ow + (k - 1) / s,
        }
    }

    /// With stride 1 the input gradient is itself a depthwise convolution: of the output
    /// gradient, padded by `k − 1 − p`, with the kernel flipped. `None` when that pad would be
    /// negative or the stride is not 1.
    fn transposed(&self) -> Option<Geometry> {
        (self.s == 1 && self.p < self.k)
            .then(|| Self::of(self.k, 1, self.k - 1 - self.p, self.oh, self.ow))
    }

    fn phases_len(&self) -> usize {
        self.s * self.rows * self.pwid
    }

    /// The run of phase entries tap `(ky, kx)` of output row `oy` reads.
    fn tap(&self, oy: usize, ky: usize, kx: usize) -> usize {
        ((kx % self.s) * self.rows + oy * self.s + ky) * self.pwid + kx / self.s
    }

    /// The nine 3×3 taps over phases `ph`.
    fn taps3<'a>(&self, ph: &'a [f32]) -> Taps<'a> {
        Taps {
            src: ph,
            at: std::array::from_fn(|t| self.tap(0, t / 3, t % 3)),
            step: self.s * self.pwid,
        }
    }

    /// 3×3, stride 2, pad 1, input exactly twice the output: the forward reads such a plane
    /// in place ([`dw3x3::in_place`]) and its input gradient is a gather
    /// ([`dw3x3::input_grad_s2`]).
    fn halves(&self) -> bool {
        (self.k, self.s, self.p) == (3, 2, 1) && self.h == 2 * self.oh && self.w == 2 * self.ow
    }
}

/// Zeroes the entries of a `rows × ld` plane outside the block of `h × w` at `(top, left)`.
fn zero_frame(
    buf: &mut [f32],
    ld: usize,
    rows: usize,
    (top, left): (usize, usize),
    (h, w): (usize, usize),
) {
    for (r, row) in buf[..rows * ld].chunks_exact_mut(ld).enumerate() {
        if r < top || r >= top + h {
            row.fill(0.0);
        } else {
            row[..left].fill(0.0);
            row[left + w..].fill(0.0);
        }
    }
}

/// Floats of scratch one thread needs for the forward pass.
pub(crate) fn forward_scratch_len(op: &Conv2d) -> usize {
    Geometry::new(op).phases_len()
}

/// Floats of scratch one thread needs for the backward pass.
pub(crate) fn backward_scratch_len(op: &Conv2d) -> usize {
    let g = Geometry::new(op);
    let t = g.transposed().map_or(0, |t| t.phases_len());
    g.phases_len() + g.phases_len().max(t) + g.oh * g.ow
}

/// Copies one `h × w` plane into zero-padded phases (see the module docs).
#[inline(always)]
fn fill_phases(x: &[f32], g: &Geometry, ph: &mut [f32]) {
    for q in 0..g.s {
        // Phase entry j is padded column j·s + q, input column j·s + q − p.
        let j_lo = g.p.saturating_sub(q).div_ceil(g.s).min(g.pwid);
        let j_hi = (g.w + g.p)
            .saturating_sub(q)
            .div_ceil(g.s)
            .clamp(j_lo, g.pwid);
        for r in 0..g.rows {
            let row = &mut ph[(q * g.rows + r) * g.pwid..][..g.pwid];
            let iy = r.wrapping_sub(g.p);
            if iy >= g.h {
                row.fill(0.0);
                continue;
            }
            row[..j_lo].fill(0.0);
            row[j_hi..].fill(0.0);
            let x0 = j_lo * g.s + q - g.p;
            let src = &x[iy * g.w..][..g.w];
            if g.s == 1 {
                row[j_lo..j_hi].copy_from_slice(&src[x0..x0 + (j_hi - j_lo)]);
            } else if g.s == 2 && j_hi > j_lo {
                // Pairs, which the compiler vectorises; the last alone (its pair may not exist).
                let (body, end) = row[j_lo..j_hi].split_at_mut(j_hi - j_lo - 1);
                for (d, pair) in body.iter_mut().zip(src[x0..].chunks_exact(2)) {
                    *d = pair[0];
                }
                end[0] = src[x0 + 2 * (j_hi - j_lo - 1)];
            } else {
                for (d, v) in row[j_lo..j_hi]
                    .iter_mut()
                    .zip(src[x0..].iter().step_by(g.s))
                {
                    *d = *v;
                }
            }
        }
    }
}

/// `out += w·t`.
#[inline(always)]
fn axpy(out: &mut [f32], w: f32, t: &[f32]) {
    let t = &t[..out.len()];
    for (o, v) in out.iter_mut().zip(t) {
        *o += w * v;
    }
}

/// Forward pass of one image: `x` is `c × h × w`, `y` is `c × oh × ow`.
pub(crate) fn forward_image(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
) {
    forward_with(kernels::active(), op, x, weight, bias, y, scratch);
}

/// Whether the kernel set reads `op`'s planes in place (3×3, pad 1, stride 1, or stride 2
/// from an even-sized input), so that [`forward_rows`] can compute a band of rows.
pub(crate) fn reads_in_place(op: &Conv2d) -> bool {
    let kern = kernels::active();
    let g = Geometry::new(op);
    match g.s {
        1 => kern.dw3x3_same.is_some() && (g.k, g.p) == (3, 1),
        _ => kern.dw3x3_half.is_some() && g.halves(),
    }
}

/// Output rows `rows` of every channel of one image (`x` its input) by the in-place plane
/// kernels: channel `c`'s rows go to `out[c·stride ..]` (`rows.len()·ow` floats), so a band
/// can go straight into the image's output (`stride = oh·ow`) or into a buffer of its own
/// (`stride = rows.len()·ow`) that a pointwise conv then reads while it is in cache. The sums
/// are [`forward_image`]'s. Panics unless [`reads_in_place`].
pub(crate) fn forward_rows(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    out: &mut [f32],
    stride: usize,
    rows: Range<usize>,
) {
    assert!(reads_in_place(op), "depthwise rows of {op:?}");
    let kern = kernels::active();
    let g = Geometry::new(op);
    let channels = op.c_in as usize;
    let plane_in = g.h * g.w;
    let band = rows.len() * g.ow;
    assert!(
        rows.end <= g.oh
            && stride >= band
            && out.len() >= (channels - 1) * stride + band
            && x.len() >= channels * plane_in
            && weight.len() >= 9 * channels
            && bias.len() >= channels,
        "depthwise rows {rows:?} of {op:?}"
    );
    for c in 0..channels {
        let xc = &x[c * plane_in..][..plane_in];
        let w9 = weight[c * 9..][..9].try_into().expect("nine taps");
        let oc = &mut out[c * stride..][..band];
        let done = dw3x3::in_place(
            kern,
            g.s,
            xc,
            w9,
            bias[c],
            op.relu,
            oc,
            g.ow,
            (rows.start, g.oh),
        );
        debug_assert!(done, "checked above: the set reads this plane in place");
    }
}

/// [`forward_image`] with the 3×3 plane kernels of `kern`; other kernel sizes by taps, at the
/// compiler's baseline width.
fn forward_with(
    kern: &Kernels,
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
) {
    let g = Geometry::new(op);
    let kk = g.k * g.k;
    let ph = &mut scratch[..g.phases_len()];
    let same = (g.k, g.s, g.p) == (3, 1, 1);
    let half = g.halves();
    for c in 0..op.c_in as usize {
        let xc = &x[c * g.h * g.w..][..g.h * g.w];
        let yc = &mut y[c * g.oh * g.ow..][..g.oh * g.ow];
        if same || half {
            let w9 = weight[c * 9..][..9].try_into().expect("nine taps");
            if dw3x3::in_place(kern, g.s, xc, w9, bias[c], op.relu, yc, g.ow, (0, g.oh)) {
                continue;
            }
        }
        fill_phases(xc, &g, ph);
        let wc = &weight[c * kk..][..kk];
        if let Ok(w9) = <&[f32; 9]>::try_from(wc) {
            dw3x3::conv(kern, g.taps3(ph), w9, bias[c], op.relu, yc, g.ow);
            continue;
        }
        for (oy, out) in yc.chunks_exact_mut(g.ow).enumerate() {
            out.fill(bias[c]);
            for ky in 0..g.k {
                for kx in 0..g.k {
                    axpy(out, wc[ky * g.k + kx], &ph[g.tap(oy, ky, kx)..]);
                }
            }
            if op.relu {
                out.iter_mut().for_each(|v| *v = v.max(0.0));
            }
        }
    }
}

/// Backward pass of one image. `gw` and `gb` are accumulated into (`+=`); `gx`, when given, is
/// overwritten. `mask`: `gy` is masked by `y > 0` (a ReLU conv whose output gradient was not
/// masked already).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_image(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    (y, mask): (&[f32], bool),
    gy: &[f32],
    gx: Option<&mut [f32]>,
    gw: &mut [f32],
    gb: &mut [f32],
    scratch: &mut [f32],
) {
    backward_body(
        kernels::active(),
        op,
        x,
        weight,
        (y, mask),
        gy,
        gx,
        gw,
        gb,
        scratch,
    );
}

#[allow(clippy::too_many_arguments)]
fn backward_body(
    kern: &Kernels,
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    (y, mask): (&[f32], bool),
    gy: &[f32],
    mut gx: Option<&mut [f32]>,
    gw: &mut [f32],
    gb: &mut [f32],
    scratch: &mut [f32],
) {
    let g = Geometry::new(op);
    let (kk, plane, oplane) = (g.k * g.k, g.h * g.w, g.oh * g.ow);
    let gt = g.transposed();
    let (ph, rest) = scratch.split_at_mut(g.phases_len());
    let dlen = g.phases_len().max(gt.map_or(0, |t| t.phases_len()));
    let (dph, rest) = rest.split_at_mut(dlen);
    let masked = &mut rest[..oplane];
    for c in 0..op.c_in as usize {
        let gyc = &gy[c * oplane..][..oplane];
        let yc = mask.then(|| &y[c * oplane..][..oplane]);
        fill_phases(&x[c * plane..][..plane], &g, ph);
        let wc = &weight[c * kk..][..kk];
        let gwc = &mut gw[c * kk..][..kk];
        let gxc = gx.as_deref_mut().map(|gx| &mut gx[c * plane..][..plane]);
        let bufs = (&mut *dph, &mut *masked);
        let gbc = &mut gb[c];
        match <&[f32; 9]>::try_from(wc) {
            Ok(w9) => backward_3x3(kern, &g, ph, (gyc, yc), w9, (gwc, gbc), gxc, bufs),
            Err(_) => backward_taps(&g, ph, (gyc, yc), wc, (gwc, gbc), gxc, bufs),
        }
    }
}

/// The output gradient of a plane masked by `y > 0` (when there is a `y`).
type OutGrad<'a> = (&'a [f32], Option<&'a [f32]>);

/// One channel of the 3×3 backward pass by the plane kernels: the masked gradient is written
/// once, straight into the buffer its input-gradient gather reads (zero-framed), in the same
/// pass that sums the weight and bias gradients.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn backward_3x3(
    kern: &Kernels,
    g: &Geometry,
    ph: &[f32],
    (gy, y): OutGrad<'_>,
    w: &[f32; 9],
    (gw, gb): (&mut [f32], &mut f32),
    gx: Option<&mut [f32]>,
    (dph, masked): (&mut [f32], &mut [f32]),
) {
    // Stride 1 where the set reads planes in place: the input gradient is the masked output
    // gradient convolved with the flipped kernel, read straight from a plain plane.
    let same = gx.is_some() && (g.k, g.s, g.p) == (3, 1, 1) && kern.dw3x3_same.is_some();
    let gt = g.transposed().filter(|_| gx.is_some() && !same);
    let gather = gx.is_some() && g.halves();
    let (dst, at, ld): (&mut [f32], usize, usize) = if let Some(t) = gt {
        zero_frame(dph, t.pwid, t.rows, (t.p, t.p), (g.oh, g.ow));
        (dph, t.p * t.pwid + t.p, t.pwid)
    } else if gather {
        zero_frame(dph, g.ow + 1, g.oh + 1, (0, 0), (g.oh, g.ow));
        (dph, 0, g.ow + 1)
    } else {
        (masked, 0, g.ow)
    };
    let wg = WeightGrad { gy, y, dst, at, ld };
    let (sums, bsum) = dw3x3::weight_grad(kern, g.taps3(ph), wg, g.ow);
    gw.iter_mut().zip(sums).for_each(|(d, v)| *d += v);
    *gb += bsum;
    let Some(gx) = gx else {
        return;
    };
    if same {
        let flipped: [f32; 9] = std::array::from_fn(|i| w[8 - i]);
        let done = dw3x3::in_place(kern, 1, masked, &flipped, 0.0, false, gx, g.w, (0, g.h));
        debug_assert!(done, "checked above: the set reads this plane in place");
    } else if let Some(t) = gt {
        // Stride 1: a conv of the padded gradient with the flipped kernel.
        let flipped: [f32; 9] = std::array::from_fn(|i| w[8 - i]);
        let taps = t.taps3(&dph[..t.phases_len()]);
        dw3x3::conv(kern, taps, &flipped, 0.0, false, gx, g.w);
    } else if gather {
        dw3x3::input_grad_s2(kern, &dph[..(g.oh + 1) * (g.ow + 1)], w, gx, g.ow);
    } else {
        scatter_input_grad(g, masked, w, dph, gx);
    }
}

/// One channel of the backward pass for any kernel size, tap by tap.
#[inline(always)]
fn backward_taps(
    g: &Geometry,
    ph: &[f32],
    (gy, y): OutGrad<'_>,
    wc: &[f32],
    (gwc, gb): (&mut [f32], &mut f32),
    gxc: Option<&mut [f32]>,
    (dph, masked): (&mut [f32], &mut [f32]),
) {
    let gyc: &[f32] = match y {
        Some(yc) => {
            for ((m, &gv), &yv) in masked.iter_mut().zip(gy).zip(yc) {
                *m = if yv > 0.0 { gv } else { 0.0 };
            }
            masked
        }
        None => gy,
    };
    *gb += crate::compute::cpu::reduce::sum_f32(gyc);
    for ky in 0..g.k {
        for kx in 0..g.k {
            let mut lanes = [0.0f32; 8];
            for (oy, grow) in gyc.chunks_exact(g.ow).enumerate() {
                dot_lanes(&mut lanes, grow, &ph[g.tap(oy, ky, kx)..]);
            }
            gwc[ky * g.k + kx] += hsum(&lanes);
        }
    }
    let Some(gxc) = gxc else {
        return;
    };
    let Some(t) = g.transposed() else {
        return scatter_input_grad(g, gyc, wc, dph, gxc);
    };
    // Stride 1: a gather per input row (each written once, contiguous, no zero-fill and no
    // copy-out) instead of scattering every output row into the phases.
    debug_assert_eq!((t.oh, t.ow), (g.h, g.w));
    let kk = g.k * g.k;
    let tph = &mut dph[..t.phases_len()];
    fill_phases(gyc, &t, tph);
    for (iy, out) in gxc.chunks_exact_mut(g.w).enumerate() {
        out.fill(0.0);
        for ky in 0..g.k {
            for kx in 0..g.k {
                let flipped = wc[kk - 1 - (ky * g.k + kx)];
                axpy(out, flipped, &tph[t.tap(iy, ky, kx)..]);
            }
        }
    }
}

/// The input gradient of a plane by scattering every output row into zeroed phases (`dph`),
/// then copying them out.
fn scatter_input_grad(g: &Geometry, gyc: &[f32], wc: &[f32], dph: &mut [f32], gxc: &mut [f32]) {
    let dph = &mut dph[..g.phases_len()];
    dph.fill(0.0);
    for (oy, grow) in gyc.chunks_exact(g.ow).enumerate() {
        for ky in 0..g.k {
            for kx in 0..g.k {
                let at = g.tap(oy, ky, kx);
                axpy(&mut dph[at..at + g.ow], wc[ky * g.k + kx], grow);
            }
        }
    }
    for (iy, row) in gxc.chunks_exact_mut(g.w).enumerate() {
        let r = iy + g.p;
        if r >= g.rows {
            row.fill(0.0);
            continue;
        }
        // Phase by phase, so there is no division per element: input columns ix with
        // (ix + p) % s == q sit at consecutive entries (ix + p)/s of phase q; columns past
        // the last phase entry got no gradient.
        row.fill(0.0);
        for q in 0..g.s {
            let ix0 = (q + g.s - g.p % g.s) % g.s;
            if ix0 >= g.w {
                continue;
            }
            let src = &dph[(q * g.rows + r) * g.pwid..][..g.pwid];
            let j0 = (ix0 + g.p) / g.s;
            for (v, d) in row[ix0..]
                .iter_mut()
                .step_by(g.s)
                .zip(&src[j0.min(g.pwid)..])
            {
                *v = *d;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::SplitMix64;
    use crate::compute::cpu::gradcheck::random_vec;

    /// `(gx, gw, gb)` by the definition, in f64: every output tap scattered back.
    #[allow(clippy::needless_range_loop)]
    fn reference(op: &Conv2d, x: &[f32], w: &[f32], y: &[f32], gy: &[f32]) -> [Vec<f64>; 3] {
        let (c, h, wd) = (op.c_in as usize, op.h as usize, op.w as usize);
        let (k, s, p) = (op.kernel as usize, op.stride as usize, op.pad as usize);
        let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
        let (mut gx, mut gw, mut gb) = (vec![0.0; c * h * wd], vec![0.0; c * k * k], vec![0.0; c]);
        for ch in 0..c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let o = (ch * oh + oy) * ow + ox;
                    if op.relu && y[o] <= 0.0 {
                        continue;
                    }
                    let g = gy[o] as f64;
                    gb[ch] += g;
                    for ky in 0..k {
                        for kx in 0..k {
                            let (iy, ix) =
                                ((oy * s + ky).wrapping_sub(p), (ox * s + kx).wrapping_sub(p));
                            if iy < h && ix < wd {
                                let i = (ch * h + iy) * wd + ix;
                                let t = (ch * k + ky) * k + kx;
                                gw[t] += g * x[i] as f64;
                                gx[i] += g * w[t] as f64;
                            }
                        }
                    }
                }
            }
        }
        [gx, gw, gb]
    }

    /// `relu?(bias + conv)` by the definition, in f64.
    fn forward_reference(op: &Conv2d, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
        let (c, h, wd) = (op.c_in as usize, op.h as usize, op.w as usize);
        let (k, s, p) = (op.kernel as usize, op.stride as usize, op.pad as usize);
        let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
        let mut y = Vec::with_capacity(c * oh * ow);
        for ch in 0..c {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut v = b[ch] as f64;
                    for ky in 0..k {
                        for kx in 0..k {
                            let (iy, ix) =
                                ((oy * s + ky).wrapping_sub(p), (ox * s + kx).wrapping_sub(p));
                            if iy < h && ix < wd {
                                v += w[(ch * k + ky) * k + kx] as f64
                                    * x[(ch * h + iy) * wd + ix] as f64;
                            }
                        }
                    }
                    y.push(if op.relu { v.max(0.0) } else { v });
                }
            }
        }
        y
    }

    fn assert_near(op: &Conv2d, set: kernels::KernelSet, what: &str, got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, r) in got.iter().zip(want) {
            assert!(
                (*g as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()),
                "{op:?} {what} ({set} kernels): {g} vs {r}"
            );
        }
    }

    /// Forward and backward against the definition, with the plane kernels of every set this
    /// CPU runs; shapes with rows shorter and longer than a vector, and
    /// stride-2 planes exactly twice their output (the gather path) and not.
    #[test]
    fn backward_matches_the_definition_for_every_stride_kernel_and_pad() {
        let mut rng = SplitMix64::new(7);
        let sets = kernels::KernelSet::here()
            .into_iter()
            .filter_map(kernels::table);
        let tables: Vec<&Kernels> = sets.collect();
        for (k, s, p, h, wd, relu) in [
            (3, 1, 1, 9, 11, true),
            (3, 1, 0, 7, 6, false),
            (3, 2, 1, 10, 9, true),
            (5, 1, 2, 8, 13, false),
            (5, 2, 2, 11, 8, true),
            (3, 1, 2, 5, 5, false),
            (3, 1, 1, 6, 19, true),
            (3, 2, 1, 8, 34, true),
            (3, 2, 1, 6, 32, false),
            (3, 2, 1, 7, 33, true),
        ] {
            let op = Conv2d {
                n: 1,
                c_in: 3,
                h: h as u32,
                w: wd as u32,
                c_out: 3,
                kernel: k as u32,
                stride: s as u32,
                pad: p as u32,
                groups: 3,
                relu,
            };
            let x = random_vec(&mut rng, 3 * h * wd, -1.0, 1.0);
            let w = random_vec(&mut rng, 3 * k * k, -1.0, 1.0);
            let b = random_vec(&mut rng, 3, -0.5, 0.5);
            let on = 3 * (op.out_h() * op.out_w()) as usize;
            let gy = random_vec(&mut rng, on, -1.0, 1.0);
            for &kern in &tables {
                let mut y = vec![f32::NAN; on];
                let mut scr = vec![f32::NAN; forward_scratch_len(&op)];
                forward_with(kern, &op, &x, &w, &b, &mut y, &mut scr);
                assert_near(
                    &op,
                    kern.set,
                    "output",
                    &y,
                    &forward_reference(&op, &x, &w, &b),
                );
                let (mut gx, mut gw, mut gb) =
                    (vec![f32::NAN; x.len()], vec![0.0; w.len()], [0.0; 3]);
                let mut scr = vec![f32::NAN; backward_scratch_len(&op)];
                let gxs = Some(&mut gx[..]);
                let ys = (&y[..], op.relu);
                backward_body(kern, &op, &x, &w, ys, &gy, gxs, &mut gw, &mut gb, &mut scr);
                let want = reference(&op, &x, &w, &y, &gy);
                for ((got, want), what) in [&gx[..], &gw, &gb]
                    .into_iter()
                    .zip(&want)
                    .zip(["gx", "gw", "gb"])
                {
                    assert_near(&op, kern.set, what, got, want);
                }
                // Without an input gradient (a first layer) the weights get the same.
                let (mut gw2, mut gb2) = (vec![0.0; w.len()], [0.0; 3]);
                backward_body(
                    kern, &op, &x, &w, ys, &gy, None, &mut gw2, &mut gb2, &mut scr,
                );
                assert_eq!((gw2, gb2), (gw, gb));
            }
        }
    }
}
