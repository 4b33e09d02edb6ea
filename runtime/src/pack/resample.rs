//! Resampling an image to the letterbox's content size, streaming one source row at a time,
//! with scratch that is sized once and reused: the daemon letterboxes every camera frame
//! through it with no allocation, and `pack` and `infer` use the same code, so a frame sent to
//! `fulcrumd` and the same image given to `fulcrum infer` reach the model as the same bytes.
//!
//! The filter is a triangle (bilinear) whose support widens by the shrink factor when
//! shrinking, so nothing aliases: output pixel `i` of an axis shrunk by `r = src / dst` is
//! centred on source coordinate `(i + 0.5)·r` and weighs source pixel `k` by
//! `max(0, 1 − |k + 0.5 − centre| / max(r, 1))`, normalised. The horizontal pass runs on each
//! source row as it is read (after conversion to RGB); its output rows are accumulated into the
//! output rows whose vertical windows hold them. Sums are `f32`, rounded once at the end.

/// An image read one RGB8 row at a time (a decoded image, or a camera frame converted on the
/// fly from its own pixel format).
pub trait RgbRows {
    fn width(&self) -> u32;
    fn height(&self) -> u32;
    /// Writes row `y` (`y < height`) as `width × 3` bytes of R, G, B into `out`.
    fn read_row(&self, y: u32, out: &mut [u8]);
}

impl RgbRows for image::RgbImage {
    fn width(&self) -> u32 {
        self.width()
    }

    fn height(&self) -> u32 {
        self.height()
    }

    fn read_row(&self, y: u32, out: &mut [u8]) {
        let row = self.width() as usize * 3;
        let start = y as usize * row;
        out[..row].copy_from_slice(&self.as_raw()[start..start + row]);
    }
}

/// Filter windows and weights of one axis, `src` pixels to `dst`.
#[derive(Debug, Default)]
struct Axis {
    /// First source pixel of each output pixel's window.
    start: Vec<u32>,
    /// Window length of each output pixel.
    len: Vec<u32>,
    /// `taps` weights per output pixel (the first `len` used), summing to 1.
    weights: Vec<f32>,
    taps: usize,
}

impl Axis {
    /// Most taps a window can have when shrinking by at most `ratio`.
    fn taps_for(ratio: f32) -> usize {
        2 * ratio.max(1.0).ceil() as usize + 3
    }

    /// Room for `dst` outputs shrinking by at most `ratio`; allocates only when it grows.
    fn reserve(&mut self, dst: usize, ratio: f32) {
        let taps = Self::taps_for(ratio).max(self.taps);
        if dst > self.start.capacity() {
            self.start.reserve_exact(dst - self.start.len());
            self.len.reserve_exact(dst - self.len.len());
        }
        if dst * taps > self.weights.len() || taps > self.taps {
            self.weights
                .reserve_exact((dst * taps).saturating_sub(self.weights.len()));
            self.weights.resize(dst * taps, 0.0);
            self.taps = taps;
        }
    }

    /// Computes the windows for `src` → `dst` pixels (within what was reserved).
    fn plan(&mut self, src: u32, dst: u32) {
        let ratio = src as f32 / dst as f32;
        self.reserve(dst as usize, ratio);
        let support = ratio.max(1.0);
        self.start.clear();
        self.len.clear();
        for i in 0..dst as usize {
            let centre = (i as f32 + 0.5) * ratio;
            let lo = ((centre - support).floor().max(0.0) as u32).min(src - 1);
            let hi = ((centre + support).ceil() as u32).clamp(lo + 1, src);
            let w = &mut self.weights[i * self.taps..(i + 1) * self.taps];
            let mut n = 0;
            let mut sum = 0.0;
            for k in lo..hi {
                let v = (1.0 - ((k as f32 + 0.5 - centre) / support).abs()).max(0.0);
                w[n] = v;
                sum += v;
                n += 1;
            }
            if sum <= 0.0 {
                // Only possible for a window of one pixel at an edge: take it whole.
                w[..n].fill(1.0 / n as f32);
            } else {
                w[..n].iter_mut().for_each(|v| *v /= sum);
            }
            self.start.push(lo);
            self.len.push(n as u32);
        }
    }

    fn window(&self, i: usize) -> (u32, &[f32]) {
        let n = self.len[i] as usize;
        (
            self.start[i],
            &self.weights[i * self.taps..i * self.taps + n],
        )
    }

    fn bytes(&self) -> usize {
        self.start.capacity() * 4 + self.len.capacity() * 4 + self.weights.capacity() * 4
    }
}

