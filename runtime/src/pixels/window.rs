//! The filter windows of one axis: which source samples each output sample reads, and with
//! what weights.
//!
//! Shrinking averages areas (as OpenCV's `INTER_AREA`): output sample `i` of an axis that
//! maps the source interval `[origin, origin + len)` onto `dst` samples covers
//! `[origin + i·r, origin + (i + 1)·r)` with `r = len / dst`, and weighs each source sample by
//! the part of that interval it covers. Enlarging (`r < 1`) interpolates linearly between the
//! two nearest sample centres (half-pixel centres, as OpenCV's `INTER_LINEAR` and PyTorch's
//! `align_corners=False`). Samples outside `[lo, hi)` (the crop) are never read: the edge
//! sample is repeated instead.
//!
//! Every output has the same number of taps (the longest window's), zero-padded, and every
//! window lies inside `[lo, hi)`: the kernels run fixed-length loops with no bounds logic.

/// One axis's windows, in storage that is reserved once and reused.
#[derive(Debug, Default)]
pub(crate) struct Axis {
    /// First source sample of each output's window.
    start: Vec<u32>,
    /// `taps` weights per output, summing to 1.
    weights: Vec<f32>,
    /// The same weights tap by tap: tap `t` of output `i` at `t·dst + i` (for kernels that
    /// take several outputs at once).
    by_tap: Vec<f32>,
    taps: usize,
    /// Lowest and one past the highest sample any window reads.
    span: (u32, u32),
    /// What the windows are for, so that planning the same again is free (a camera sends
    /// the same size every frame).
    planned: Option<(Interval, u32)>,
}

/// What an axis maps: the source interval (in samples of its plane, fractional for chroma
/// of a crop at an odd pixel) and the samples that may be read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Interval {
    pub origin: f64,
    pub len: f64,
    /// Samples `lo .. hi` may be read (`lo < hi`).
    pub lo: u32,
    pub hi: u32,
}

impl Interval {
    /// `len` samples from `origin`, all readable.
    pub fn whole(origin: u32, len: u32) -> Self {
        Interval {
            origin: f64::from(origin),
            len: f64::from(len),
            lo: origin,
            hi: origin + len,
        }
    }

    /// The same interval in a plane subsampled by 2 (chroma): sample `k` there covers
    /// samples `2k, 2k + 1` here.
    pub fn halved(&self) -> Self {
        Interval {
            origin: self.origin / 2.0,
            len: self.len / 2.0,
            lo: self.lo / 2,
            hi: self.hi.div_ceil(2),
        }
    }
}

impl Axis {
    /// Most taps a window has when `src` samples map onto `dst`.
    pub fn taps_for(src: f64, dst: u32) -> usize {
        let r = src / f64::from(dst.max(1));
        // An area window of length r touches at most ⌈r⌉ + 1 samples; linear needs 2.
        (r.ceil() as usize + 1).max(2)
    }

    /// Room for `dst` outputs of windows up to `taps` long; allocates only when it grows.
    pub fn reserve(&mut self, dst: usize, taps: usize) {
        if self.start.capacity() < dst {
            self.start.reserve_exact(dst - self.start.len());
        }
        if self.weights.capacity() < dst * taps {
            self.weights.reserve_exact(dst * taps - self.weights.len());
        }
        if self.by_tap.capacity() < dst * taps {
            self.by_tap.reserve_exact(dst * taps - self.by_tap.len());
        }
    }

    /// Bytes held, for memory plans.
    pub fn bytes(&self) -> usize {
        (self.start.capacity() + self.weights.capacity() + self.by_tap.capacity()) * 4
    }

    /// Bytes [`Axis::reserve`] holds for `dst` outputs of `taps`.
    pub fn planned_bytes(dst: usize, taps: usize) -> usize {
        dst * 4 + 2 * dst * taps * 4
    }

