//! Record bytes to network input ([`Normalize`]): u8 HWC RGB → f32 NCHW in `[0, 1]`.

use crate::compute::ops::Normalize;

pub fn normalize(op: &Normalize, records: &[u8], out: &mut [f32]) {
    let (h, w) = (op.h as usize, op.w as usize);
    assert!(
        records.len() >= op.input_bytes() && out.len() >= op.output_len(),
        "normalize: short tensors"
    );
    let plane = h * w;
    for b in 0..op.n as usize {
        let image = &records[b * op.record_stride as usize..][..op.image_bytes()];
        let dst = &mut out[b * 3 * plane..(b + 1) * 3 * plane];
        for y in 0..h {
            let row = &image[y * w * 3..(y + 1) * w * 3];
            for x in 0..w {
                let sx = if op.flip { w - 1 - x } else { x };
                for c in 0..3 {
                    dst[c * plane + y * w + x] = row[sx * 3 + c] as f32 / 255.0;
                }
            }
        }
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
        normalize(&op, &records, &mut out);
        let want = [0.0, 0.4, 0.2, 0.6, 1.0, 0.8, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        for (g, w) in out.iter().zip(want) {
            assert!((g - w).abs() < 1e-7, "{out:?}");
        }
        normalize(&Normalize { flip: true, ..op }, &records, &mut out);
        assert_eq!(&out[..2], &[0.4, 0.0]);
        assert_eq!(&out[6..8], &[0.0, 1.0]);
    }
}
