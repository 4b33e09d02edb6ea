//! Batch-1 kernels that split each image over the threads in bands of rows, every part
//! reading and writing its own copy of the tensors where they are banded
//! ([`super::band_copies`]): a pointwise conv (alone, feeding an add, or after a depthwise
//! conv in [`super::separable::forward_bands`], which shares [`pointwise_band`]) and a nearest
//! upsampling with the add after it.
//!
//! Part `t` of `threads` computes the output rows [`part_range`] gives it (none, where there
//! are more threads than rows), so that a row's owner is the same in every banded kernel.

use super::band_copies::{self, PartCopies};
use super::gemm::{rm, Epilogue, Mat};
use super::kernels;
use super::pool::Pool;
use super::scratch::part_range;
use super::upsampled;
use crate::compute::ops::{Conv2d, ConvKind, Upsample2x};

/// Pointwise conv `op`'s outputs at pixels `j0 .. j0 + px` of one image, every channel:
/// `relu?(W·B + bias) + residual?`, `B` those pixels' inputs (`c_in` rows of `px`), stored
/// at `out` (the image's output, planes `plane` apart) plus `i·plane + j0 + j`. `residual` is
/// the image's, shaped as its output.
///
/// # Safety
/// `gemm` is the active set's; `out + i·plane + j0 + j` for `i < c_out`, `j < px` lies in
/// memory that only this call touches while it runs.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pointwise_band(
    gemm: kernels::GemmFused,
    op: &Conv2d,
    weight: &[f32],
    bias: &[f32],
    band: Mat<'_>,
    residual: Option<&[f32]>,
    out: *mut f32,
    (j0, px): (usize, usize),
) {
    let (ci, co) = (op.c_in as usize, op.c_out as usize);
    let plane = op.out_h() as usize * op.out_w() as usize;
    assert!(
        op.kind() == ConvKind::Pointwise
            && weight.len() == co * ci
            && bias.len() == co
            && j0 + px <= plane
            && band.cs == 1
            && band.rs >= px
            && band.data.len() >= (ci - 1) * band.rs + px
            && residual.is_none_or(|r| r.len() >= co * plane),
        "pointwise band {j0}+{px} of {op:?}"
    );
    let ep = Epilogue {
        bias: Some(bias),
        relu: op.relu,
        residual: residual.map(|r| &r[j0..]),
    };
    // SAFETY: the active set's GEMM (the caller's promise); A is co × ci, B ci × px and the
    // residual reaches element (co − 1)·plane + j0 + px − 1, inside their slices (asserted
    // above); C's elements are this call's alone (the caller's promise).
    unsafe {
        gemm(
            co,
            ci,
            px,
            1.0,
            rm(weight, ci),
            band,
            0.0,
            out.wrapping_add(j0),
            plane,
            ep,
        )
    };
}

