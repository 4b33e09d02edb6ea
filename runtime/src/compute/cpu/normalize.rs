//! Record bytes to network input ([`Normalize`]): u8 HWC RGB → f32 NCHW in `[0, 1]`, the
//! batch's images split over the pool's threads.

use super::pool::Pool;
use super::scratch::{run_parts, split_parts};
use crate::compute::ops::Normalize;

pub fn normalize(op: &Normalize, records: &[u8], out: &mut [f32], pool: Option<&Pool>) {
    let (h, w) = (op.h as usize, op.w as usize);
    assert!(
        records.len() >= op.input_bytes() && out.len() >= op.output_len(),
        "normalize: short tensors"
    );
    let plane = h * w;
    let n = op.n as usize;
    let parts = pool.map_or(1, Pool::threads).min(n);
    run_parts(
        pool,
        split_parts(out, n, 3 * plane, parts),
        |(images, dst)| {
            for (b, dst) in images.zip(dst.chunks_exact_mut(3 * plane)) {
                let image = &records[b * op.record_stride as usize..][..op.image_bytes()];
                let (r, gb) = dst.split_at_mut(plane);
                let (g, bl) = gb.split_at_mut(plane);
                for (y, row) in image.chunks_exact(3 * w).enumerate() {
                    let at = y * w..(y + 1) * w;
                    let planes = [&mut r[at.clone()], &mut g[at.clone()], &mut bl[at]];
                    for (c, dst) in planes.into_iter().enumerate() {
                        if op.flip {
                            for (d, px) in dst.iter_mut().rev().zip(row.chunks_exact(3)) {
                                *d = px[c] as f32 / 255.0;
                            }
                        } else {
                            for (d, px) in dst.iter_mut().zip(row.chunks_exact(3)) {
                                *d = px[c] as f32 / 255.0;
                            }
                        }
                    }
                }
            }
        },
    );
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
}
