//! A depthwise conv and the pointwise conv that reads its output (det-s's depthwise-separable
//! blocks), run as one kernel, so the depthwise output is read back while it is in cache:
//!
//! - [`forward_images`], the batch split: each thread takes whole images and runs the
//!   pointwise conv of an image right after its depthwise conv, instead of after the
//!   depthwise conv of every image of its share (a training batch's activations are
//!   megabytes: by then the first image's are out of cache). The depthwise output is written
//!   as before (the backward pass reads it).
//! - [`forward_bands`], the split of one image (batch 1): each thread takes a band of rows,
//!   computes the depthwise output of the band for every channel into a buffer of its own
//!   (tens of KiB) and the pointwise conv of the band's pixels from there. The depthwise
//!   output tensor is never written: only where nothing else reads it (inference; see
//!   [`super::fusion`]). Between two such pairs each thread keeps its band in a copy of its
//!   own ([`super::band_copies`]), and only the rows at a band's edge pass between threads.
//!
//! Both compute every output with the sums of the two steps, in the same order: the results
//! are identical.

use super::band_copies::{self, PartCopies};
use super::banded;
use super::conv::pointwise_image;
use super::depthwise;
use super::gemm::Mat;
use super::kernels;
use super::pool::Pool;
use super::scratch::{part_range, run_parts, split_parts, Scratch};
use crate::compute::ops::{Conv2d, ConvKind};

/// The two convs and their weights and biases.
#[derive(Clone, Copy)]
pub(crate) struct Pair<'a> {
    pub dw: &'a Conv2d,
    pub dw_weight: &'a [f32],
    pub dw_bias: &'a [f32],
    pub pw: &'a Conv2d,
    pub pw_weight: &'a [f32],
    pub pw_bias: &'a [f32],
}

/// Whether `pw` reads `dw`'s output as a pair this module runs: the depthwise planes read in
/// place by the kernel set, a pointwise conv over exactly its output.
pub(crate) fn fuses(dw: &Conv2d, pw: &Conv2d) -> bool {
    dw.kind() == ConvKind::Depthwise
        && pw.kind() == ConvKind::Pointwise
        && depthwise::reads_in_place(dw)
        && (pw.n, pw.c_in, pw.h, pw.w) == (dw.n, dw.c_out, dw.out_h(), dw.out_w())
}

/// Floats of scratch each of `threads` threads needs for [`forward_bands`]: its band's
/// depthwise output.
pub(crate) fn bands_scratch_len(dw: &Conv2d, threads: usize) -> usize {
    let rows = (dw.out_h() as usize).div_ceil(threads.max(1));
    dw.c_out as usize * rows * dw.out_w() as usize
}

/// Panics unless the pair's tensors have the lengths of its ops.
fn check(p: &Pair<'_>, x: &[f32], residual: Option<&[f32]>, out: &[f32]) {
    check_lens(p, x.len(), residual.map(<[f32]>::len), out.len());
}

/// Panics unless tensors of these lengths are the pair's.
fn check_lens(p: &Pair<'_>, x: usize, residual: Option<usize>, out: usize) {
    assert!(
        fuses(p.dw, p.pw),
        "not a separable pair: {:?}, {:?}",
        p.dw,
        p.pw
    );
    assert!(
        x == p.dw.input_len()
            && p.dw_weight.len() == p.dw.weight_len()
            && p.dw_bias.len() == p.dw.bias_len()
            && p.pw_weight.len() == p.pw.weight_len()
            && p.pw_bias.len() == p.pw.bias_len()
            && out == p.pw.output_len()
            && residual.is_none_or(|r| r == out),
        "separable pair: tensor lengths do not match {:?}, {:?}",
        p.dw,
        p.pw
    );
}

/// Both convs over the batch split over `pool`'s threads, image by image (see the module
/// docs): `d` gets the depthwise output, `out = relu?(pw(d) + bias) + residual?`.
pub(crate) fn forward_images(
    p: &Pair<'_>,
    x: &[f32],
    d: &mut [f32],
    residual: Option<&[f32]>,
    out: &mut [f32],
    pool: Option<&Pool>,
) {
    check(p, x, residual, out);
    assert_eq!(
        d.len(),
        p.dw.output_len(),
        "separable pair: depthwise output"
    );
    let n = p.dw.n as usize;
    let (x_img, d_img, out_img) = (x.len() / n, d.len() / n, out.len() / n);
    let oh = p.dw.out_h() as usize;
    let parts = pool.map_or(1, Pool::threads).min(n);
    let items = split_parts(d, n, d_img, parts).zip(split_parts(out, n, out_img, parts));
    run_parts(pool, items, |((images, d), (_, out))| {
        let per_image = d.chunks_exact_mut(d_img).zip(out.chunks_exact_mut(out_img));
        for (b, (db, ob)) in images.zip(per_image) {
            let xb = &x[b * x_img..][..x_img];
            depthwise::forward_rows(
                p.dw,
                xb,
                p.dw_weight,
                p.dw_bias,
                db,
                d_img / p.dw.c_out as usize,
                0..oh,
            );
            let res = residual.map(|r| &r[b * out_img..][..out_img]);
            pointwise_image(p.pw, db, p.pw_weight, p.pw_bias, res, ob);
        }
    });
}

