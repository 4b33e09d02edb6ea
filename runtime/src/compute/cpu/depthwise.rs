//! Depthwise convolution (`groups = c_in = c_out`) by direct loops, one channel plane at a time.
//!
//! Each input plane is first copied, zero-padded, into *phases*: with stride `s`, phase `q`
//! holds the padded columns `q, q + s, q + 2s, …`, so tap `(ky, kx)` of output row `oy` reads
//! the contiguous run `phase[kx % s][oy·s + ky][kx/s ..][.. out_w]`. Every inner loop then walks
//! contiguous memory with no branch and no bounds check, which the compiler vectorises (3×3 taps
//! are unrolled by hand into one pass over the row). The backward pass accumulates the input
//! gradient into phases the same way and copies it out.

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
        let (k, s) = (op.kernel as usize, op.stride as usize);
        let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
        Geometry {
            k,
            s,
            p: op.pad as usize,
            h: op.h as usize,
            w: op.w as usize,
            oh,
            ow,
            rows: (oh - 1) * s + k,
            pwid: ow + (k - 1) / s,
        }
    }

    fn phases_len(&self) -> usize {
        self.s * self.rows * self.pwid
    }

    /// The run of phase entries tap `(ky, kx)` of output row `oy` reads.
    fn tap(&self, oy: usize, ky: usize, kx: usize) -> usize {
        ((kx % self.s) * self.rows + oy * self.s + ky) * self.pwid + kx / self.s
    }
}

/// Floats of scratch one thread needs for the forward pass.
pub(crate) fn forward_scratch_len(op: &Conv2d) -> usize {
    Geometry::new(op).phases_len()
}

/// Floats of scratch one thread needs for the backward pass.
pub(crate) fn backward_scratch_len(op: &Conv2d) -> usize {
    let g = Geometry::new(op);
    2 * g.phases_len() + g.oh * g.ow
}

/// Copies one `h × w` plane into zero-padded phases (see the module docs).
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

/// `out = bias + Σ taps`, then ReLU when `RELU`: the 3×3 case, all nine taps in one pass.
fn row_3x3<const RELU: bool>(out: &mut [f32], t: [&[f32]; 9], w: &[f32], bias: f32) {
    let n = out.len();
    let w: [f32; 9] = w[..9].try_into().unwrap();
    let [t0, t1, t2, t3, t4, t5, t6, t7, t8] = t.map(|t| &t[..n]);
    for i in 0..n {
        let a = bias
            + w[0] * t0[i]
            + w[1] * t1[i]
            + w[2] * t2[i]
            + w[3] * t3[i]
            + w[4] * t4[i]
            + w[5] * t5[i]
            + w[6] * t6[i]
            + w[7] * t7[i]
            + w[8] * t8[i];
        out[i] = if RELU { a.max(0.0) } else { a };
    }
}

/// `out += w·t`.
fn axpy(out: &mut [f32], w: f32, t: &[f32]) {
    let t = &t[..out.len()];
    for (o, v) in out.iter_mut().zip(t) {
        *o += w * v;
    }
}

/// Dot product with eight independent partial sums (so the compiler can vectorise it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let b = &b[..a.len()];
    let mut acc = [0.0f32; 8];
    let (ac, ar) = a.split_at(a.len() / 8 * 8);
    let (bc, br) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
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
    let g = Geometry::new(op);
    let kk = g.k * g.k;
    let ph = &mut scratch[..g.phases_len()];
    for c in 0..op.c_in as usize {
        fill_phases(&x[c * g.h * g.w..][..g.h * g.w], &g, ph);
        let wc = &weight[c * kk..][..kk];
        let yc = &mut y[c * g.oh * g.ow..][..g.oh * g.ow];
        for (oy, out) in yc.chunks_exact_mut(g.ow).enumerate() {
            if g.k == 3 {
                let t: [&[f32]; 9] = std::array::from_fn(|i| &ph[g.tap(oy, i / 3, i % 3)..]);
                if op.relu {
                    row_3x3::<true>(out, t, wc, bias[c]);
                } else {
                    row_3x3::<false>(out, t, wc, bias[c]);
                }
            } else {
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
}

/// Backward pass of one image. `gw` and `gb` are accumulated into (`+=`); `gx`, when given, is
/// overwritten.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_image(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    y: &[f32],
    gy: &[f32],
    mut gx: Option<&mut [f32]>,
    gw: &mut [f32],
    gb: &mut [f32],
    scratch: &mut [f32],
) {
    let g = Geometry::new(op);
    let (kk, plane, oplane) = (g.k * g.k, g.h * g.w, g.oh * g.ow);
    let (ph, rest) = scratch.split_at_mut(g.phases_len());
    let (dph, rest) = rest.split_at_mut(g.phases_len());
    let masked = &mut rest[..oplane];
    for c in 0..op.c_in as usize {
        let gyc = &gy[c * oplane..][..oplane];
        let gyc: &[f32] = if op.relu {
            let yc = &y[c * oplane..][..oplane];
            for ((m, &gv), &yv) in masked.iter_mut().zip(gyc).zip(yc) {
                *m = if yv > 0.0 { gv } else { 0.0 };
            }
            masked
        } else {
            gyc
        };
        gb[c] += crate::compute::cpu::reduce::sum_f32(gyc);

        fill_phases(&x[c * plane..][..plane], &g, ph);
        let wc = &weight[c * kk..][..kk];
        let gwc = &mut gw[c * kk..][..kk];
        for ky in 0..g.k {
            for kx in 0..g.k {
                let mut s = 0.0;
                for (oy, grow) in gyc.chunks_exact(g.ow).enumerate() {
                    s += dot(grow, &ph[g.tap(oy, ky, kx)..]);
                }
                gwc[ky * g.k + kx] += s;
            }
        }

        let Some(gx) = gx.as_deref_mut() else {
            continue;
        };
        dph.fill(0.0);
        for (oy, grow) in gyc.chunks_exact(g.ow).enumerate() {
            for ky in 0..g.k {
                for kx in 0..g.k {
                    let at = g.tap(oy, ky, kx);
                    axpy(&mut dph[at..at + g.ow], wc[ky * g.k + kx], grow);
                }
            }
        }
        let gxc = &mut gx[c * plane..][..plane];
        for (iy, row) in gxc.chunks_exact_mut(g.w).enumerate() {
            let r = iy + g.p;
            if r >= g.rows {
                row.fill(0.0);
                continue;
            }
            for (ix, v) in row.iter_mut().enumerate() {
                let col = ix + g.p;
                let j = col / g.s;
                *v = if j < g.pwid {
                    dph[((col % g.s) * g.rows + r) * g.pwid + j]
                } else {
                    0.0
                };
            }
        }
    }
}
