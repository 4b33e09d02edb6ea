//! Reductions: sums over slices and over channels.
//!
//! Sums use eight independent `f32` partial sums, added pairwise at the end: the compiler can
//! vectorise them, and the rounding error grows like `len/8` additions instead of `len` (the
//! tree order a shader's workgroup reduction has). The result is deterministic for a given
//! length.

/// `Σ x`.
pub fn sum_f32(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (chunks, rest) = x.split_at(x.len() / 8 * 8);
    for c in chunks.chunks_exact(8) {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for v in rest {
        s += v;
    }
    s
}

/// `Σ x²` (for a gradient norm).
pub fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (chunks, rest) = x.split_at(x.len() / 8 * 8);
    for c in chunks.chunks_exact(8) {
        for l in 0..8 {
            acc[l] += c[l] * c[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for v in rest {
        s += v * v;
    }
    s
}

/// `max |x|` (0 for an empty slice; NaN if any element is NaN).
pub fn max_abs(x: &[f32]) -> f32 {
    let mut m = 0.0f32;
    for &v in x {
        if v.is_nan() {
            return f32::NAN;
        }
        m = m.max(v.abs());
    }
    m
}

/// Per-channel sums of an `n × c × plane` tensor: `out[ch] = Σ_b Σ_i x[b][ch][i]` (what a bias
/// gradient is). Overwrites `out` (`c` long).
pub fn channel_sums(n: usize, c: usize, plane: usize, x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), n * c * plane, "channel_sums input length");
    assert_eq!(out.len(), c, "channel_sums output length");
    out.fill(0.0);
    for img in x.chunks_exact(c * plane) {
        for (o, row) in out.iter_mut().zip(img.chunks_exact(plane)) {
            *o += sum_f32(row);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::SplitMix64;
    use crate::compute::cpu::gradcheck::{assert_close, random_vec};

    #[test]
    fn sums_match_f64_sums() {
        let mut rng = SplitMix64::new(5);
        for len in [0, 1, 7, 8, 9, 1000, 4097] {
            let x = random_vec(&mut rng, len, -1.0, 1.0);
            let s: f64 = x.iter().map(|&v| v as f64).sum();
            let q: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
            // Error bound of an f32 sum of `len` terms of magnitude ≤ 1: len·2⁻²⁴.
            let bound = len as f64 * 6e-8 + 1e-12;
            assert!((sum_f32(&x) as f64 - s).abs() <= bound, "len {len}");
            assert!((sum_squares(&x) as f64 - q).abs() <= bound, "len {len}");
            let m = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(max_abs(&x), m);
        }
        assert!(max_abs(&[1.0, f32::NAN]).is_nan());
    }

    #[test]
    fn channel_sums_add_batch_and_pixels() {
        let mut rng = SplitMix64::new(6);
        let (n, c, plane) = (3, 4, 11);
        let x = random_vec(&mut rng, n * c * plane, -1.0, 1.0);
        let mut out = vec![f32::NAN; c];
        channel_sums(n, c, plane, &x, &mut out);
        let want: Vec<f64> = (0..c)
            .map(|ch| {
                (0..n)
                    .flat_map(|b| (0..plane).map(move |i| (b, i)))
                    .map(|(b, i)| x[(b * c + ch) * plane + i] as f64)
                    .sum()
            })
            .collect();
        assert_close("channel sums", &out, &want, 1e-5);
    }
}
