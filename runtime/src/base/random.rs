//! The crate's small deterministic hashing and random-number helpers: [`mix64`],
//! [`derive_seed`] and [`SplitMix64`] (a per-record augmentation seed is
//! `derive_seed(&[seed, epoch, record_index])`; epoch order, initial weights and the synthetic
//! set are made from them too). They are stable: changing them changes every run's order,
//! augmentation and initial weights.

/// SplitMix64's increment (the golden ratio in 64-bit fixed point).
pub const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function applied to `x + GOLDEN_GAMMA`: a bijection of `u64` with good
/// avalanche (every input bit flips about half of the output bits). `mix64(0) ≠ 0`.
#[inline]
pub fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed for a sub-stream, derived from a sequence of parts (`[seed, epoch, record]`, …).
/// Order- and length-sensitive: `[a, b]`, `[b, a]` and `[a]` give unrelated values.
#[inline]
pub fn derive_seed(parts: &[u64]) -> u64 {
    let mut h: u64 = 0x243F_6A88_85A3_08D3; // digits of π: any fixed odd constant
    for &p in parts {
        h = mix64(h ^ mix64(p));
    }
    h
}

/// The SplitMix64 generator: tiny (one `u64` of state), fast, and good enough for
/// augmentation choices. Not for cryptography.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let x = self.state;
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(x)
    }

    /// Uniform in `[0, 1)` with 24 bits of resolution.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_are_stable_and_spread() {
        assert_ne!(mix64(0), 0);
        assert_ne!(derive_seed(&[1, 2]), derive_seed(&[2, 1]));
        assert_ne!(derive_seed(&[1]), derive_seed(&[1, 0]));
        assert_eq!(derive_seed(&[1, 2, 3]), derive_seed(&[1, 2, 3]));
        // Adjacent inputs flip about half the output bits.
        let flips = (0..1000u64)
            .map(|x| (mix64(x) ^ mix64(x + 1)).count_ones())
            .sum::<u32>() as f64
            / 1000.0;
        assert!((28.0..36.0).contains(&flips), "{flips}");
        let mut rng = SplitMix64::new(5);
        let mean = (0..10_000).map(|_| rng.next_f32() as f64).sum::<f64>() / 10_000.0;
        assert!((0.48..0.52).contains(&mean));
        let mut rng = SplitMix64::new(5);
        assert!((0..10_000).all(|_| (0.0..1.0).contains(&rng.next_f32())));
    }
}