/// Reusable scratch for resampling images to at most `max_dst × max_dst` pixels.
#[derive(Debug, Default)]
pub struct Resampler {
    x: Axis,
    y: Axis,
    /// One source row, RGB8.
    row: Vec<u8>,
    /// One source row after the horizontal pass.
    hrow: Vec<f32>,
    /// The output being accumulated, RGB `f32`.
    acc: Vec<f32>,
}

impl Resampler {
    /// Scratch for sources up to `max_src` pixels a side resampled to at most `max_dst` a side,
    /// allocated now so that [`Resampler::resample`] within those sizes allocates nothing.
    pub fn with_capacity(max_src: u32, max_dst: u32) -> Self {
        let mut r = Resampler::default();
        r.reserve(max_src, max_dst);
        r
    }

    /// Grows the scratch for sources up to `max_src` a side and outputs up to `max_dst`.
    pub fn reserve(&mut self, max_src: u32, max_dst: u32) {
        let (src, dst) = (max_src.max(1) as usize, max_dst.max(1) as usize);
        // The letterbox keeps the aspect ratio, and rounding a side to at least one pixel can
        // at most double an axis's shrink factor: 2·max_src/max_dst bounds every window.
        let ratio = (2 * src) as f32 / dst as f32;
        self.x.reserve(dst, ratio);
        self.y.reserve(dst, ratio);
        grow(&mut self.row, src * 3, 0);
        grow(&mut self.hrow, dst * 3, 0.0);
        grow(&mut self.acc, dst * dst * 3, 0.0);
    }

    /// Bytes [`Resampler::with_capacity`] will hold, computed without allocating (for
    /// memory plans).
    pub fn planned_bytes(max_src: u32, max_dst: u32) -> usize {
        let (src, dst) = (max_src.max(1) as usize, max_dst.max(1) as usize);
        let taps = Axis::taps_for((2 * src) as f32 / dst as f32);
        let axis = dst * 4 * 2 + dst * taps * 4;
        2 * axis + src * 3 + (dst * 3 + dst * dst * 3) * 4
    }

    /// Bytes of scratch held.
    pub fn bytes(&self) -> usize {
        self.x.bytes()
            + self.y.bytes()
            + self.row.capacity()
            + (self.hrow.capacity() + self.acc.capacity()) * 4
    }