    /// Computes the windows of `src` onto `dst` outputs (`dst > 0`, `src.len > 0`).
    pub fn plan(&mut self, src: Interval, dst: u32) {
        debug_assert!(dst > 0 && src.len > 0.0 && src.lo < src.hi);
        if self.planned == Some((src, dst)) {
            return;
        }
        let r = src.len / f64::from(dst);
        let readable = (src.hi - src.lo) as usize;
        // The longest window is the tap count: an area window of length r touches ⌈r⌉ + 1
        // samples only where it straddles them (never, for a whole r on whole samples).
        let taps = if r >= 1.0 {
            (0..dst)
                .map(|i| {
                    let (k0, k1) = area_bounds(src, r, i);
                    (k1 - k0) as usize
                })
                .max()
                .unwrap_or(1)
        } else {
            2
        }
        .min(readable);
        self.reserve(dst as usize, taps);
        self.taps = taps;
        self.start.clear();
        self.weights.clear();
        let mut span = (u32::MAX, 0);
        for i in 0..dst {
            let first = self.weights.len();
            // Within the reserved capacity: no allocation.
            self.weights.resize(first + taps, 0.0);
            let start = if r >= 1.0 {
                let a = src.origin + f64::from(i) * r;
                let b = a + r;
                let (k0, k1) = area_bounds(src, r, i);
                // A window of k1 − k0 ≤ taps samples, moved left at the far edge so that all
                // `taps` lie inside (taps ≤ hi − lo).
                let start = k0.min(src.hi - taps as u32);
                let out = &mut self.weights[first..first + taps];
                let mut sum = 0.0f64;
                for k in k0..k1 {
                    let kf = f64::from(k);
                    let cover = (b.min(kf + 1.0) - a.max(kf)).max(0.0);
                    out[(k - start) as usize] = cover as f32;
                    sum += cover;
                }
                normalise(out, sum);
                start
            } else {
                let c = src.origin + (f64::from(i) + 0.5) * r - 0.5;
                let k = c.floor();
                let f = c - k;
                let last = f64::from(src.hi - 1);
                let clamp = |v: f64| v.clamp(f64::from(src.lo), last) as u32;
                let (k0, k1) = (clamp(k), clamp(k + 1.0));
                let start = k0.min(src.hi - taps as u32);
                let out = &mut self.weights[first..first + taps];
                out[(k0 - start) as usize] += (1.0 - f) as f32;
                out[(k1 - start) as usize] += f as f32;
                start
            };
            debug_assert!(start >= src.lo && start + taps as u32 <= src.hi);
            span = (span.0.min(start), span.1.max(start + taps as u32));
            self.start.push(start);
        }
        self.span = span;
        // Within the reserved capacity: no allocation.
        self.by_tap.clear();
        self.by_tap.resize(taps * dst as usize, 0.0);
        for (i, w) in self.weights.chunks_exact(taps).enumerate() {
            for (t, &v) in w.iter().enumerate() {
                self.by_tap[t * dst as usize + i] = v;
            }
        }
        self.planned = Some((src, dst));
    }

    /// Taps per output.
    pub fn taps(&self) -> usize {
        self.taps
    }

    /// Window starts, one per output.
    pub fn starts(&self) -> &[u32] {
        &self.start
    }

    /// All weights, `taps` per output.
    pub fn weights(&self) -> &[f32] {
        &self.weights
    }

    /// All weights tap by tap: tap `t` of output `i` at `t·dst + i`.
    pub fn weights_by_tap(&self) -> &[f32] {
        &self.by_tap
    }

    /// Outputs planned.
    pub fn outputs(&self) -> usize {
        self.start.len()
    }

    /// Output `i`'s first sample and weights.
    pub fn window(&self, i: usize) -> (u32, &[f32]) {
        (
            self.start[i],
            &self.weights[i * self.taps..(i + 1) * self.taps],
        )
    }

