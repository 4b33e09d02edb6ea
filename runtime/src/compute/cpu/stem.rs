//! The stem: a dense 3×3, stride-2, pad-1 conv of an even-sized input, run by the kernel
//! set's [`kernels::Dense3x3Half`] without `im2col`, reading its input in place.
//!
//! Its input is either the normalised planes (what [`super::conv`] hands it) or, where nothing
//! else reads those planes (inference; the training step's forward pass, whose backward pass
//! normalises again), the records' bytes themselves: [`forward_normalized`] has the kernel read
//! each image's rows normalised into a cache of three rows ([`Dense3x3Input::Rgb`]), so
//! the normalisation's pass over memory (writing the planes, reading them back, on another core
//! at batch 1) is saved. The values are the same `byte / 255` either way, so the outputs are
//! identical bit for bit.

use super::band_copies::{self, PartCopies};
use super::gemm::Epilogue;
use super::kernels::{self, Dense3x3Input, DENSE3X3_MAX_TAPS, RGB_MAX_W};
use super::pool::Pool;
use super::scratch::{part_range, run_parts, split_parts};
use crate::compute::ops::{Conv2d, ConvKind, Normalize};

/// Whether the forward pass of `op` runs here: a dense 3×3, stride-2, pad-1 conv of an
/// even-sized input, where the active kernel set has [`kernels::Dense3x3Half`].
pub fn reads_in_place(op: &Conv2d) -> bool {
    kernels::active().dense3x3_half.is_some()
        && op.kind() == ConvKind::Dense
        && (op.kernel, op.stride, op.pad) == (3, 2, 1)
        && op.h.is_multiple_of(2)
        && op.w.is_multiple_of(2)
        && op.c_in as usize * 9 <= DENSE3X3_MAX_TAPS
}

/// Whether `conv`, reading what `norm` writes, can read the records instead
/// ([`forward_normalized`]): a stem that [`reads_in_place`] of the normalised images' shape.
pub fn fuses(norm: &Normalize, conv: &Conv2d) -> bool {
    reads_in_place(conv)
        && (conv.n, conv.c_in, conv.h, conv.w) == (norm.n, 3, norm.h, norm.w)
        && norm.w as usize <= RGB_MAX_W
}

/// One image through the active set's kernel.
pub(super) fn forward_image(
    op: &Conv2d,
    x: Dense3x3Input<'_>,
    weight: &[f32],
    bias: &[f32],
    y: &mut [f32],
) {
    let (c_in, m) = (op.c_in as usize, op.c_out as usize);
    let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
    check_image(op, x, weight, bias, y.len());
    // SAFETY: a table of a set this CPU runs (`kernels::active`); `reads_in_place` checked
    // the taps fit the kernel's rows of B, `check_image` the operands' sizes (an even-sized input is exactly
    // `2·oh × 2·ow`, the output `m` planes of `oh × ow`, all ours).
    unsafe {
        kernel()(
            x,
            c_in,
            weight,
            m,
            epilogue(op, bias),
            y.as_mut_ptr(),
            (oh, ow),
            0..oh,
        )
    };
}

