//! Convolution + bias (+ ReLU), forward and backward, on the CPU.
//!
//! By [`ConvKind`]:
//!
//! - **Pointwise**: per image `Y = W · X` (`c_out × c_in` times `c_in × h·w`) with
//!   the allocation-free GEMM of `gemm.rs`; backward `dW += G · Xᵀ`, `dX = Wᵀ · G` (transposes are strides, no
//!   copies).
//! - **Dense / grouped**: per image and group, `im2col` (one row per input channel and tap, one
//!   column per output pixel), then the same products; the backward pass scatters the column
//!   gradient back with `col2im`.
//! - **Depthwise**: direct loops, see [`super::depthwise`].
//!
//! Bias and ReLU are applied as the product is stored (the GEMM's epilogue). The backward pass first masks the
//! output gradient with `output > 0` when the op has a ReLU (the gradient at exactly 0 is 0),
//! from the stored *output*, so the pre-activation need not be kept.
//!
//! Work is split over the batch on [`Scratch::threads`] threads; in the backward pass each
//! thread sums its images' weight and bias gradients into its own buffer (the first thread
//! directly into the outputs) and the partial sums are added at the end.

use super::band_copies::PartCopies;
use super::banded;
use super::gemm::{rm, sgemm, sgemm_ep, tr, Epilogue};
use super::kernels::Dense3x3Input;
use super::pool::Pool;
use super::scratch::{run_parts, split_parts, Scratch};
use super::{depthwise, reduce, stem};
use crate::compute::ops::{Conv2d, ConvKind};

/// Sizes one image of the op touches: input, output, pixels per output plane, and the
/// `im2col` rows of one group.
fn image_sizes(op: &Conv2d) -> (usize, usize, usize, usize) {
    let plane_out = op.out_h() as usize * op.out_w() as usize;
    let cols = op.c_in_per_group() as usize * (op.kernel * op.kernel) as usize;
    (
        op.c_in as usize * op.h as usize * op.w as usize,
        op.c_out as usize * plane_out,
        plane_out,
        cols,
    )
}

/// Floats of [`Scratch`] one thread needs for [`conv2d_forward`].
pub fn conv2d_forward_scratch_len(op: &Conv2d) -> usize {
    let (_, _, _, cols) = image_sizes(op);
    match op.kind() {
        ConvKind::Pointwise => 0,
        ConvKind::Depthwise => depthwise::forward_scratch_len(op),
        ConvKind::Dense if stem::reads_in_place(op) => 0,
        ConvKind::Dense | ConvKind::Grouped => cols * im2col_block_rows(op) * op.out_w() as usize,
    }
}

/// Output rows whose `im2col` columns take about `floats` floats (at least one row, at most
/// the plane): a band that stays in cache between `im2col` and the product.
fn im2col_band_rows(op: &Conv2d, floats: usize) -> usize {
    let (_, _, _, cols) = image_sizes(op);
    (floats / (cols * op.out_w() as usize)).clamp(1, op.out_h() as usize)
}

/// Output rows the forward pass's `im2col` fills at a time (~16 KiB of columns, in L1).
fn im2col_block_rows(op: &Conv2d) -> usize {
    im2col_band_rows(op, 4096)
}

/// Output rows per band of a weight-only backward pass (see `backward_image`; ~32 KiB).
fn backward_band_rows(op: &Conv2d) -> usize {
    im2col_band_rows(op, 8192)
}

/// Floats of [`Scratch`] one thread needs for [`conv2d_backward`].
pub fn conv2d_backward_scratch_len(op: &Conv2d) -> usize {
    let (_, out_img, plane_out, cols) = image_sizes(op);
    let partial = op.weight_len() + op.bias_len();
    partial
        + match op.kind() {
            ConvKind::Pointwise => out_img,
            ConvKind::Depthwise => depthwise::backward_scratch_len(op),
            ConvKind::Dense | ConvKind::Grouped => out_img + cols * plane_out,
        }
}

fn check_lens(op: &Conv2d, x: &[f32], weight: &[f32], bias: &[f32], y_len: usize) {
    if let Err(e) = op.validate() {
        panic!("invalid Conv2d {op:?}: {e}");
    }
    assert_eq!(x.len(), op.input_len(), "conv input length");
    assert_eq!(weight.len(), op.weight_len(), "conv weight length");
    assert_eq!(bias.len(), op.bias_len(), "conv bias length");
    assert_eq!(y_len, op.output_len(), "conv output length");
}