/// Both convs with each image's rows split over the threads in bands, the depthwise output
/// of a band kept in the thread's scratch ([`bands_scratch_len`]) and never written to a
/// tensor (see the module docs). Each part reads and writes its own copy of `x`, `residual`
/// and `out` where they are banded ([`super::band_copies`]), first copying into its copy of
/// `x` the rows at its band's edge that other parts wrote. False, having done nothing, where
/// there is no pool or the kernel set has no fused GEMM (whose C can be columns of the
/// output that other threads share rows with).
///
/// # Safety
/// `x`, `residual` and `out` hold (in every copy) tensors of the pair's shapes, distinct
/// memory each, that nothing else touches while this runs; a banded `x` (or `residual`) holds
/// in each part's copy the rows that part owns, as a banded kernel before wrote them.
pub(crate) unsafe fn forward_bands(
    p: &Pair<'_>,
    x: PartCopies,
    residual: Option<PartCopies>,
    out: PartCopies,
    scratch: &mut Scratch,
) -> bool {
    let (Some(pool), Some(gemm)) = (scratch.pool(), kernels::active().gemm_fused) else {
        return false;
    };
    check_lens(p, x.len, residual.map(|r| r.len), out.len);
    let n = p.dw.n as usize;
    let (h, w) = (p.dw.h as usize, p.dw.w as usize);
    let (oh, ow) = (p.dw.out_h() as usize, p.dw.out_w() as usize);
    let s = p.dw.stride as usize;
    let (ci, co) = (p.pw.c_in as usize, p.pw.c_out as usize);
    let (x_img, out_img) = (x.len / n, out.len / n);
    // Every part, even one with no rows, so that a row's owner is the same in every banded
    // kernel (see `band_copies`).
    let parts = pool.threads();
    let per = bands_scratch_len(p.dw, parts);
    for b in 0..n {
        let bands = scratch.take(per, parts, "bands_scratch_len");
        run_parts(Some(&*pool), bands.enumerate(), |(part, buf)| {
            let rows = part_range(oh, parts, part);
            if rows.is_empty() {
                return;
            }
            // The input rows the band's 3 × 3 taps (pad 1) reach.
            let reach = (rows.start * s).saturating_sub(1)..((rows.end - 1) * s + 2).min(h);
            // SAFETY: `x` holds n·ci planes of h × w (checked above); other parts write only
            // rows they do not own, in their own copies (this same pull), and part `part`'s
            // copy is this part's alone (the caller's promise and the copies' layout).
            unsafe { band_copies::pull_rows(&x, part, parts, b * ci..(b + 1) * ci, (h, w), reach) };
            // SAFETY: the copy lives while this runs (the caller's promise); no part writes
            // it from here on (the pull above was this part's last write to it).
            let xb = &unsafe { x.read(part) }[b * x_img..][..x_img];
            let px = rows.len() * ow;
            let j0 = rows.start * ow;
            depthwise::forward_rows(p.dw, xb, p.dw_weight, p.dw_bias, buf, px, rows);
            // SAFETY: the residual is read only, by every part, while this runs.
            let residual = residual.map(|r| &unsafe { r.read(part) }[b * out_img..][..out_img]);
            let band = Mat {
                data: &buf[..ci * px],
                rs: px,
                cs: 1,
            };
            let to = out.part(part).wrapping_add(b * out_img);
            // SAFETY: the active set's GEMM; the band's pixels of image b, every channel, in
            // this part's copy of `out`: no other part writes them (other rows, or other
            // copies), and nothing else touches `out` while this runs (the caller's promise).
            unsafe {
                banded::pointwise_band(
                    gemm,
                    p.pw,
                    p.pw_weight,
                    p.pw_bias,
                    band,
                    residual,
                    to,
                    (j0, px),
                )
            };
            let planes = b * co..(b + 1) * co;
            // SAFETY: this part's band of image b's planes was written just above, and no
            // part writes it again in this job; its edge rows are this part's alone.
            unsafe { band_copies::publish_edges(&out, part, parts, planes, (oh, ow)) };
        });
    }
    true
}
