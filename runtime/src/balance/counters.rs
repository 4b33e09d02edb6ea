//! Per-stage counters: records, bytes, thread CPU time, busy and waiting wall time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// One stage's running totals. Updated with relaxed atomics by whichever thread did the work.
#[derive(Debug, Default)]
pub struct StageCounters {
    pub items: AtomicU64,
    pub bytes: AtomicU64,
    /// CPU time of the threads doing this stage's work.
    pub cpu_ns: AtomicU64,
    /// Wall time spent doing the work.
    pub busy_ns: AtomicU64,
    /// Wall time spent waiting on another stage (a free slot, a ready batch).
    pub wait_ns: AtomicU64,
    /// Units of work added (calls to [`StageCounters::add`]).
    pub units: AtomicU64,
    /// Sum of each unit's busy time squared, in µs²: with `busy` and `units`, the spread of
    /// unit times (the autotuner sizes the ring from it).
    pub busy_sq_us2: AtomicU64,
}

impl StageCounters {
    pub fn add(&self, items: u64, bytes: u64, cpu: Duration, busy: Duration, wait: Duration) {
        self.items.fetch_add(items, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.cpu_ns.fetch_add(cpu.as_nanos() as u64, Relaxed);
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Relaxed);
        self.wait_ns.fetch_add(wait.as_nanos() as u64, Relaxed);
        self.units.fetch_add(1, Relaxed);
        let us = busy.as_micros().min(u32::MAX as u128) as u64;
        self.busy_sq_us2.fetch_add(us * us, Relaxed);
    }

    pub fn snapshot(&self) -> StageSnapshot {
        StageSnapshot {
            items: self.items.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            cpu: Duration::from_nanos(self.cpu_ns.load(Relaxed)),
            busy: Duration::from_nanos(self.busy_ns.load(Relaxed)),
            wait: Duration::from_nanos(self.wait_ns.load(Relaxed)),
            units: self.units.load(Relaxed),
            busy_sq_us2: self.busy_sq_us2.load(Relaxed),
        }
    }
}

/// The input pipeline's stages: disk reads, loader work (verify + augment), the consumer.
#[derive(Debug, Default)]
pub struct PipelineCounters {
    /// Items are records read; busy is wall time inside reads.
    pub disk: StageCounters,
    /// Items are records delivered; cpu is loader thread CPU time (reads included).
    pub loaders: StageCounters,
    /// Items are batches taken; wait is time the consumer waited for a Ready batch.
    pub consumer: StageCounters,
    /// Corrupt records replaced by a substitute (`--on-corrupt skip`).
    pub substituted: AtomicU64,
}

impl PipelineCounters {
    pub fn snapshot(&self) -> PipelineSnapshot {
        PipelineSnapshot {
            disk: self.disk.snapshot(),
            loaders: self.loaders.snapshot(),
            consumer: self.consumer.snapshot(),
            substituted: self.substituted.load(Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageSnapshot {
    pub items: u64,
    pub bytes: u64,
    pub cpu: Duration,
    pub busy: Duration,
    pub wait: Duration,
    pub units: u64,
    pub busy_sq_us2: u64,
}

impl StageSnapshot {
    /// CPU seconds per item: for the loaders this is `T_g`.
    pub fn cpu_per_item(&self) -> Option<Duration> {
        (self.items > 0).then(|| self.cpu / self.items as u32)
    }

    /// Wall seconds of work per item (CPU plus what the work waited on: reads, a slow step).
    pub fn busy_per_item(&self) -> Option<Duration> {
        (self.items > 0).then(|| self.busy / self.items as u32)
    }

    /// What happened between `earlier` and `self` (both snapshots of the same counters).
    pub fn since(&self, earlier: &StageSnapshot) -> StageSnapshot {
        StageSnapshot {
            items: self.items.saturating_sub(earlier.items),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            cpu: self.cpu.saturating_sub(earlier.cpu),
            busy: self.busy.saturating_sub(earlier.busy),
            wait: self.wait.saturating_sub(earlier.wait),
            units: self.units.saturating_sub(earlier.units),
            busy_sq_us2: self.busy_sq_us2.saturating_sub(earlier.busy_sq_us2),
        }
    }

    /// Share of the busy time that was CPU: low means the work waited (reads, sleeps, a
    /// core shared with other threads).
    pub fn cpu_share(&self) -> f64 {
        self.cpu.as_secs_f64() / self.busy.as_secs_f64().max(1e-12)
    }

    /// Coefficient of variation (std / mean) of the units' busy times; `None` below 2 units.
    pub fn unit_busy_cv(&self) -> Option<f64> {
        if self.units < 2 {
            return None;
        }
        coefficient_of_variation(
            self.units,
            self.busy.as_secs_f64() * 1e6,
            self.busy_sq_us2 as f64,
        )
    }
}

/// std / mean of `n` values from their sum and sum of squares; `None` without values or with
/// a zero mean.
pub fn coefficient_of_variation(n: u64, sum: f64, sum_sq: f64) -> Option<f64> {
    if n == 0 {
        return None;
    }
    let n = n as f64;
    let mean = sum / n;
    let var = (sum_sq / n - mean * mean).max(0.0);
    (mean > 0.0).then(|| var.sqrt() / mean)
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PipelineSnapshot {
    pub disk: StageSnapshot,
    pub loaders: StageSnapshot,
    pub consumer: StageSnapshot,
    pub substituted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_up_across_threads() {
        let c = std::sync::Arc::new(PipelineCounters::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.loaders.add(
                            2,
                            10,
                            Duration::from_micros(3),
                            Duration::from_micros(4),
                            Duration::ZERO,
                        );
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let s = c.snapshot().loaders;
        assert_eq!((s.items, s.bytes), (8000, 40000));
        assert_eq!(s.cpu, Duration::from_millis(12));
        assert_eq!(s.cpu_per_item(), Some(Duration::from_nanos(1500)));
        assert_eq!(StageSnapshot::default().cpu_per_item(), None);
        // 4000 units of exactly 4 µs: no spread.
        assert_eq!(s.units, 4000);
        assert_eq!(s.unit_busy_cv(), Some(0.0));
    }

    #[test]
    fn spread_of_unit_times() {
        let c = StageCounters::default();
        let before = c.snapshot();
        // Units of 10 and 30 µs: mean 20, std 10, cv 0.5.
        for us in [10, 30, 10, 30] {
            c.add(
                1,
                0,
                Duration::ZERO,
                Duration::from_micros(us),
                Duration::ZERO,
            );
        }
        let d = c.snapshot().since(&before);
        assert_eq!(d.units, 4);
        assert_eq!(d.busy_per_item(), Some(Duration::from_micros(20)));
        assert!((d.unit_busy_cv().unwrap() - 0.5).abs() < 1e-12);
    }
}