/// Writes `col[(ci·k + ky)·k + kx][oy·ow + ox] = x[ci][oy·s + ky − p][ox·s + kx − p]` (zero
/// outside the input) for the `c` channels of `x`.
///
/// Only output rows `oys` (`col` then has `oys.len()·ow` columns).
fn im2col(op: &Conv2d, c: usize, x: &[f32], col: &mut [f32], oys: std::ops::Range<usize>) {
    let (h, w) = (op.h as usize, op.w as usize);
    let (k, s, p) = (op.kernel as usize, op.stride as usize, op.pad as usize);
    let ow = op.out_w() as usize;
    let mut rows = col.chunks_exact_mut(oys.len() * ow);
    for ci in 0..c {
        let plane = &x[ci * h * w..][..h * w];
        for ky in 0..k {
            for kx in 0..k {
                let row = rows.next().unwrap();
                // Output columns whose input column ox·s + kx − p lies in 0..w.
                let lo = p.saturating_sub(kx).div_ceil(s).min(ow);
                let hi = (w + p).saturating_sub(kx).div_ceil(s).clamp(lo, ow);
                for (oy, out) in oys.clone().zip(row.chunks_exact_mut(ow)) {
                    let iy = (oy * s + ky).wrapping_sub(p);
                    if iy >= h {
                        out.fill(0.0);
                        continue;
                    }
                    out[..lo].fill(0.0);
                    out[hi..].fill(0.0);
                    let src = &plane[iy * w + lo * s + kx - p..];
                    if s == 1 {
                        out[lo..hi].copy_from_slice(&src[..hi - lo]);
                    } else if s == 2 && hi > lo {
                        // Pairs: a known stride the compiler vectorises (with shuffles); the
                        // last element alone, as its pair may run past the plane.
                        let (body, end) = out[lo..hi].split_at_mut(hi - lo - 1);
                        for (d, pair) in body.iter_mut().zip(src.chunks_exact(2)) {
                            *d = pair[0];
                        }
                        end[0] = src[2 * (hi - lo - 1)];
                    } else {
                        for (d, v) in out[lo..hi].iter_mut().zip(src.iter().step_by(s)) {
                            *d = *v;
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: adds every column entry into the input position it came from.
/// `gx` (the `c` channels) must be zeroed (or hold what to add to) beforehand.
fn col2im_add(op: &Conv2d, c: usize, col: &[f32], gx: &mut [f32]) {
    let (h, w) = (op.h as usize, op.w as usize);
    let (k, s, p) = (op.kernel as usize, op.stride as usize, op.pad as usize);
    let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
    let mut rows = col.chunks_exact(oh * ow);
    for ci in 0..c {
        let plane = &mut gx[ci * h * w..][..h * w];
        for ky in 0..k {
            for kx in 0..k {
                let row = rows.next().unwrap();
                let lo = p.saturating_sub(kx).div_ceil(s).min(ow);
                let hi = (w + p).saturating_sub(kx).div_ceil(s).clamp(lo, ow);
                for (oy, src) in row.chunks_exact(ow).enumerate() {
                    let iy = (oy * s + ky).wrapping_sub(p);
                    if iy >= h || lo == hi {
                        continue;
                    }
                    let dst = &mut plane[iy * w + lo * s + kx - p..];
                    for (d, v) in dst.iter_mut().step_by(s).zip(&src[lo..hi]) {
                        *d += *v;
                    }
                }
            }
        }
    }
}

/// One image of a pointwise conv: a GEMM of the weights and the input planes, with the bias,
/// the ReLU and (where given) a residual shaped as `y` in its store.
pub(super) fn pointwise_image(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    residual: Option<&[f32]>,
    y: &mut [f32],
) {
    let (_, _, plane, _) = image_sizes(op);
    let (ci, co) = (op.c_in as usize, op.c_out as usize);
    let ep = Epilogue {
        bias: Some(bias),
        relu: op.relu,
        residual,
    };
    sgemm_ep(
        co,
        ci,
        plane,
        1.0,
        rm(weight, ci),
        rm(x, plane),
        0.0,
        y,
        plane,
        ep,
    );
}

fn forward_image(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
) {
    let (in_img, _, plane_out, cols) = image_sizes(op);
    match op.kind() {
        ConvKind::Depthwise => depthwise::forward_image(op, x, weight, bias, y, scratch),
        ConvKind::Pointwise => pointwise_image(op, x, weight, bias, None, y),
        ConvKind::Dense if stem::reads_in_place(op) => {
            stem::forward_image(op, Dense3x3Input::Planes(x), weight, bias, y)
        }
        ConvKind::Dense | ConvKind::Grouped => {
            let groups = op.groups as usize;
            let (cig, cog) = (op.c_in_per_group() as usize, op.c_out_per_group() as usize);
            let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
            let block = im2col_block_rows(op);
            for g in 0..groups {
                let xg = &x[g * in_img / groups..][..in_img / groups];
                let ep = Epilogue {
                    bias: Some(&bias[g * cog..]),
                    relu: op.relu,
                    residual: None,
                };
                for oy0 in (0..oh).step_by(block) {
                    let oys = oy0..(oy0 + block).min(oh);
                    let nb = oys.len() * ow;
                    let col = &mut scratch[..cols * nb];
                    im2col(op, cig, xg, col, oys);
                    sgemm_ep(
                        cog,
                        cols,
                        nb,
                        1.0,
                        rm(&weight[g * cog * cols..], cols),
                        rm(col, nb),
                        0.0,
                        &mut y[g * cog * plane_out + oy0 * ow..],
                        plane_out,
                        ep,
                    );
                }
            }
        }
    }
}

/// Forward pass: `output = relu?(conv(input, weight) + bias)` (see [`Conv2d`] for shapes and
/// layouts). `scratch` must hold [`conv2d_forward_scratch_len`] floats per thread.
pub fn conv2d_forward(
    op: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: &[f32],
    output: &mut [f32],
    scratch: &mut Scratch,
) {
    check_lens(op, input, weight, bias, output.len());
    let n = op.n as usize;
    let (in_img, out_img, _, _) = image_sizes(op);
    let per = conv2d_forward_scratch_len(op);
    let pool = scratch.pool();
    let parts = scratch.threads().min(n);
    let scr = scratch.take(per, parts, "conv2d_forward_scratch_len");
    let chunks = split_parts(output, n, out_img, parts).zip(scr);
    run_parts(pool.as_deref(), chunks, |((range, y), scr)| {
        for (b, yb) in range.zip(y.chunks_exact_mut(out_img)) {
            forward_image(op, &input[b * in_img..][..in_img], weight, bias, yb, scr);
        }
    });
}

/// Whether [`conv2d_forward_split`] can split `op`'s images by output channels: every kind
/// but a grouped convolution (whose groups would have to be cut along).
pub fn splits_by_channels(op: &Conv2d) -> bool {
    op.kind() != ConvKind::Grouped
}

/// [`conv2d_forward`] with each image's output channels split over the threads instead of the
/// batch over them: for a batch smaller than the threads (the batch-1 forward pass of
/// inference), where the batch split leaves threads idle. A pointwise conv splits its pixels
/// instead, in bands of rows, where the kernel set has a fused GEMM: each thread then packs
/// only its own part of the input; the stem (a dense 3×3 stride-2 conv read in place) its
/// output rows, likewise.
/// Each output is computed exactly as by [`conv2d_forward`] (the same sums in the
/// same order), so the results are identical. Falls back to [`conv2d_forward`] where
/// [`splits_by_channels`] says no.
pub fn conv2d_forward_split(
    op: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: &[f32],
    output: &mut [f32],
    scratch: &mut Scratch,
) {
    if !splits_by_channels(op) {
        return conv2d_forward(op, input, weight, bias, output, scratch);
    }
    check_lens(op, input, weight, bias, output.len());
    let (in_img, out_img, plane_out, _) = image_sizes(op);
    let co = op.c_out as usize;
    let per = conv2d_forward_scratch_len(op);
    let pool = scratch.pool();
    match (op.kind(), pool.as_deref()) {
        (ConvKind::Pointwise, Some(pool))
            if forward_pointwise_bands(op, input, weight, bias, None, output, pool) =>
        {
            return;
        }
        (ConvKind::Dense, Some(pool)) if stem::reads_in_place(op) => {
            let image = |b: usize| Dense3x3Input::Planes(&input[b * in_img..][..in_img]);
            let out = PartCopies::writing(output);
            // SAFETY: the one tensor, borrowed mutably for the call.
            return unsafe { stem::forward_split_rows(op, image, weight, bias, out, pool) };
        }
        _ => {}
    }
    let depthwise = op.kind() == ConvKind::Depthwise;
    // A depthwise part keeps at least two channels: one would make it a dense 1×1-channel conv.
    let parts = scratch.threads().min(if depthwise { co / 2 } else { co });
    // Weights per output channel; a depthwise channel also reads only its own input plane.
    let w_per = op.weight_len() / co;
    let plane_in = op.h as usize * op.w as usize;
    for b in 0..op.n as usize {
        let x = &input[b * in_img..][..in_img];
        let y = &mut output[b * out_img..][..out_img];
        let scr = scratch.take(per, parts, "conv2d_forward_scratch_len");
        let chunks = split_parts(y, co, plane_out, parts).zip(scr);
        run_parts(pool.as_deref(), chunks, |((range, y), scr)| {
            let c = range.len() as u32;
            let sub = Conv2d {
                n: 1,
                c_out: c,
                c_in: if depthwise { c } else { op.c_in },
                groups: if depthwise { c } else { 1 },
                ..*op
            };
            let x = if depthwise {
                &x[range.start * plane_in..range.end * plane_in]
            } else {
                x
            };
            let w = &weight[range.start * w_per..range.end * w_per];
            forward_image(&sub, x, w, &bias[range.clone()], y, scr);
        });
    }
}

/// [`banded::pointwise`] over plain tensors (not banded): each image's rows split over
/// `pool`'s threads. False, having done nothing, where the kernel set has no fused GEMM.
fn forward_pointwise_bands(
    op: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: &[f32],
    residual: Option<&[f32]>,
    output: &mut [f32],
    pool: &Pool,
) -> bool {
    assert!(
        residual.is_none_or(|r| r.len() >= output.len()),
        "pointwise conv: residual of {} for an output of {}",
        residual.map_or(0, <[f32]>::len),
        output.len()
    );
    let out = PartCopies::writing(output);
    let residual = residual.map(|r| PartCopies::reading(&r[..output.len()]));
    // SAFETY: plain tensors (every part's copy the one tensor), read-only but `output`, which
    // is borrowed mutably for the call and so distinct from them.
    unsafe {
        banded::pointwise(
            op,
            PartCopies::reading(input),
            weight,
            bias,
            residual,
            out,
            pool,
        )
    }
}

/// A pointwise conv with a residual added to its output after the ReLU, `output =
/// relu?(conv(input) + bias) + residual` (`residual` shaped as `output`): a residual add fused
/// into the conv that feeds it, which saves the add's own pass over memory. The images are
/// split over the threads as by [`conv2d_forward`], or with `split` each image's pixels as by
/// [`conv2d_forward_split`]; the sums are those of the conv followed by the add, in the same
/// order, so the results are identical to the two steps'.
#[allow(clippy::too_many_arguments)]
pub fn pointwise_forward_add(
    op: &Conv2d,
    input: &[f32],
    weight: &[f32],
    bias: &[f32],
    residual: &[f32],
    output: &mut [f32],
    scratch: &mut Scratch,
    split: bool,
) {
    assert_eq!(
        op.kind(),
        ConvKind::Pointwise,
        "pointwise_forward_add: {op:?}"
    );
    check_lens(op, input, weight, bias, output.len());
    let (in_img, out_img, _, _) = image_sizes(op);
    let n = op.n as usize;
    assert!(
        residual.len() >= n * out_img,
        "pointwise_forward_add: residual of {} for an output of {}",
        residual.len(),
        n * out_img
    );
    let pool = scratch.pool();
    if let (true, Some(pool)) = (split, pool.as_deref()) {
        let res = Some(residual);
        if forward_pointwise_bands(op, input, weight, bias, res, output, pool) {
            return;
        }
    }
    let parts = scratch.threads().min(n);
    let images = split_parts(output, n, out_img, parts);
    run_parts(pool.as_deref(), images, |(range, y)| {
        for (b, yb) in range.zip(y.chunks_exact_mut(out_img)) {
            let x = &input[b * in_img..][..in_img];
            let res = Some(&residual[b * out_img..][..out_img]);
            pointwise_image(op, x, weight, bias, res, yb);
        }
    });
}

/// One image of the backward pass; `gw` (where given) and `gb` are accumulated into, `gx`
/// overwritten. A depthwise conv always sums its weight gradient (in the same pass as its
/// input gradient's mask, and cheap): it must be given `gw`.
#[allow(clippy::too_many_arguments)]
fn backward_image(
    op: &Conv2d,
    x: &[f32],
    weight: &[f32],
    (y, mask): (&[f32], bool),
    gy: &[f32],
    gx: Option<&mut [f32]>,
    gw: Option<&mut [f32]>,
    gb: &mut [f32],
    scratch: &mut [f32],
) {
    let kind = op.kind();
    if kind == ConvKind::Depthwise {
        let gw = gw.expect("a depthwise backward pass is given its weight gradient's sums");
        return depthwise::backward_image(op, x, weight, (y, mask), gy, gx, gw, gb, scratch);
    }
    let (in_img, out_img, plane_out, cols) = image_sizes(op);
    let (masked, col) = scratch.split_at_mut(out_img);
    let g: &[f32] = if mask {
        for ((m, &gv), &yv) in masked.iter_mut().zip(gy).zip(y) {
            *m = if yv > 0.0 { gv } else { 0.0 };
        }
        masked
    } else {
        gy
    };
    for (b, row) in gb.iter_mut().zip(g.chunks_exact(plane_out)) {
        *b += reduce::sum_f32(row);
    }
    if kind == ConvKind::Pointwise {
        let (ci, co) = (op.c_in as usize, op.c_out as usize);
        if let Some(gw) = gw {
            // dW (co × ci) += G (co × P) · Xᵀ (P × ci)
            sgemm(
                co,
                plane_out,
                ci,
                1.0,
                rm(g, plane_out),
                tr(x, plane_out),
                1.0,
                gw,
                ci,
            );
        }
        if let Some(gx) = gx {
            // dX (ci × P) = Wᵀ (ci × co) · G (co × P)
            sgemm(
                ci,
                co,
                plane_out,
                1.0,
                tr(weight, ci),
                rm(g, plane_out),
                0.0,
                gx,
                plane_out,
            );
        }
        return;
    }
    let groups = op.groups as usize;
    let (cig, cog) = (op.c_in_per_group() as usize, op.c_out_per_group() as usize);
    let Some(gw) = gw else {
        // A frozen weight: only the input gradient (the bias's is summed above).
        if let Some(gx) = gx {
            dense_input_grad(op, weight, g, gx, col);
        }
        return;
    };
    if gx.is_none() {
        // Only dW (the stem, whose input needs no gradient): `im2col` a band of output rows
        // at a time, small enough to stay in cache while the GEMM reads it back, where the
        // whole image's would be written out and read again (27 × 4096 floats, 442 KB an
        // image, for det-s's stem).
        let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
        let band = backward_band_rows(op);
        for grp in 0..groups {
            let gg = &g[grp * cog * plane_out..][..cog * plane_out];
            let xg = &x[grp * in_img / groups..][..in_img / groups];
            for r0 in (0..oh).step_by(band) {
                let rows = r0..(r0 + band).min(oh);
                let px = rows.len() * ow;
                let col = &mut col[..cols * px];
                im2col(op, cig, xg, col, rows);
                // dW_g (cog × cols) += G_g's band (cog × px) · colᵀ (px × cols)
                sgemm(
                    cog,
                    px,
                    cols,
                    1.0,
                    rm(&gg[r0 * ow..], plane_out),
                    tr(col, px),
                    1.0,
                    &mut gw[grp * cog * cols..],
                    cols,
                );
            }
        }
        return;
    }
    {
        let col = &mut col[..cols * plane_out];
        for grp in 0..groups {
            let gg = &g[grp * cog * plane_out..][..cog * plane_out];
            let xg = &x[grp * in_img / groups..][..in_img / groups];
            im2col(op, cig, xg, col, 0..op.out_h() as usize);
            // dW_g (cog × cols) += G_g (cog × P) · colᵀ (P × cols)
            sgemm(
                cog,
                plane_out,
                cols,
                1.0,
                rm(gg, plane_out),
                tr(col, plane_out),
                1.0,
                &mut gw[grp * cog * cols..],
                cols,
            );
        }
    }
    if let Some(gx) = gx {
        dense_input_grad(op, weight, g, gx, col);
    }
}

/// One image's input gradient of a dense or grouped conv from its (masked) output gradient
/// `g`: per group `dcol = W_gᵀ · G_g`, scattered back onto `gx` (overwritten). `col` is
/// scratch for `dcol`.
fn dense_input_grad(op: &Conv2d, weight: &[f32], g: &[f32], gx: &mut [f32], col: &mut [f32]) {
    let (in_img, _, plane_out, cols) = image_sizes(op);
    let groups = op.groups as usize;
    let (cig, cog) = (op.c_in_per_group() as usize, op.c_out_per_group() as usize);
    let col = &mut col[..cols * plane_out];
    gx.fill(0.0);
    for grp in 0..groups {
        let gg = &g[grp * cog * plane_out..][..cog * plane_out];
        // dcol (cols × P) = W_gᵀ (cols × cog) · G_g (cog × P)
        sgemm(
            cols,
            cog,
            plane_out,
            1.0,
            tr(&weight[grp * cog * cols..], cols),
            rm(gg, plane_out),
            0.0,
            col,
            plane_out,
        );
        col2im_add(
            op,
            cig,
            col,
            &mut gx[grp * in_img / groups..][..in_img / groups],
        );
    }
}

/// `gx += add` and `gx = x > 0 ? gx : 0` where asked, in one pass over an image's input
/// gradient: the same values as the add and the next layer's mask would give.
fn finish_input_grad(gx: &mut [f32], x: &[f32], add: Option<&[f32]>, relu_of_input: bool) {
    match (add, relu_of_input) {
        (None, false) => {}
        (Some(add), false) => gx.iter_mut().zip(add).for_each(|(g, a)| *g += a),
        // Selects, not branches: the signs are as good as random.
        (None, true) => gx
            .iter_mut()
            .zip(x)
            .for_each(|(g, &v)| *g = if v > 0.0 { *g } else { 0.0 }),
        (Some(add), true) => {
            for ((g, a), &v) in gx.iter_mut().zip(add).zip(x) {
                // The sum outside the select, so that the loop vectorises.
                let sum = *g + a;
                *g = if v > 0.0 { sum } else { 0.0 };
            }
        }
    }
}

/// Backward pass of [`conv2d_forward`]. `output` is the forward output (after the ReLU: it
/// gives the mask), `grad_output` the loss gradient with respect to it. Overwrites
/// `grad_weight`, `grad_bias` and, when given, `grad_input` (leave it out for a first layer,
/// whose input needs no gradient). `scratch` must hold [`conv2d_backward_scratch_len`] floats
/// per thread.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_backward(
    op: &Conv2d,
    input: &[f32],
    weight: &[f32],
    output: &[f32],
    grad_output: &[f32],
    grad_input: Option<&mut [f32]>,
    grad_weight: &mut [f32],
    grad_bias: &mut [f32],
    scratch: &mut Scratch,
) {
    conv2d_backward_with(
        op,
        input,
        weight,
        output,
        grad_output,
        grad_input,
        Some(grad_weight),
        grad_bias,
        scratch,
        BackwardExtras::default(),
    );
}

/// What [`conv2d_backward_with`] does beyond [`conv2d_backward`], image by image while each
/// image's input gradient is still in cache (the stores `compute::fusion::grad_stores`
/// allows).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BackwardExtras<'a> {
    /// Added into `grad_input` (as long).
    pub add: Option<&'a [f32]>,
    /// `grad_input` (after the add) is masked by `input > 0`.
    pub relu_of_input: bool,
    /// `grad_output` is masked by `output > 0` already: not masked again.
    pub gy_masked: bool,
}

/// [`conv2d_backward`] with `extras`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv2d_backward_with(
    op: &Conv2d,
    input: &[f32],
    weight: &[f32],
    output: &[f32],
    grad_output: &[f32],
    grad_input: Option<&mut [f32]>,
    mut grad_weight: Option<&mut [f32]>,
    grad_bias: &mut [f32],
    scratch: &mut Scratch,
    extras: BackwardExtras<'_>,
) {
    check_lens(op, input, weight, grad_bias, output.len());
    assert_eq!(
        grad_output.len(),
        op.output_len(),
        "conv grad_output length"
    );
    if let Some(gw) = &grad_weight {
        assert_eq!(gw.len(), op.weight_len(), "conv grad_weight length");
    }
    if let Some(gx) = &grad_input {
        assert_eq!(gx.len(), op.input_len(), "conv grad_input length");
    }
    if let Some(add) = extras.add {
        assert_eq!(add.len(), op.input_len(), "conv grad_input addend length");
    }
    let mask = op.relu && !extras.gy_masked;
    let n = op.n as usize;
    let (in_img, out_img, _, _) = image_sizes(op);
    let (wl, bl) = (op.weight_len(), op.bias_len());
    let parts = scratch.threads().min(n);
    let per = conv2d_backward_scratch_len(op);
    let pool = scratch.pool();
    // Without a weight gradient (a frozen weight) every part, the first too, sums its bias
    // gradient into its partial sums; a depthwise conv sums its weights' there as well.
    let keep_gw = grad_weight.is_some();
    let part_gw = keep_gw || op.kind() == ConvKind::Depthwise;
    if let Some(gw) = grad_weight.as_deref_mut() {
        gw.fill(0.0);
    }
    grad_bias.fill(0.0);

    // Each part: its images, its slice of grad_input, and where its weight/bias sums go.
    {
        fn partial(s: &mut [f32], wl: usize, bl: usize) -> (&mut [f32], &mut [f32], &mut [f32]) {
            let (partial, rest) = s.split_at_mut(wl + bl);
            partial.fill(0.0);
            let (pw, pb) = partial.split_at_mut(wl);
            (pw, pb, rest)
        }
        let mut scr_parts = scratch.take(per, parts, "conv2d_backward_scratch_len");
        let first = scr_parts.next().unwrap();
        let first = match grad_weight.as_deref_mut() {
            Some(gw0) => (gw0, &mut *grad_bias, first),
            None => partial(first, wl, bl),
        };
        let sums = std::iter::once(first).chain(scr_parts.map(|s| partial(s, wl, bl)));
        let mut gx_dummy: [f32; 0] = [];
        let (gx_all, gx_per) = match grad_input {
            Some(gx) => (gx, in_img),
            None => (&mut gx_dummy[..], 0),
        };
        let have_gx = gx_per > 0;
        let items = split_parts(gx_all, n, gx_per, parts).zip(sums);
        run_parts(pool.as_deref(), items, |((range, gx), (gw, gb, scr))| {
            let mut gx_iter = gx.chunks_exact_mut(in_img);
            for b in range {
                let mut gxb = if have_gx { gx_iter.next() } else { None };
                let xb = &input[b * in_img..][..in_img];
                backward_image(
                    op,
                    xb,
                    weight,
                    (&output[b * out_img..][..out_img], mask),
                    &grad_output[b * out_img..][..out_img],
                    gxb.as_deref_mut(),
                    part_gw.then_some(&mut *gw),
                    gb,
                    scr,
                );
                if let Some(gxb) = gxb {
                    let add = extras.add.map(|a| &a[b * in_img..][..in_img]);
                    finish_input_grad(gxb, xb, add, extras.relu_of_input);
                }
            }
        });
    }
    let summed_in_place = usize::from(keep_gw);
    for s in scratch
        .take(per, parts, "conv2d_backward_scratch_len")
        .skip(summed_in_place)
    {
        if let Some(gw) = grad_weight.as_deref_mut() {
            for (d, v) in gw.iter_mut().zip(&s[..wl]) {
                *d += v;
            }
        }
        for (d, v) in grad_bias.iter_mut().zip(&s[wl..wl + bl]) {
            *d += v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::SplitMix64;
    use crate::compute::cpu::gradcheck::{
        assert_close, numeric_grad_f64, random_vec, sign_signature,
    };

    /// `Σ r ⊙ relu?(conv(x, w) + b)` in `f64`, straight from the definition in ops.rs, with
    /// the signs of the pre-activations as the kink signature.
    fn reference(op: &Conv2d, x: &[f64], w: &[f64], b: &[f64], r: &[f32]) -> (f64, u64) {
        let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
        let (h, wd, k) = (op.h as usize, op.w as usize, op.kernel as usize);
        let (cig, cog) = (op.c_in_per_group() as usize, op.c_out_per_group() as usize);
        let (mut sum, mut pre) = (0.0, Vec::new());
        for n in 0..op.n as usize {
            for o in 0..op.c_out as usize {
                let g = o / cog;
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut v = b[o];
                        for ci in 0..cig {
                            let c = g * cig + ci;
                            for ky in 0..k {
                                for kx in 0..k {
                                    let iy =
                                        (y * op.stride as usize + ky) as isize - op.pad as isize;
                                    let ix =
                                        (xo * op.stride as usize + kx) as isize - op.pad as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xi = ((n * op.c_in as usize + c) * h + iy as usize) * wd
                                        + ix as usize;
                                    v += w[((o * cig + ci) * k + ky) * k + kx] * x[xi];
                                }
                            }
                        }
                        pre.push(v);
                        let out = if op.relu { v.max(0.0) } else { v };
                        sum += r[((n * op.c_out as usize + o) * oh + y) * ow + xo] as f64 * out;
                    }
                }
            }
        }
        (sum, if op.relu { sign_signature(pre) } else { 0 })
    }

    /// Every conv kind's three gradients against central differences of the `f64` reference
    /// (tight, 1e-4; see gradcheck), on odd sizes, strides 1–2, pads and groups.
    #[test]
    fn gradients_match_central_differences() {
        let mut rng = SplitMix64::new(21);
        let cases = [
            Conv2d::dense(2, 3, 7, 5, 4, 3, 2, true),
            Conv2d::dense(1, 2, 6, 6, 3, 5, 1, false),
            Conv2d {
                groups: 2,
                ..Conv2d::dense(1, 4, 5, 7, 6, 3, 1, true)
            },
            Conv2d::pointwise(2, 5, 3, 4, 3, true),
            Conv2d::depthwise(2, 3, 7, 6, 3, 2, true),
            Conv2d::depthwise(1, 2, 5, 5, 5, 1, false),
        ];
        for op in cases {
            op.validate().unwrap();
            let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
            let w = random_vec(&mut rng, op.weight_len(), -1.0, 1.0);
            let b = random_vec(&mut rng, op.bias_len(), -0.5, 0.5);
            let r = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
            let mut scratch = Scratch::new(2);
            scratch.reserve(conv2d_forward_scratch_len(&op).max(conv2d_backward_scratch_len(&op)));
            let mut y = vec![0.0; op.output_len()];
            conv2d_forward(&op, &x, &w, &b, &mut y, &mut scratch);
            let (mut gx, mut gw, mut gb) = (
                vec![f32::NAN; op.input_len()],
                vec![f32::NAN; op.weight_len()],
                vec![f32::NAN; op.bias_len()],
            );
            conv2d_backward(
                &op,
                &x,
                &w,
                &y,
                &r,
                Some(&mut gx),
                &mut gw,
                &mut gb,
                &mut scratch,
            );

            let f64s = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
            let (x64, w64, b64) = (f64s(&x), f64s(&w), f64s(&b));
            let name = format!("{:?}", op.kind());
            let want = numeric_grad_f64(&x64, 1e-6, |v| reference(&op, v, &w64, &b64, &r));
            assert_close(&format!("{name} grad input"), &gx, &want, 1e-4);
            let want = numeric_grad_f64(&w64, 1e-6, |v| reference(&op, &x64, v, &b64, &r));
            assert_close(&format!("{name} grad weight"), &gw, &want, 1e-4);
            let want = numeric_grad_f64(&b64, 1e-6, |v| reference(&op, &x64, &w64, v, &r));
            assert_close(&format!("{name} grad bias"), &gb, &want, 1e-4);
        }
    }

    /// Without an input gradient (the stem), the weight gradient is summed over bands of
    /// output rows: the same gradients as with one (which the test above checks against
    /// central differences), to rounding, on planes that take two bands, the last ragged.
    #[test]
    fn the_weight_gradient_alone_is_summed_band_by_band() {
        let mut rng = SplitMix64::new(8);
        let cases = [
            Conv2d::dense(2, 3, 50, 46, 4, 3, 2, true),
            Conv2d {
                groups: 2,
                ..Conv2d::dense(1, 4, 30, 58, 6, 3, 1, false)
            },
        ];
        for op in cases {
            assert!(
                backward_band_rows(&op) < op.out_h() as usize,
                "{op:?}: one band"
            );
            let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
            let w = random_vec(&mut rng, op.weight_len(), -1.0, 1.0);
            let b = random_vec(&mut rng, op.bias_len(), -0.5, 0.5);
            let r = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
            let mut scratch = Scratch::new(2);
            scratch.reserve(conv2d_forward_scratch_len(&op).max(conv2d_backward_scratch_len(&op)));
            let mut y = vec![0.0; op.output_len()];
            conv2d_forward(&op, &x, &w, &b, &mut y, &mut scratch);
            let mut grads = |gx: Option<&mut [f32]>| {
                let (mut gw, mut gb) = (vec![0.0; op.weight_len()], vec![0.0; op.bias_len()]);
                conv2d_backward(&op, &x, &w, &y, &r, gx, &mut gw, &mut gb, &mut scratch);
                (gw, gb)
            };
            let mut gx = vec![f32::NAN; op.input_len()];
            let (want_w, want_b) = grads(Some(&mut gx));
            let (gw, gb) = grads(None);
            assert_eq!(gb, want_b, "{op:?}: bias gradient");
            for (i, (g, want)) in gw.iter().zip(&want_w).enumerate() {
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{op:?}: weight gradient [{i}] {g} vs {want}"
                );
            }
        }
    }

    /// A frozen weight (no weight gradient asked for): the bias and input gradients are the
    /// full pass's bit for bit, for every kind, over one to three threads (the batch of three
    /// split unevenly), with and without an input gradient.
    #[test]
    fn without_a_weight_gradient_the_bias_and_input_gradients_are_the_full_passs() {
        let mut rng = SplitMix64::new(9);
        let cases = [
            Conv2d::dense(3, 3, 14, 12, 5, 3, 2, true),
            Conv2d::pointwise(3, 6, 9, 7, 11, true),
            Conv2d::pointwise(3, 8, 4, 4, 5, false),
            Conv2d::depthwise(3, 7, 9, 11, 3, 2, true),
            Conv2d::depthwise(3, 4, 6, 5, 3, 1, true),
            Conv2d {
                groups: 2,
                ..Conv2d::dense(3, 4, 5, 7, 6, 3, 1, true)
            },
        ];
        for op in cases {
            let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
            let w = random_vec(&mut rng, op.weight_len(), -1.0, 1.0);
            let b = random_vec(&mut rng, op.bias_len(), -0.5, 0.5);
            let r = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
            for threads in [1, 2, 3] {
                let mut scratch = Scratch::new(threads);
                scratch
                    .reserve(conv2d_forward_scratch_len(&op).max(conv2d_backward_scratch_len(&op)));
                let mut y = vec![0.0; op.output_len()];
                conv2d_forward(&op, &x, &w, &b, &mut y, &mut scratch);
                for with_gx in [true, false] {
                    let mut run = |gw: Option<&mut [f32]>| {
                        let mut gb = vec![f32::NAN; op.bias_len()];
                        let mut gx = vec![f32::NAN; op.input_len()];
                        conv2d_backward_with(
                            &op,
                            &x,
                            &w,
                            &y,
                            &r,
                            with_gx.then_some(&mut gx[..]),
                            gw,
                            &mut gb,
                            &mut scratch,
                            BackwardExtras::default(),
                        );
                        (gb, gx)
                    };
                    let mut gw = vec![f32::NAN; op.weight_len()];
                    let (want_b, want_x) = run(Some(&mut gw));
                    let (gb, gx) = run(None);
                    let what = format!("{:?}, {threads} threads, gx {with_gx}", op.kind());
                    assert!(gb.iter().any(|&v| v != 0.0), "{what}: a zero bias gradient");
                    assert_eq!(gb, want_b, "{what}: bias gradient");
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&gx), bits(&want_x), "{what}: input gradient");
                }
            }
        }
    }

    /// Splitting an image's output channels (a pointwise conv's pixels) over threads gives the
    /// batch split's outputs bit for bit, for every kind (a grouped conv falls back), thread
    /// counts that cut the channels or pixel tiles unevenly, a plane of one pixel tile, and a
    /// depthwise conv with fewer channels than twice the threads.
    #[test]
    fn the_split_over_threads_matches_the_batch_split_exactly() {
        let mut rng = SplitMix64::new(5);
        let cases = [
            Conv2d::dense(1, 3, 12, 10, 5, 3, 2, true),
            Conv2d::pointwise(2, 6, 9, 7, 11, true),
            Conv2d::pointwise(1, 40, 16, 16, 33, false),
            Conv2d::pointwise(1, 5, 3, 3, 4, true),
            Conv2d::depthwise(1, 7, 9, 11, 3, 2, true),
            Conv2d::depthwise(1, 3, 6, 5, 3, 1, false),
            Conv2d {
                groups: 2,
                ..Conv2d::dense(1, 4, 5, 7, 6, 3, 1, true)
            },
        ];
        for op in cases {
            let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
            let w = random_vec(&mut rng, op.weight_len(), -1.0, 1.0);
            let b = random_vec(&mut rng, op.bias_len(), -0.5, 0.5);
            let mut want = vec![f32::NAN; op.output_len()];
            let mut one = Scratch::new(1);
            one.reserve(conv2d_forward_scratch_len(&op));
            conv2d_forward(&op, &x, &w, &b, &mut want, &mut one);
            for threads in [1, 2, 3, 4] {
                let mut scratch = Scratch::new(threads);
                scratch.reserve(conv2d_forward_scratch_len(&op));
                let mut y = vec![f32::NAN; op.output_len()];
                conv2d_forward_split(&op, &x, &w, &b, &mut y, &mut scratch);
                let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{:?} split over {threads} threads differs", op.kind());
            }
        }
    }
}
