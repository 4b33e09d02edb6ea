//! The learning-rate schedule: linear warm-up, then cosine decay to a floor.
//!
//! `lr(s)` for optimizer step `s` (counting from 1) of `total`:
//! `base · s / warmup` while `s ≤ warmup`, then
//! `floor + (base − floor) · (1 + cos(π · (s − warmup) / (total − warmup))) / 2`.
//! A pure function of the step, so a resumed run continues on the same curve.

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    pub base: f32,
    pub floor: f32,
    pub warmup: u64,
    pub total: u64,
}

impl Schedule {
    /// The learning rate of step `step` (1-based; steps past `total` get the floor).
    pub fn lr(&self, step: u64) -> f32 {
        let step = step.max(1);
        if step <= self.warmup {
            return self.base * step as f32 / self.warmup as f32;
        }
        if step >= self.total {
            return self.floor;
        }
        let t = (step - self.warmup) as f64 / (self.total - self.warmup) as f64;
        let cos = 0.5 * (1.0 + (std::f64::consts::PI * t).cos());
        (self.floor as f64 + (self.base - self.floor) as f64 * cos) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warms_up_linearly_then_decays_to_the_floor() {
        let s = Schedule {
            base: 0.01,
            floor: 0.0001,
            warmup: 10,
            total: 110,
        };
        assert!((s.lr(1) - 0.001).abs() < 1e-9);
        assert_eq!(s.lr(10), 0.01);
        // Half-way through the decay: the mean of base and floor.
        assert!((s.lr(60) - 0.00505).abs() < 1e-7, "{}", s.lr(60));
        assert_eq!(s.lr(110), 0.0001);
        assert_eq!(s.lr(1000), 0.0001);
        let lrs: Vec<f32> = (10..=110).map(|i| s.lr(i)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]), "monotonic decay");
    }
}
