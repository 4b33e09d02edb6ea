//! Record bytes to network input ([`Normalize`]): u8 HWC RGB → f32 NCHW in `[0, 1]`, a row at
//! a time by the active kernel set (its `RgbRow`), the batch's images split over
//! the pool's threads — or, with fewer images than threads (a batch-1 frame), each image's
//! rows. One thread alone takes 7 µs for a 128-px frame, but in a forward pass at 2 threads it
//! took 30: the input tensor it writes was read by both cores in the pass before (the stem is
//! split over them), and each line it writes must first be taken back from the other core.
//! Split, both cores take lines back at once: 16 µs.

use super::kernels::{self, Kernels};
use super::pool::Pool;
use super::scratch::{run_parts, split_parts};
use crate::compute::ops::Normalize;

pub fn normalize(op: &Normalize, records: &[u8], out: &mut [f32], pool: Option<&Pool>) {
    let (h, w) = (op.h as usize, op.w as usize);
    assert!(
        records.len() >= op.input_bytes() && out.len() >= op.output_len(),
        "normalize: short tensors"
    );
    let kern = kernels::active();
    let plane = h * w;
    let n = op.n as usize;
    let image = |b: usize| &records[b * op.record_stride as usize..][..op.image_bytes()];
    let threads = pool.map_or(1, Pool::threads);
    if n < threads {
        // Fewer images than threads (a batch-1 frame): each image's rows are split instead.
        for (b, dst) in out.chunks_exact_mut(3 * plane).take(n).enumerate() {
            let (r, gb) = dst.split_at_mut(plane);
            let (g, bl) = gb.split_at_mut(plane);
            let parts = threads.min(h);
            let items = split_parts(r, h, w, parts)
                .zip(split_parts(g, h, w, parts))
                .zip(split_parts(bl, h, w, parts))
                .map(|(((ys, r), (_, g)), (_, bl))| (ys, [r, g, bl]));
            run_parts(pool, items, |(ys, planes)| {
                rows(kern, op, image(b), ys.start, planes);
            });
        }
        return;
    }
    let parts = threads.min(n);
    run_parts(
        pool,
        split_parts(out, n, 3 * plane, parts),
        |(images, dst)| {
            for (b, dst) in images.zip(dst.chunks_exact_mut(3 * plane)) {
                let (r, gb) = dst.split_at_mut(plane);
                let (g, bl) = gb.split_at_mut(plane);
                rows(kern, op, image(b), 0, [r, g, bl]);
            }
        },
    );
}

/// Rows `y0 ..` of one image into its three planes' rows (as many as `planes` hold).
fn rows(kern: &Kernels, op: &Normalize, image: &[u8], y0: usize, planes: [&mut [f32]; 3]) {
    let w = op.w as usize;
    let [r, g, b] = planes;
    let rows = r
        .chunks_exact_mut(w)
        .zip(g.chunks_exact_mut(w))
        .zip(b.chunks_exact_mut(w));
    for (y, ((r, g), b)) in (y0..).zip(rows) {
        // SAFETY: a table of a set this CPU runs; a row of 3·w bytes for rows of w floats.
        unsafe { (kern.rgb_row)(&image[3 * w * y..][..3 * w], op.flip, [r, g, b]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwc_bytes_become_nchw_floats_and_flip_mirrors() {
        // Two 1×2 images in records 8 bytes apart (6 image bytes + 2 bytes of other data).
        let records = [0, 51, 255, 102, 153, 204, 7, 7, 255, 0, 0, 0, 255, 0];
        let op = Normalize {
            n: 2,
            h: 1,
            w: 2,
            record_stride: 8,
            flip: false,
        };
        let mut out = vec![0.0; 12];
        normalize(&op, &records, &mut out, None);
        let want = [0.0, 0.4, 0.2, 0.6, 1.0, 0.8, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        for (g, w) in out.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{out:?}");
        }
        normalize(&Normalize { flip: true, ..op }, &records, &mut out, None);
        assert_eq!(&out[..2], &[0.4, 0.0]);
        assert_eq!(&out[6..8], &[0.0, 1.0]);
    }

    #[test]
    fn images_split_over_threads_give_what_one_thread_does() {
        let (h, w) = (7usize, 21usize);
        for n in [1u32, 3] {
            let stride = h * w * 3 + 5;
            let records: Vec<u8> = (0..n as usize * stride)
                .map(|i| (i * 13 % 256) as u8)
                .collect();
            for flip in [false, true] {
                let op = Normalize {
                    n,
                    h: h as u32,
                    w: w as u32,
                    record_stride: stride as u32,
                    flip,
                };
                let mut one = vec![f32::NAN; op.output_len()];
                normalize(&op, &records, &mut one, None);
                for threads in [2, 3, 8] {
                    let pool = Pool::new(threads);
                    let mut split = vec![f32::NAN; op.output_len()];
                    normalize(&op, &records, &mut split, Some(&pool));
                    assert_eq!(split, one, "{n} images, {threads} threads, flip {flip}");
                }
                let (b, c, y, x) = (n as usize - 1, 2, h - 1, 3);
                let want = records[b * stride + (y * w + x) * 3 + c] as f32 / 255.0;
                let col = if flip { w - 1 - x } else { x };
                assert_eq!(one[((b * 3 + c) * h + y) * w + col], want);
            }
        }
    }
}