/// [`forward_image`] of each image (`image(b)`) with its output rows split over `pool`'s
/// threads in bands (every channel's rows of the band): each thread splits (or normalises)
/// only the input rows of its band, where a split by channels has every thread split all of
/// them. Each part writes its band into its copy of `output` where that is banded
/// ([`super::band_copies`]). The sums are [`forward_image`]'s.
///
/// # Safety
/// `output` holds (in every copy) `op.n` images of `op`'s output, memory that nothing else
/// touches while this runs.
pub(super) unsafe fn forward_split_rows<'a>(
    op: &Conv2d,
    image: impl Fn(usize) -> Dense3x3Input<'a>,
    weight: &[f32],
    bias: &[f32],
    output: PartCopies,
    pool: &Pool,
) {
    let (c_in, m) = (op.c_in as usize, op.c_out as usize);
    let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
    let out_img = m * oh * ow;
    assert_eq!(output.len, op.n as usize * out_img, "stem output length");
    // Every part, even one with no rows: a row's owner is the same in every banded kernel.
    let parts = pool.threads();
    for b in 0..op.n as usize {
        let x = image(b);
        check_image(op, x, weight, bias, out_img);
        pool.run(parts, &|part| {
            let rows = part_range(oh, parts, part);
            if rows.is_empty() {
                return;
            }
            // SAFETY: as in `forward_image` (`check_image` checked the sizes); image b's
            // output lies inside this part's copy of `output`, and these rows of its planes
            // are this band's alone (other rows, or other copies).
            unsafe {
                kernel()(
                    x,
                    c_in,
                    weight,
                    m,
                    epilogue(op, bias),
                    output.part(part).wrapping_add(b * out_img),
                    (oh, ow),
                    rows,
                )
            };
            let planes = b * m..(b + 1) * m;
            // SAFETY: this part's band of image b's planes was written just above, and no
            // part writes it again in this job; its edge rows are this part's alone.
            unsafe { band_copies::publish_edges(&output, part, parts, planes, (oh, ow)) };
        });
    }
}

/// The images of `records` as the stem `conv` reads them in place of `norm`'s output.
fn rgb_images<'a>(
    norm: &Normalize,
    conv: &Conv2d,
    records: &'a [u8],
) -> impl Fn(usize) -> Dense3x3Input<'a> {
    assert!(fuses(norm, conv), "a stem that cannot read {norm:?}");
    assert!(
        records.len() >= norm.input_bytes(),
        "stem: {} bytes of records for {norm:?}",
        records.len()
    );
    let (stride, bytes, flip) = (norm.record_stride as usize, norm.image_bytes(), norm.flip);
    move |b: usize| Dense3x3Input::Rgb {
        image: &records[b * stride..][..bytes],
        flip,
    }
}

/// [`forward_normalized`] with each image's output rows split over `pool`'s threads, each
/// part writing its copy of `output` where that is banded ([`forward_split_rows`]).
///
/// # Safety
/// As for [`forward_split_rows`].
pub(super) unsafe fn forward_normalized_rows(
    norm: &Normalize,
    conv: &Conv2d,
    records: &[u8],
    weight: &[f32],
    bias: &[f32],
    output: PartCopies,
    pool: &Pool,
) {
    let image = rgb_images(norm, conv, records);
    // SAFETY: the caller's promise.
    unsafe { forward_split_rows(conv, image, weight, bias, output, pool) }
}

/// The stem `conv` over the images `norm` would normalise from `records`, reading the bytes
/// (see the module docs; [`fuses`] must hold): each image's output rows split over the
/// threads with `split_rows` (a batch-1 frame), else the batch.
#[allow(clippy::too_many_arguments)]
pub fn forward_normalized(
    norm: &Normalize,
    conv: &Conv2d,
    records: &[u8],
    weight: &[f32],
    bias: &[f32],
    output: &mut [f32],
    pool: Option<&Pool>,
    split_rows: bool,
) {
    if let (true, Some(pool)) = (split_rows, pool) {
        let out = PartCopies::writing(output);
        // SAFETY: the one tensor, borrowed mutably for the call.
        return unsafe { forward_normalized_rows(norm, conv, records, weight, bias, out, pool) };
    }
    let image = rgb_images(norm, conv, records);
    let n = conv.n as usize;
    let out_img = output.len() / n;
    let parts = pool.map_or(1, Pool::threads).min(n);
    run_parts(
        pool,
        split_parts(output, n, out_img, parts),
        |(images, y)| {
            for (b, y) in images.zip(y.chunks_exact_mut(out_img)) {
                forward_image(conv, image(b), weight, bias, y);
            }
        },
    );
}

fn kernel() -> kernels::Dense3x3Half {
    kernels::active()
        .dense3x3_half
        .expect("reads_in_place checked the set has the kernel")
}

fn epilogue<'a>(op: &Conv2d, bias: &'a [f32]) -> Epilogue<'a> {
    Epilogue {
        bias: Some(bias),
        relu: op.relu,
        residual: None,
    }
}

