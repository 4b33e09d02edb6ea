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
}

impl StageCounters {
    pub fn add(&self, items: u64, bytes: u64, cpu: Duration, busy: Duration, wait: Duration) {
        self.items.fetch_add(items, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
        self.cpu_ns.fetch_add(cpu.as_nanos() as u64, Relaxed);
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Relaxed);
        self.wait_ns.fetch_add(wait.as_nanos() as u64, Relaxed);
    }

    pub fn snapshot(&self) -> StageSnapshot {
        StageSnapshot {
            items: self.items.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            cpu: Duration::from_nanos(self.cpu_ns.load(Relaxed)),
            busy: Duration::from_nanos(self.busy_ns.load(Relaxed)),
            wait: Duration::from_nanos(self.wait_ns.load(Relaxed)),
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
}

impl StageSnapshot {
    /// CPU seconds per item: for the loaders this is `T_g`.
    pub fn cpu_per_item(&self) -> Option<Duration> {
        (self.items > 0).then(|| self.cpu / self.items as u32)
    }
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
    }
}
