//! Latency percentiles in fixed memory: a log-linear histogram of microseconds (eight buckets
//! per power of two, so a percentile is within 1/8 ≈ 12 % of the true value, the usual
//! HdrHistogram-style trade), recorded per request with no allocation.

/// Sub-buckets per power of two.
const SUB: u32 = 8;
/// Powers of two covered: 1 µs to about 2^32 µs (71 minutes); larger values land in the last.
const OCTAVES: u32 = 32;
const BUCKETS: usize = (SUB * OCTAVES) as usize;

/// Counts of durations in microseconds.
#[derive(Clone)]
pub struct LatencyHistogram {
    counts: [u64; BUCKETS],
    total: u64,
    sum_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: [0; BUCKETS],
            total: 0,
            sum_us: 0,
        }
    }
}

impl LatencyHistogram {
    fn bucket(us: u64) -> usize {
        if us < u64::from(SUB) {
            return us as usize;
        }
        let octave = 63 - us.leading_zeros(); // ≥ 3
        let sub = (us >> (octave - 3)) & u64::from(SUB - 1);
        (((octave - 2) * SUB) as usize + sub as usize).min(BUCKETS - 1)
    }

    /// The largest value that lands in `bucket` (what a percentile reports: an upper bound).
    fn upper(bucket: usize) -> u64 {
        let b = bucket as u64;
        if b < u64::from(SUB) {
            return b;
        }
        let octave = b / u64::from(SUB) + 2;
        let sub = b % u64::from(SUB);
        ((u64::from(SUB) + sub + 1) << (octave - 3)) - 1
    }

    /// Adds another histogram's counts (clients measured apart, reported together).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    pub fn record(&mut self, us: u64) {
        self.counts[Self::bucket(us)] += 1;
        self.total += 1;
        self.sum_us = self.sum_us.saturating_add(us);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// Every value recorded, added up, microseconds.
    pub fn sum_us(&self) -> u64 {
        self.sum_us
    }

    /// Values in the buckets whose upper edge is at most `us` (a Prometheus bucket's count,
    /// within a bucket's width).
    pub fn count_at_most(&self, us: u64) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .take_while(|&(i, _)| Self::upper(i) <= us)
            .map(|(_, &c)| c)
            .sum()
    }

    /// The `q`-quantile (0..=1) in microseconds, as the upper edge of its bucket; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::upper(i);
            }
        }
        Self::upper(BUCKETS - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for us in (0..100_000u64).chain([1 << 20, 1 << 31, u64::MAX]) {
            let b = LatencyHistogram::bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let upper = LatencyHistogram::upper(b);
            if b < BUCKETS - 1 {
                assert!(us <= upper, "{us} above its bucket's upper edge {upper}");
                assert!(
                    upper as f64 <= us as f64 * 1.125 + 1.0,
                    "{us}: {upper} too loose"
                );
            }
        }
    }

    #[test]
    fn quantiles_of_a_known_set() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile(0.99), 0);
        for us in 1..=1000 {
            h.record(us);
        }
        assert_eq!(h.count(), 1000);
        let within = |got: u64, want: u64| got >= want && got as f64 <= want as f64 * 1.13;
        assert!(within(h.quantile(0.5), 500), "{}", h.quantile(0.5));
        assert!(within(h.quantile(0.99), 990), "{}", h.quantile(0.99));
        assert!(within(h.quantile(1.0), 1000), "{}", h.quantile(1.0));
        assert_eq!(h.quantile(0.0), 1);
    }
}