/// Asserts the sizes [`kernels::Dense3x3Half`]'s contract needs of one image of `op`.
fn check_image(op: &Conv2d, x: Dense3x3Input<'_>, weight: &[f32], bias: &[f32], y_len: usize) {
    let (c_in, m) = (op.c_in as usize, op.c_out as usize);
    let (oh, ow) = (op.out_h() as usize, op.out_w() as usize);
    let input_fits = match x {
        Dense3x3Input::Planes(x) => x.len() >= 4 * c_in * oh * ow,
        Dense3x3Input::Rgb { image, .. } => {
            c_in == 3 && 2 * ow <= RGB_MAX_W && image.len() >= 12 * oh * ow
        }
    };
    assert!(
        reads_in_place(op)
            && ow > 0
            && input_fits
            && y_len == m * oh * ow
            && weight.len() >= m * c_in * 9
            && bias.len() >= m,
        "dense 3×3 stride-2 conv: {op:?} with input {x:?}, weights {}, bias {}, output {y_len}",
        weight.len(),
        bias.len(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::cpu::normalize::normalize;

    /// The stem over records equals normalising them and then the stem, bit for bit: on one
    /// thread, over the batch, and split by rows, flipped or not, records with padding between.
    #[test]
    fn the_stem_reading_records_matches_normalise_then_stem() {
        if kernels::active().dense3x3_half.is_none() {
            eprintln!("skipped: the portable set has no in-place stem");
            return;
        }
        let (n, h, w, stride) = (3u32, 10u32, 14u32, 10 * 14 * 3 + 5);
        let records: Vec<u8> = (0..n * stride).map(|i| (i * 37 % 251) as u8).collect();
        let conv = Conv2d {
            n,
            c_in: 3,
            c_out: 6,
            h,
            w,
            kernel: 3,
            stride: 2,
            pad: 1,
            groups: 1,
            relu: true,
        };
        let weight: Vec<f32> = (0..conv.weight_len())
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let bias: Vec<f32> = (0..6).map(|i| 0.1 * i as f32 - 0.2).collect();
        let pool = Pool::new(2);
        for flip in [false, true] {
            let norm = Normalize {
                n,
                h,
                w,
                record_stride: stride,
                flip,
            };
            assert!(fuses(&norm, &conv));
            let mut planes = vec![0.0; norm.output_len()];
            normalize(&norm, &records, &mut planes, None);
            let (in_img, out_img) = (conv.input_len() / 3, conv.output_len() / 3);
            let mut want = vec![0.0; conv.output_len()];
            for (b, y) in want.chunks_exact_mut(out_img).enumerate() {
                let x = Dense3x3Input::Planes(&planes[b * in_img..][..in_img]);
                forward_image(&conv, x, &weight, &bias, y);
            }
            for (pool, split_rows) in [(None, false), (Some(&pool), false), (Some(&pool), true)] {
                let mut got = vec![f32::NAN; conv.output_len()];
                forward_normalized(
                    &norm, &conv, &records, &weight, &bias, &mut got, pool, split_rows,
                );
                assert_eq!(
                    got,
                    want,
                    "flip {flip}, pool {}, rows {split_rows}",
                    pool.is_some()
                );
            }
        }
    }

    #[test]
    fn only_a_stem_of_the_normalised_shape_fuses() {
        let norm = Normalize {
            n: 1,
            h: 64,
            w: 64,
            record_stride: 64 * 64 * 3,
            flip: false,
        };
        let stem = Conv2d {
            n: 1,
            c_in: 3,
            c_out: 16,
            h: 64,
            w: 64,
            kernel: 3,
            stride: 2,
            pad: 1,
            groups: 1,
            relu: true,
        };
        assert_eq!(fuses(&norm, &stem), reads_in_place(&stem));
        assert!(!fuses(&norm, &Conv2d { h: 32, ..stem }));
        assert!(!fuses(&norm, &Conv2d { stride: 1, ..stem }));
        assert!(!fuses(&Normalize { n: 2, ..norm }, &stem));
    }
}
