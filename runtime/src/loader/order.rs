//! Epoch order: which record sits at each position of an epoch, as a pure function of
//! `(seed, epoch)`.
//!
//! [`EpochOrder`] is a keyed bijection of `0..n`, evaluated one position at a time in O(1)
//! memory with no allocation, so resuming a run needs only `(seed, epoch, step)` and no shuffled
//! index table is ever materialised. It is a 4-round Feistel network over the smallest power of
//! two `2^k ≥ n`, with halves of `⌈k/2⌉` (high) and `⌊k/2⌋` (low) bits, round keys derived from
//! `(seed, epoch)` with SplitMix64, and cycle-walking to stay below `n`: the network is applied
//! again until the value falls in range. Since `2^k < 2n`, the walk costs fewer than two network
//! evaluations per position on average (exactly: the `n` evaluations that land in range plus at
//! most one per out-of-range value of `0..2^k`).
//!
//! The round keys come from the crate's hashing helpers in [`crate::base`] ([`mix64`],
//! [`derive_seed`], [`crate::base::SplitMix64`]).

use crate::base::{derive_seed, mix64};

/// Feistel rounds (alternating: even rounds change the high half, odd rounds the low half).
const ROUNDS: usize = 4;

/// The order of one epoch: position `i` of the epoch holds record [`get(i)`](Self::get).
/// `Copy`, a few words big, and allocation-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochOrder {
    n: u64,
    shuffle: bool,
    /// Bits of the low half (`⌊k/2⌋`, at most 32).
    lo_bits: u32,
    /// Bits of the high half (`⌈k/2⌉`, at most 32).
    hi_bits: u32,
    keys: [u64; ROUNDS],
}

impl EpochOrder {
    /// The order of `n` records in `epoch` of a run seeded with `seed`; the identity order when
    /// `shuffle` is false.
    pub fn new(n: u64, seed: u64, epoch: u64, shuffle: bool) -> Self {
        let bits = if n <= 1 {
            0
        } else {
            u64::BITS - (n - 1).leading_zeros()
        };
        let lo_bits = bits / 2;
        let base = derive_seed(&[seed, epoch]);
        let mut keys = [0; ROUNDS];
        for (r, k) in keys.iter_mut().enumerate() {
            *k = derive_seed(&[base, r as u64]);
        }
        EpochOrder {
            n,
            shuffle,
            lo_bits,
            hi_bits: bits - lo_bits,
            keys,
        }
    }

    /// Records in the epoch.
    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn is_shuffled(&self) -> bool {
        self.shuffle
    }

    /// The record at position `i` (`i < n`, else panics). Over `i in 0..n` this is a
    /// permutation of `0..n`.
    #[inline]
    pub fn get(&self, i: u64) -> u64 {
        self.walk(i).0
    }

    /// Every position in order: `get(0), get(1), …, get(n − 1)`.
    pub fn iter(&self) -> impl Iterator<Item = u64> {
        let order = *self;
        (0..order.n).map(move |i| order.get(i))
    }

    /// `get(i)` and the number of network evaluations it took (0 when not shuffling).
    #[inline]
    fn walk(&self, i: u64) -> (u64, u32) {
        assert!(
            i < self.n,
            "epoch position {i} out of range (epoch of {} records)",
            self.n
        );
        if !self.shuffle || self.n == 1 {
            return (i, 0);
        }
        let mut x = self.feistel(i);
        let mut evaluations = 1;
        // Terminates: `feistel` permutes `0..2^k` and `i < n` lies on the cycle being walked.
        while x >= self.n {
            x = self.feistel(x);
            evaluations += 1;
        }
        (x, evaluations)
    }

