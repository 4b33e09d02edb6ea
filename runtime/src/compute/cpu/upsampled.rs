//! A pointwise conv of a nearest-upsampled tensor (det-s's neck), computed before the
//! upsampling: a 1×1 conv, its bias and ReLU act on each pixel alone, and nearest
//! upsampling copies pixels, so `relu(W·up(x) + b) = up(relu(W·x + b))` exactly (the same sums
//! in the same order for every output pixel). The conv then costs a quarter, and the
//! upsampled tensor is never written; a residual add after the conv is done in the copy.
//!
//! Only where nothing else reads the upsampled tensor (inference; see [`super::fusion`]).

use super::conv::{self, conv2d_forward, conv2d_forward_split};
use super::pool::Pool;
use super::scratch::{run_parts, split_parts, Scratch};
use super::upsample::upsample2x_forward;
use crate::compute::ops::{Conv2d, ConvKind, Upsample2x};

/// Whether `pw` reads exactly `up`'s output as a pointwise conv.
pub(crate) fn fuses(up: &Upsample2x, pw: &Conv2d) -> bool {
    pw.kind() == ConvKind::Pointwise
        && (pw.n, pw.c_in, pw.h, pw.w) == (up.n, up.c, 2 * up.h, 2 * up.w)
}

/// The pointwise conv at `up`'s input size.
fn small(up: &Upsample2x, pw: &Conv2d) -> Conv2d {
    Conv2d {
        h: up.h,
        w: up.w,
        ..*pw
    }
}

/// Floats [`forward`] needs for the conv's output before upsampling.
pub(crate) fn low_len(up: &Upsample2x, pw: &Conv2d) -> usize {
    small(up, pw).output_len()
}

/// Conv scratch floats per thread [`forward`] needs.
pub(crate) fn scratch_len(up: &Upsample2x, pw: &Conv2d) -> usize {
    conv::conv2d_forward_scratch_len(&small(up, pw))
}

/// `out = up(relu?(pw(x) + bias)) + residual?` (see the module docs), the conv split within
/// each image where `split` (as [`conv2d_forward_split`]), into `low` ([`low_len`] floats)
/// first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    up: &Upsample2x,
    pw: &Conv2d,
    x: &[f32],
    (weight, bias): (&[f32], &[f32]),
    residual: Option<&[f32]>,
    out: &mut [f32],
    low: &mut [f32],
    scratch: &mut Scratch,
    split: bool,
) {
    assert!(
        fuses(up, pw),
        "not an upsampled pointwise conv: {up:?}, {pw:?}"
    );
    assert!(
        x.len() == up.input_len()
            && out.len() == pw.output_len()
            && residual.is_none_or(|r| r.len() == out.len()),
        "upsampled pointwise conv: tensor lengths do not match {up:?}, {pw:?}"
    );
    let op = small(up, pw);
    let low = &mut low[..op.output_len()];
    if split {
        conv2d_forward_split(&op, x, weight, bias, low, scratch);
    } else {
        conv2d_forward(&op, x, weight, bias, low, scratch);
    }
    // The conv's output channels, upsampled as `up` would have its input's.
    let up_out = Upsample2x { c: pw.c_out, ..*up };
    match residual {
        Some(residual) => {
            let pool = scratch.pool().filter(|_| split);
            upsample_add_split(pool.as_deref(), &up_out, low, residual, out)
        }
        None => upsample2x_forward(&up_out, low, out),
    }
}

/// [`upsample_add`] with the planes shared out over `pool`'s threads (all on this thread
/// without one): the same values. At batch 1 the add had been the longest stretch of det-s's
/// forward pass with one thread idle (5 µs of 195 at two threads).
pub(crate) fn upsample_add_split(
    pool: Option<&Pool>,
    up: &Upsample2x,
    x: &[f32],
    residual: &[f32],
    out: &mut [f32],
) {
    assert!(
        x.len() == up.input_len() && out.len() == up.output_len() && residual.len() == out.len(),
        "upsample + add: tensor lengths do not match {up:?}"
    );
    let (planes, plane) = ((up.n * up.c) as usize, (up.h * up.w) as usize);
    let parts = pool.map_or(1, Pool::threads).min(planes).max(1);
    run_parts(
        pool,
        split_parts(out, planes, 4 * plane, parts),
        |(range, out)| {
            let part = Upsample2x {
                n: 1,
                c: range.len() as u32,
                ..*up
            };
            let x = &x[range.start * plane..range.end * plane];
            let residual = &residual[4 * range.start * plane..4 * range.end * plane];
            upsample_add(&part, x, residual, out);
        },
    );
}

/// `out = up(x) + residual`: a nearest upsampling and the add after it in one pass, the
/// upsampled tensor never written (the same sums as the two steps).
pub(crate) fn upsample_add(up: &Upsample2x, x: &[f32], residual: &[f32], out: &mut [f32]) {
    assert!(
        x.len() == up.input_len() && out.len() == up.output_len() && residual.len() == out.len(),
        "upsample + add: tensor lengths do not match {up:?}"
    );
    let (h, w) = (up.h as usize, up.w as usize);
    let planes = x.chunks_exact(h * w).zip(out.chunks_exact_mut(4 * h * w));
    for (p, (src, dst)) in planes.enumerate() {
        for (oy, row) in dst.chunks_exact_mut(2 * w).enumerate() {
            let line = &src[(oy / 2) * w..][..w];
            let skip = &residual[(p * 2 * h + oy) * 2 * w..][..2 * w];
            upsample_add_row(line, skip, row);
        }
    }
}

/// One output row of [`upsample_add`]: `row[2j + k] = line[j] + skip[2j + k]`.
#[inline]
pub(super) fn upsample_add_row(line: &[f32], skip: &[f32], row: &mut [f32]) {
    for ((pair, s), v) in row.chunks_exact_mut(2).zip(skip.chunks_exact(2)).zip(line) {
        pair[0] = v + s[0];
        pair[1] = v + s[1];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_add_split_over_threads_gives_the_values_of_one_thread() {
        // Planes that do not divide among the threads; two images.
        let up = Upsample2x {
            n: 2,
            c: 5,
            h: 3,
            w: 4,
        };
        let x: Vec<f32> = (0..up.input_len())
            .map(|i| (i as f32 * 0.7).sin())
            .collect();
        let residual: Vec<f32> = (0..up.output_len())
            .map(|i| (i as f32 * 0.3).cos())
            .collect();
        let mut want = vec![f32::NAN; up.output_len()];
        upsample_add(&up, &x, &residual, &mut want);
        // Every output is its input pixel plus the residual (nearest: pixel (oy/2, ox/2)).
        for (i, v) in want.iter().enumerate() {
            let (plane, rest) = (i / 48, i % 48);
            let (oy, ox) = (rest / 8, rest % 8);
            assert_eq!(*v, x[plane * 12 + (oy / 2) * 4 + ox / 2] + residual[i]);
        }
        for threads in [2, 3, 4] {
            let pool = Pool::new(threads);
            let mut got = vec![f32::NAN; up.output_len()];
            upsample_add_split(Some(&pool), &up, &x, &residual, &mut got);
            assert_eq!(got, want, "{threads} threads");
        }
        let mut got = vec![f32::NAN; up.output_len()];
        upsample_add_split(None, &up, &x, &residual, &mut got);
        assert_eq!(got, want, "no pool");
    }
}