    /// Resamples `src` to `dw × dh` pixels and writes them as RGB8 rows `out_stride` bytes
    /// apart into `out` (the content area of a letterbox). Allocates only if the sizes are
    /// beyond what was reserved.
    pub fn resample(
        &mut self,
        src: &impl RgbRows,
        dw: u32,
        dh: u32,
        out: &mut [u8],
        out_stride: usize,
    ) {
        let (sw, sh) = (src.width(), src.height());
        if sw == 0 || sh == 0 || dw == 0 || dh == 0 {
            return;
        }
        self.reserve(sw.max(sh), dw.max(dh));
        self.x.plan(sw, dw);
        self.y.plan(sh, dh);
        let (row, hrow) = (
            &mut self.row[..sw as usize * 3],
            &mut self.hrow[..dw as usize * 3],
        );
        let acc = &mut self.acc[..(dw * dh) as usize * 3];
        acc.fill(0.0);
        let out_row = dw as usize * 3;
        // Output rows whose windows may still take source rows: [first, …).
        let mut first = 0usize;
        for y in 0..sh {
            while first < dh as usize && {
                let (s, w) = self.y.window(first);
                s + w.len() as u32 <= y
            } {
                first += 1;
            }
            src.read_row(y, row);
            horizontal(&self.x, row, hrow);
            for j in first..dh as usize {
                let (s, w) = self.y.window(j);
                if s > y {
                    break;
                }
                let Some(&wy) = w.get((y - s) as usize) else {
                    continue;
                };
                let a = &mut acc[j * out_row..(j + 1) * out_row];
                for (a, h) in a.iter_mut().zip(hrow.iter()) {
                    *a += wy * h;
                }
            }
        }
        for (j, a) in acc.chunks_exact(out_row).enumerate() {
            let o = &mut out[j * out_stride..j * out_stride + out_row];
            for (o, a) in o.iter_mut().zip(a) {
                *o = a.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// The horizontal pass of one RGB row: each output pixel's window is sliced once, so the
/// taps run without per-element bounds checks.
fn horizontal(x: &Axis, row: &[u8], out: &mut [f32]) {
    for (i, px) in out.chunks_exact_mut(3).enumerate() {
        let (s, w) = x.window(i);
        let start = s as usize * 3;
        let src = &row[start..start + w.len() * 3];
        let mut sum = [0.0f32; 3];
        for (p, &wk) in src.chunks_exact(3).zip(w) {
            sum[0] += wk * f32::from(p[0]);
            sum[1] += wk * f32::from(p[1]);
            sum[2] += wk * f32::from(p[2]);
        }
        px.copy_from_slice(&sum);
    }
}

/// Grows `v` to exactly `len` (no amortised slack: the memory plan counts exact sizes).
fn grow<T: Clone>(v: &mut Vec<T>, len: usize, fill: T) {
    if v.len() < len {
        v.reserve_exact(len - v.len());
        v.resize(len, fill);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::RgbImage;

    fn resample(src: &RgbImage, dw: u32, dh: u32) -> Vec<u8> {
        let mut out = vec![0u8; (dw * dh * 3) as usize];
        Resampler::default().resample(src, dw, dh, &mut out, dw as usize * 3);
        out
    }

    #[test]
    fn flat_colour_stays_flat_at_any_scale() {
        let src = RgbImage::from_pixel(37, 23, image::Rgb([200, 10, 20]));
        for (dw, dh) in [(37, 23), (128, 80), (5, 3), (1, 1), (300, 7)] {
            let out = resample(&src, dw, dh);
            assert!(out.chunks(3).all(|p| p == [200, 10, 20]), "{dw}x{dh}");
        }
    }

    #[test]
    fn same_size_is_a_copy_and_halving_averages_pairs() {
        let src = RgbImage::from_fn(8, 6, |x, y| image::Rgb([(x * 30) as u8, (y * 40) as u8, 7]));
        assert_eq!(resample(&src, 8, 6), src.as_raw()[..]);
        // Shrinking by 2: each output pixel is centred between two source pixels, weights
        // 1/4, 3/4, 3/4, 1/4 over four pixels of a linear ramp: the pair's mean.
        let ramp = RgbImage::from_fn(8, 1, |x, _| image::Rgb([(x * 20) as u8, 0, 0]));
        let out = resample(&ramp, 4, 1);
        let reds: Vec<u8> = out.chunks(3).map(|p| p[0]).collect();
        // Inner pixels: the mean of their pair; edge windows lose their outside tap and are
        // renormalised: (0·¾ + 20·¾ + 40·¼) / 1¾ = 14.3, (100·¼ + 120·¾ + 140·¾) / 1¾ = 125.7.
        assert_eq!(reds, [14, 50, 90, 126]);
    }

    #[test]
    fn streaming_matches_a_direct_two_pass_reference() {
        let src = RgbImage::from_fn(97, 61, |x, y| {
            image::Rgb([(x * 5 + y) as u8, (y * 7) as u8, ((x * y) % 251) as u8])
        });
        for (dw, dh) in [(40, 25), (128, 80), (13, 61)] {
            let out = resample(&src, dw, dh);
            let mut x = Axis::default();
            let mut y = Axis::default();
            x.plan(97, dw);
            y.plan(61, dh);
            for j in 0..dh as usize {
                for i in 0..dw as usize {
                    for c in 0..3 {
                        let (ys, yw) = y.window(j);
                        let (xs, xw) = x.window(i);
                        let mut v = 0.0f32;
                        for (b, wb) in yw.iter().enumerate() {
                            let mut h = 0.0f32;
                            for (a, wa) in xw.iter().enumerate() {
                                let p = src.get_pixel(xs + a as u32, ys + b as u32);
                                h += wa * f32::from(p[c]);
                            }
                            v += wb * h;
                        }
                        let got = out[(j * dw as usize + i) * 3 + c];
                        assert!((f32::from(got) - v).abs() <= 0.5 + 1e-3, "{i},{j},{c}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_plan_is_what_is_allocated() {
        for (src, dst) in [(640, 128), (1920, 128), (4096, 640), (100, 128), (1, 1)] {
            let r = Resampler::with_capacity(src, dst);
            assert_eq!(
                Resampler::planned_bytes(src, dst),
                r.bytes(),
                "{src} → {dst}"
            );
        }
    }

    #[test]
    fn reserved_scratch_is_not_reallocated() {
        let mut r = Resampler::with_capacity(640, 128);
        let before = r.bytes();
        let mut out = vec![0u8; 128 * 128 * 3];
        for (w, h, dw, dh) in [
            (640, 480, 128, 96),
            (480, 640, 96, 128),
            (3, 640, 1, 128),
            (640, 1, 128, 1),
        ] {
            let src = RgbImage::new(w, h);
            r.resample(&src, dw, dh, &mut out, 128 * 3);
            assert_eq!(r.bytes(), before, "{w}x{h} → {dw}x{dh}");
        }
    }
}