/// A pointwise conv, `output = relu?(conv(input) + bias) + residual?`, each image's rows split
/// over `pool`'s threads in bands: each thread packs only its own pixels of the input, where
/// a split by output channels has every thread pack all of them. False, having done nothing,
/// where the kernel set has no fused GEMM.
///
/// # Safety
/// `input`, `residual` and `output` hold (in every copy) tensors of `op`'s shapes, `output`
/// distinct memory from the others, and nothing else touches them while this runs; a banded
/// one holds in each part's copy the rows that part owns.
pub(super) unsafe fn pointwise(
    op: &Conv2d,
    input: PartCopies,
    weight: &[f32],
    bias: &[f32],
    residual: Option<PartCopies>,
    output: PartCopies,
    pool: &Pool,
) -> bool {
    let Some(gemm) = kernels::active().gemm_fused else {
        return false;
    };
    assert!(
        op.kind() == ConvKind::Pointwise
            && input.len == op.input_len()
            && output.len == op.output_len()
            && residual.is_none_or(|r| r.len == output.len),
        "pointwise conv in bands: tensor lengths do not match {op:?}"
    );
    let (n, co) = (op.n as usize, op.c_out as usize);
    let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
    let (in_img, out_img, plane) = (input.len / n, output.len / n, oh * ow);
    let parts = pool.threads();
    for b in 0..n {
        pool.run(parts, &|part| {
            let rows = part_range(oh, parts, part);
            if rows.is_empty() {
                return;
            }
            let (j0, px) = (rows.start * ow, rows.len() * ow);
            // SAFETY: no part writes `input` or `residual` (a pointwise conv reads no rows
            // beyond its band's: nothing to pull), and they outlive the job.
            let x = &unsafe { input.read(part) }[b * in_img..][..in_img];
            let residual = residual.map(|r| &unsafe { r.read(part) }[b * out_img..][..out_img]);
            let band = Mat {
                data: &x[j0..],
                rs: plane,
                cs: 1,
            };
            let out = output.part(part).wrapping_add(b * out_img);
            // SAFETY: the active set's GEMM; the band's pixels of image b, every channel, in
            // this part's copy of `output`: no other part writes them (other rows, or other
            // copies), and nothing else touches `output` (the caller's promise).
            unsafe { pointwise_band(gemm, op, weight, bias, band, residual, out, (j0, px)) };
            let planes = b * co..(b + 1) * co;
            // SAFETY: this part's band of image b's planes was written just above, and no
            // part writes it again in this job; its edge rows are this part's alone.
            unsafe { band_copies::publish_edges(&output, part, parts, planes, (oh, ow)) };
        });
    }
    true
}

/// `out = up(x) + residual`, a nearest 2× upsampling and the add after it (the sums of
/// [`upsampled::upsample_add`]), each image's output rows split over `pool`'s threads
/// in bands; a part first copies into its copy of `x` the input rows its band reads that
/// other parts own.
///
/// # Safety
/// As for [`pointwise`], `x`'s planes `up.h × up.w`, `residual`'s and `out`'s twice that.
pub(super) unsafe fn upsample_add(
    pool: &Pool,
    up: &Upsample2x,
    x: PartCopies,
    residual: PartCopies,
    out: PartCopies,
) {
    assert!(
        x.len == up.input_len() && out.len == up.output_len() && residual.len == out.len,
        "upsample + add in bands: tensor lengths do not match {up:?}"
    );
    let (n, c) = (up.n as usize, up.c as usize);
    let (h, w) = (up.h as usize, up.w as usize);
    let (oh, ow) = (2 * h, 2 * w);
    let parts = pool.threads();
    pool.run(parts, &|part| {
        let rows = part_range(oh, parts, part);
        if rows.is_empty() {
            return;
        }
        let reach = rows.start / 2..(rows.end - 1) / 2 + 1;
        // SAFETY: `x` holds n·c planes of h × w (asserted above); other parts write only
        // rows they do not own, in their own copies, and this part's copy is its alone.
        unsafe { band_copies::pull_rows(&x, part, parts, 0..n * c, (h, w), reach) };
        // SAFETY: this part's copy of `x` is written no more (the pull was its last write),
        // and no part writes `residual`; both outlive the job.
        let (x, residual) = unsafe { (x.read(part), residual.read(part)) };
        let to = out.part(part);
        for plane in 0..n * c {
            for oy in rows.clone() {
                let line = &x[(plane * h + oy / 2) * w..][..w];
                let at = (plane * oh + oy) * ow;
                let skip = &residual[at..][..ow];
                // SAFETY: row oy of this plane of `out` (inside it: asserted above), in this
                // part's copy, which only this part touches while the job runs.
                let row = unsafe { std::slice::from_raw_parts_mut(to.add(at), ow) };
                upsampled::upsample_add_row(line, skip, row);
            }
        }
        // SAFETY: this part's band of every plane was written just above, and no part writes
        // it again in this job; its edge rows are this part's alone.
        unsafe { band_copies::publish_edges(&out, part, parts, 0..n * c, (oh, ow)) };
    });
}