    /// The samples any window reads: `lo .. hi`.
    pub fn span(&self) -> (u32, u32) {
        self.span
    }
}

/// The samples `k0 .. k1` that output `i`'s area window (of `r` samples) touches.
fn area_bounds(src: Interval, r: f64, i: u32) -> (u32, u32) {
    let a = src.origin + f64::from(i) * r;
    let b = a + r;
    let k0 = (a.floor().max(f64::from(src.lo)) as u32).min(src.hi - 1);
    let k1 = (b.ceil() as u32).clamp(k0 + 1, src.hi);
    (k0, k1)
}

/// Scales `w` to sum to 1 (`sum` is its sum now).
fn normalise(w: &mut [f32], sum: f64) {
    if sum > 0.0 {
        let inv = 1.0 / sum;
        w.iter_mut().for_each(|v| *v = (f64::from(*v) * inv) as f32);
    } else {
        w[0] = 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(src: Interval, dst: u32) -> Axis {
        let mut a = Axis::default();
        a.plan(src, dst);
        a
    }

    #[test]
    fn halving_averages_pairs_and_same_size_copies() {
        let a = planned(Interval::whole(0, 8), 4);
        for i in 0..4 {
            let (s, w) = a.window(i);
            let nonzero: Vec<(u32, f32)> = w
                .iter()
                .enumerate()
                .filter(|(_, v)| **v > 0.0)
                .map(|(k, v)| (s + k as u32, *v))
                .collect();
            assert_eq!(nonzero, [(2 * i as u32, 0.5), (2 * i as u32 + 1, 0.5)]);
        }
        let a = planned(Interval::whole(3, 5), 5);
        for i in 0..5 {
            let (s, w) = a.window(i);
            assert_eq!(
                s + w.iter().position(|v| *v == 1.0).unwrap() as u32,
                3 + i as u32
            );
        }
    }

    #[test]
    fn windows_stay_inside_the_readable_samples_and_sum_to_one() {
        for (src, dst) in [
            (Interval::whole(0, 640), 128),
            (Interval::whole(10, 1000), 7),
            (Interval::whole(0, 3), 128),
            (Interval::whole(5, 100), 256),
            (Interval::whole(0, 1), 1),
            (Interval::whole(0, 1), 9),
            (Interval::whole(101, 333).halved(), 96),
        ] {
            let a = planned(src, dst);
            for i in 0..dst as usize {
                let (s, w) = a.window(i);
                assert!(
                    s >= src.lo && s + w.len() as u32 <= src.hi,
                    "{src:?} {dst} {i}"
                );
                let sum: f32 = w.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "{src:?} {dst} {i}: {sum}");
                assert!(w.iter().all(|v| *v >= 0.0));
            }
        }
    }

    #[test]
    fn area_weights_are_the_covered_fractions() {
        // 5 samples onto 2: [0, 2.5) and [2.5, 5).
        let a = planned(Interval::whole(0, 5), 2);
        let (s, w) = a.window(1);
        let got: Vec<f32> = (0..5usize)
            .map(|k| {
                k.checked_sub(s as usize)
                    .and_then(|j| w.get(j))
                    .copied()
                    .unwrap_or(0.0)
            })
            .collect();
        assert_eq!(got, [0.0, 0.0, 0.2, 0.4, 0.4]);
    }

    #[test]
    fn enlarging_interpolates_between_centres() {
        // 2 samples onto 4: centres at -0.25, 0.25, 0.75, 1.25 in source samples.
        let a = planned(Interval::whole(0, 2), 4);
        let value = |i: usize| {
            let (s, w) = a.window(i);
            w.iter()
                .enumerate()
                .map(|(k, v)| v * [0.0f32, 100.0][s as usize + k])
                .sum::<f32>()
        };
        assert_eq!(
            [value(0), value(1), value(2), value(3)],
            [0.0, 25.0, 75.0, 100.0]
        );
    }
}