    /// The keyed bijection of `0..2^k`.
    #[inline]
    fn feistel(&self, x: u64) -> u64 {
        let lo_mask = (1u64 << self.lo_bits) - 1;
        let hi_mask = (1u64 << self.hi_bits) - 1;
        let mut hi = x >> self.lo_bits;
        let mut lo = x & lo_mask;
        for (r, &key) in self.keys.iter().enumerate() {
            // Each round xors one half with a keyed hash of the other: invertible whatever the
            // round function, so the whole network is a bijection.
            if r % 2 == 0 {
                hi ^= mix64(lo ^ key) & hi_mask;
            } else {
                lo ^= mix64(hi ^ key) & lo_mask;
            }
        }
        (hi << self.lo_bits) | lo
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_permutation(o: &EpochOrder) {
        let n = o.len() as usize;
        let mut seen = vec![false; n];
        let mut evaluations = 0u64;
        for i in 0..o.len() {
            let (x, e) = o.walk(i);
            assert!(x < o.len(), "n={n}: position {i} → {x} out of range");
            assert!(!seen[x as usize], "n={n}: record {x} appears twice");
            seen[x as usize] = true;
            evaluations += e as u64;
        }
        if o.is_shuffled() && n > 1 {
            let domain = 1u64 << (o.lo_bits + o.hi_bits);
            assert!(domain >= n as u64 && domain < 2 * n as u64);
            // The walk costs at most the domain size in total, i.e. < 2 per position.
            assert!(
                evaluations <= domain,
                "n={n}: {evaluations} evaluations for a domain of {domain}"
            );
        }
    }

    #[test]
    fn permutation_for_many_sizes() {
        for n in [1u64, 2, 3, 4, 5, 7, 8, 9, 128, 1000, 4097, 100_003] {
            for (seed, epoch) in [(0, 0), (1, 0), (0, 1), (0xDEAD_BEEF, 17)] {
                assert_permutation(&EpochOrder::new(n, seed, epoch, true));
            }
        }
    }

    #[test]
    fn identity_when_not_shuffled_and_for_one_record() {
        let o = EpochOrder::new(1000, 7, 3, false);
        assert!(o.iter().eq(0..1000));
        assert_permutation(&o);
        let one = EpochOrder::new(1, 7, 3, true);
        assert_eq!(one.get(0), 0);
        assert_eq!(one.len(), 1);
        assert!(EpochOrder::new(0, 1, 2, true).is_empty());
        assert_eq!(EpochOrder::new(0, 1, 2, true).iter().count(), 0);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn position_past_the_end_panics() {
        EpochOrder::new(10, 0, 0, true).get(10);
    }

    #[test]
    fn same_inputs_same_order_and_different_inputs_differ() {
        let n = 1000;
        let a: Vec<u64> = EpochOrder::new(n, 42, 5, true).iter().collect();
        let again: Vec<u64> = EpochOrder::new(n, 42, 5, true).iter().collect();
        assert_eq!(a, again);
        for (seed, epoch) in [(42, 6), (43, 5), (5, 42), (0, 0)] {
            let b: Vec<u64> = EpochOrder::new(n, seed, epoch, true).iter().collect();
            let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
            // Two independent random permutations agree in about one position.
            assert!(
                same < 20,
                "({seed}, {epoch}) agrees with (42, 5) in {same} positions"
            );
        }
        // Small n: over many epochs, every record shows up first.
        let firsts: std::collections::HashSet<u64> = (0..200)
            .map(|e| EpochOrder::new(3, 9, e, true).get(0))
            .collect();
        assert_eq!(firsts.len(), 3);
        let swapped = (0..200)
            .filter(|&e| EpochOrder::new(2, 9, e, true).get(0) == 1)
            .count();
        assert!(
            (60..140).contains(&swapped),
            "n=2 swapped in {swapped}/200 epochs"
        );
    }

    #[test]
    fn order_looks_shuffled() {
        let n = 10_000u64;
        for epoch in 0..4 {
            let o: Vec<u64> = EpochOrder::new(n, 1234, epoch, true).iter().collect();
            let fixed = o
                .iter()
                .enumerate()
                .filter(|&(i, &x)| i as u64 == x)
                .count();
            assert!(fixed < 10, "{fixed} fixed points");
            let ascents = o.windows(2).filter(|w| w[0] < w[1]).count() as f64 / (n - 1) as f64;
            assert!((0.45..0.55).contains(&ascents), "ascent fraction {ascents}");
            // Mean displacement of a random permutation is n/3.
            let disp = o
                .iter()
                .enumerate()
                .map(|(i, &x)| (i as f64 - x as f64).abs())
                .sum::<f64>()
                / n as f64;
            assert!(
                (0.3..0.37).contains(&(disp / n as f64)),
                "mean displacement {disp}"
            );
            // The first tenth of the epoch draws from everywhere, not from one region.
            let mut deciles = [0u32; 10];
            for &x in &o[..(n / 10) as usize] {
                deciles[(x * 10 / n) as usize] += 1;
            }
            assert!(
                deciles.iter().all(|&c| (60..140).contains(&c)),
                "{deciles:?}"
            );
        }
    }

    #[test]
    fn huge_epochs_stay_in_range() {
        for n in [(1u64 << 40) + 7, u64::MAX, 1u64 << 63] {
            let o = EpochOrder::new(n, 3, 1, true);
            for i in [0, 1, n / 2, n - 1] {
                assert!(o.get(i) < n);
            }
            assert_ne!(o.get(0), EpochOrder::new(n, 3, 2, true).get(0));
        }
    }

    #[test]
    fn get_does_not_allocate() {
        let o = EpochOrder::new(100_003, 1, 2, true);
        let (sum, allocations) = crate::loader::augment::tests::allocations_during(|| {
            let o = EpochOrder::new(o.len(), 1, 3, true);
            (0..o.len()).map(|i| o.get(i)).sum::<u64>()
        });
        assert_eq!(sum, 100_003 * 100_002 / 2);
        assert_eq!(allocations, 0);
    }
}
