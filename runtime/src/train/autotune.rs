//! `train --autotune`: chooses the loader count, batch, ring depth and I/O queue depth, and
//! changes them during the run only when measurements say so.
//!
//! 1. Batch: the requested one if the run fits `--mem-budget` with it, else the largest that
//!    does (chosen before the model is built; it is the one choice that changes the result).
//! 2. Start from the equation: a probe measures the step time `T_step` and a loader's wall
//!    time per record `T_g`; loaders = ⌈T_g·B·(1 + headroom) / T_step⌉, within the cores a CPU
//!    engine leaves free (loaders that mostly wait on reads or sleeps may outnumber the cores)
//!    and within the budget. The ring starts as a double buffer (2 slots).
//! 3. Hill-climb on windows of steps: a window whose device idle is over the target either
//!    *ran empty after being full* (the loaders had blocked on a full ring: the mean rate is
//!    enough but its spread is not absorbed, so the ring grows to the depth the simulator says
//!    absorbs the measured spread), or *never filled* (the mean rate is short: more loaders,
//!    kept only if the measured loading rate rose). Two windows at or under the target settle
//!    it; so does reaching a limit, which is reported as "no configuration within the budget
//!    balances".
//!
//! Every decision is kept with its reason. Changing loaders, ring or queue depth never changes
//! what is trained: batches are functions of (seed, epoch, position), so the trainer restarts
//! the loader at the next batch.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::balance::{simulate, DistSpec, Distribution, Policy, Role, SimConfig, StageSnapshot};

/// The device idle fraction (waiting for input) the tuner aims at or under.
pub const TARGET_IDLE: f64 = 0.01;
/// Loaders get this much more throughput than the equation asks for.
const HEADROOM: f64 = 0.15;
/// A loader added must raise the loading rate by at least this much to be kept.
const MIN_GAIN: f64 = 0.05;
/// Windows in a row at or under the target before the tuner settles.
const SETTLE_WINDOWS: u32 = 2;
/// Windows after which the tuner stops whatever it measures.
const MAX_WINDOWS: u32 = 12;

/// The configuration the tuner controls (stored with the checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tuning {
    pub batch: u32,
    pub loaders: usize,
    pub ring: usize,
    /// io_uring reads in flight per loader.
    pub io_depth: u32,
}

impl std::fmt::Display for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "batch {}, {} loader(s), ring {}, I/O queue depth {}",
            self.batch, self.loaders, self.ring, self.io_depth
        )
    }
}

/// One choice and why it was made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Steps done when it was made (0: before training).
    pub step: u64,
    pub what: String,
    pub why: String,
}

/// What the tuner may not exceed.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Cores the loaders can have without taking them from a CPU compute engine (at least 1).
    pub free_cores: usize,
    /// Loaders allowed when they mostly wait (reads, sleeps) rather than compute.
    pub max_waiting_loaders: usize,
    pub max_ring: usize,
}

impl Limits {
    /// For a machine with `cores` and a compute engine using `engine_threads` of them (0 for a
    /// GPU engine, whose host thread mostly waits).
    pub fn for_machine(cores: usize, engine_threads: usize) -> Self {
        Limits {
            free_cores: cores.saturating_sub(engine_threads).max(1),
            max_waiting_loaders: (4 * cores).clamp(4, 16),
            max_ring: 16,
        }
    }
}

/// I/O queue depth for a loader's unit of `part_records` records: all of its reads in flight
/// at once (more only costs kernel memory).
pub fn io_depth_for(part_records: usize) -> u32 {
    (part_records.max(1) as u32)
        .next_power_of_two()
        .clamp(4, 64)
}

/// What the probe before training measured.
#[derive(Debug, Clone, Copy)]
pub struct Probe {
    /// Device time of one step at the chosen batch.
    pub step: Duration,
    /// Loader counters over the probe's batches.
    pub loaders: StageSnapshot,
}

/// What a window of steps measured.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub steps: u64,
    pub wall: Duration,
    /// Time the step loop waited for batches (the device idle).
    pub waited: Duration,
    pub step_mean: Duration,
    /// Spread of step times (std / mean).
    pub step_cv: f64,
    /// Loader counters over the window.
    pub loaders: StageSnapshot,
}

impl Window {
    pub fn idle(&self) -> f64 {
        self.waited.as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }

    /// The loaders blocked for a free slot for over 1 % of their time: the ring was full.
    fn ring_was_full(&self, loaders: usize) -> bool {
        self.loaders.wait.as_secs_f64() > 0.01 * self.wall.as_secs_f64() * loaders as f64
    }

    /// Records loaded per second of the window.
    fn loading_rate(&self) -> f64 {
        self.loaders.items as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Loaders whose work is at least this share CPU compete for cores; below it they mostly wait
/// (reads, sleeps) and more loaders than free cores can still help.
const CPU_BOUND_SHARE: f64 = 0.7;

/// Loaders the equation asks for, with headroom.
fn loaders_needed(busy_per_record: Duration, batch: u32, step: Duration) -> usize {
    let load = busy_per_record.as_secs_f64() * batch as f64 * (1.0 + HEADROOM);
    (load / step.as_secs_f64().max(1e-9)).ceil().max(1.0) as usize
}

/// Device idle the simulator predicts for a ring of `ring` batches fed at `batch_ms` per batch
/// (the loaders together, spread `load_cv`) to steps of `step_ms` (spread `step_cv`).
pub fn predicted_stall(
    ring: usize,
    batch_ms: f64,
    load_cv: f64,
    step_ms: f64,
    step_cv: f64,
) -> Option<f64> {
    let dist = |mean: f64, cv: f64, role| {
        let spec = if cv > 0.0 {
            DistSpec::Lognormal
        } else {
            DistSpec::Const
        };
        Distribution::new(Some(&spec), Some(mean), Some(cv), role).ok()
    };
    // The cooperating loaders act as one worker delivering a batch every `batch_ms`.
    let mut config = SimConfig::new(
        1,
        dist(batch_ms, load_cv, Role::Load)?,
        dist(step_ms, step_cv, Role::Step)?,
        (2000.0 * step_ms.max(batch_ms) / 1e3).clamp(1.0, 3600.0),
    );
    config.ring = ring;
    config.draw_seconds = Some(1e-3);
    let sim = simulate(&config, Policy::Any).ok()?;
    sim.report.stall_fraction_after_first
}

/// The tuner's state between windows.
pub struct Autotuner {
    tuning: Tuning,
    limits: Limits,
    decisions: Vec<Decision>,
    settled: bool,
    good_windows: u32,
    windows: u32,
    /// The last loader raise, to keep or undo: (loaders before, loading rate before).
    raised_from: Option<(usize, f64)>,
    /// More loaders did not help: only the ring may still change.
    loaders_capped: bool,
    /// Why the tuner stopped short of the target, if it did.
    unbalanced: Option<String>,
}

impl Autotuner {
    /// A run resumed with the tuning its checkpoint saved.
    pub fn resumed(tuning: Tuning, limits: Limits) -> Self {
        let mut t = Self::new(tuning, limits);
        t.decide(
            0,
            format!("start from {tuning}"),
            "the checkpoint holds the tuned configuration of the run it continues".into(),
        );
        t
    }

    fn new(tuning: Tuning, limits: Limits) -> Self {
        Autotuner {
            tuning,
            limits,
            decisions: Vec::new(),
            settled: false,
            good_windows: 0,
            windows: 0,
            raised_from: None,
            loaders_capped: false,
            unbalanced: None,
        }
    }

    /// The starting configuration from the equation, with what the probe measured.
    /// `fits` says whether a configuration fits the memory budget.
    pub fn start(
        batch: u32,
        probe: &Probe,
        limits: Limits,
        part_records: impl Fn(usize) -> usize,
        fits: &dyn Fn(&Tuning) -> bool,
    ) -> Self {
        let mut t = Self::new(
            Tuning {
                batch,
                loaders: 1,
                ring: 2,
                io_depth: io_depth_for(part_records(1)),
            },
            limits,
        );
        let busy = probe.loaders.busy_per_item().unwrap_or_default();
        let share = probe.loaders.cpu_share();
        let needed = loaders_needed(busy, batch, probe.step);
        let cap = t.loader_cap(share);
        let mut loaders = needed.min(cap);
        while loaders > 1 && !fits(&t.with_loaders(loaders, &part_records)) {
            loaders -= 1;
        }
        let load_ms = busy.as_secs_f64() * 1e3 * batch as f64;
        let mut why = format!(
            "T_g·B = {:.3} ms × {batch} = {load_ms:.2} ms per batch for one loader (CPU {:.0} % of it) \
             vs T_step = {:.2} ms: {needed} loader(s) with {:.0} % headroom",
            busy.as_secs_f64() * 1e3,
            100.0 * share,
            probe.step.as_secs_f64() * 1e3,
            100.0 * HEADROOM,
        );
        if loaders < needed {
            why += &format!(
                "; {loaders} allowed ({})",
                t.cap_reason(share, cap, loaders)
            );
        }
        t.tuning = t.with_loaders(loaders, &part_records);
        t.decide(0, format!("{} loader(s)", t.tuning.loaders), why);
        t.decide(
            0,
            "ring 2".into(),
            "a double buffer to start; it grows only if it runs empty after being full".into(),
        );
        t.decide(
            0,
            format!("I/O queue depth {}", t.tuning.io_depth),
            format!(
                "every read of a loader's unit ({} records) in flight at once",
                part_records(t.tuning.loaders)
            ),
        );
        if needed > loaders {
            t.unbalanced = Some(format!(
                "the equation asks for {needed} loaders; {loaders} allowed ({})",
                t.cap_reason(share, cap, loaders)
            ));
        }
        t
    }

    /// Puts decisions made before the start (the batch) first.
    pub fn prepend(&mut self, earlier: Vec<Decision>) {
        for d in &earlier {
            log::debug!("autotune (step {}): {}: {}", d.step, d.what, d.why);
        }
        self.decisions.splice(0..0, earlier);
    }

    /// The configuration to run with now.
    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// The tuner has stopped changing things.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Why no configuration within the limits balanced, if none did.
    pub fn unbalanced(&self) -> Option<&str> {
        self.unbalanced.as_deref()
    }

    /// Steps per window for steps of `step`: about a second, 8 to 64 steps.
    pub fn window_steps(step: Duration) -> u64 {
        ((1.0 / step.as_secs_f64().max(1e-6)).ceil() as u64).clamp(8, 64)
    }

    /// Looks at one window (after `step` steps); returns the configuration to switch to, if
    /// it changes.
    pub fn observe(
        &mut self,
        step: u64,
        w: &Window,
        part_records: impl Fn(usize) -> usize,
        fits: &dyn Fn(&Tuning) -> bool,
    ) -> Option<Tuning> {
        if self.settled || w.steps == 0 {
            return None;
        }
        self.windows += 1;
        let idle = w.idle();
        let before = self.tuning;

        // Judge the last loader raise first: keep it only if loading got faster.
        if let Some((from, rate_before)) = self.raised_from.take() {
            let rate = w.loading_rate();
            if rate < rate_before * (1.0 + MIN_GAIN) && idle > TARGET_IDLE {
                self.loaders_capped = true;
                self.tuning = self.with_loaders(from, &part_records);
                self.decide(
                    step,
                    format!("back to {from} loader(s)"),
                    format!(
                        "{} loaders loaded {rate:.0} records/s, {from} loaded {rate_before:.0}: \
                         more loaders do not help (bound by CPU cores or the disk)",
                        before.loaders
                    ),
                );
                self.unbalanced = Some(format!(
                    "input-bound at {} loaders: device idle {:.1} %, and more loaders did not load faster",
                    from,
                    100.0 * idle
                ));
                self.settle(step, "no loader count within the limits balances".into());
                return Some(self.tuning);
            }
        }

        if idle <= TARGET_IDLE {
            self.good_windows += 1;
            if self.good_windows >= SETTLE_WINDOWS {
                self.unbalanced = None;
                self.settle(
                    step,
                    format!(
                        "device idle {:.2} % ≤ {:.0} % for {SETTLE_WINDOWS} windows",
                        100.0 * idle,
                        100.0 * TARGET_IDLE
                    ),
                );
            }
            return None;
        }
        self.good_windows = 0;

        if w.ring_was_full(self.tuning.loaders) {
            self.grow_ring(step, w, &part_records, fits);
        } else if !self.loaders_capped {
            self.add_loaders(step, w, &part_records, fits);
        } else {
            self.unbalanced = Some(format!(
                "input-bound: device idle {:.1} % at the most loaders that help",
                100.0 * idle
            ));
            self.settle(step, "no change within the limits lowers the idle".into());
        }
        if !self.settled && self.windows >= MAX_WINDOWS {
            self.settle(step, format!("{MAX_WINDOWS} windows measured"));
        }
        (self.tuning != before).then_some(self.tuning)
    }

    /// The mean loading rate is short: more loaders, as many as the equation says.
    fn add_loaders(
        &mut self,
        step: u64,
        w: &Window,
        part_records: &impl Fn(usize) -> usize,
        fits: &dyn Fn(&Tuning) -> bool,
    ) {
        let share = w.loaders.cpu_share();
        let busy = w.loaders.busy_per_item().unwrap_or_default();
        let needed = loaders_needed(busy, self.tuning.batch, w.step_mean);
        let cap = self.loader_cap(share);
        let current = self.tuning.loaders;
        let mut target = needed.max(current + 1).min(cap);
        while target > current && !fits(&self.with_loaders(target, part_records)) {
            target -= 1;
        }
        let measured = format!(
            "device idle {:.1} % and the ring never filled: T_g·B = {:.2} ms per batch per loader \
             (CPU {:.0} %) vs T_step = {:.2} ms",
            100.0 * w.idle(),
            busy.as_secs_f64() * 1e3 * self.tuning.batch as f64,
            100.0 * share,
            w.step_mean.as_secs_f64() * 1e3
        );
        if target <= current {
            let limit = if cap <= current {
                self.cap_reason(share, cap, current)
            } else {
                "the memory budget allows no more".to_owned()
            };
            self.unbalanced = Some(format!(
                "no configuration within the limits balances: {measured}; {needed} loaders needed, \
                 {current} allowed ({limit})"
            ));
            self.settle(
                step,
                format!("{needed} loaders needed, {current} allowed ({limit})"),
            );
            return;
        }
        self.raised_from = Some((current, w.loading_rate()));
        self.tuning = self.with_loaders(target, part_records);
        self.decide(
            step,
            format!("{current} → {target} loaders"),
            format!("{measured}: {needed} loader(s) needed"),
        );
    }

    /// The ring ran empty after being full: deepen it as far as the simulator says absorbs
    /// the measured spread of loading and step times.
    fn grow_ring(
        &mut self,
        step: u64,
        w: &Window,
        part_records: &impl Fn(usize) -> usize,
        fits: &dyn Fn(&Tuning) -> bool,
    ) {
        let t = self.tuning;
        let units_per_batch = (t.batch as f64 / part_records(t.loaders) as f64).max(1.0);
        let load_cv = w.loaders.unit_busy_cv().unwrap_or(0.0) / units_per_batch.sqrt();
        let batch_ms =
            w.loaders.busy_per_item().unwrap_or_default().as_secs_f64() * 1e3 * t.batch as f64
                / t.loaders as f64;
        let step_ms = w.step_mean.as_secs_f64() * 1e3;
        let mut chosen = None;
        for ring in t.ring + 1..=self.limits.max_ring {
            let candidate = Tuning { ring, ..t };
            if !fits(&candidate) {
                break;
            }
            let stall = predicted_stall(ring, batch_ms, load_cv, step_ms, w.step_cv);
            chosen = Some((ring, stall));
            if stall.is_some_and(|s| s <= TARGET_IDLE / 2.0) {
                break;
            }
        }
        let measured = format!(
            "device idle {:.1} % although the loaders had filled the ring: loading {batch_ms:.2} ms \
             per batch (spread {:.0} %) vs steps of {step_ms:.2} ms (spread {:.0} %)",
            100.0 * w.idle(),
            100.0 * load_cv,
            100.0 * w.step_cv
        );
        match chosen {
            Some((ring, stall)) => {
                self.tuning.ring = ring;
                let predicted = stall.map_or("no prediction".to_owned(), |s| {
                    format!("simulated idle {:.2} %", 100.0 * s)
                });
                self.decide(
                    step,
                    format!("ring {} → {ring}", t.ring),
                    format!("{measured}; {predicted} at depth {ring}"),
                );
            }
            None => {
                self.unbalanced = Some(format!(
                    "no configuration within the limits balances: {measured}; ring {} is the \
                     deepest the budget and limits allow",
                    t.ring
                ));
                self.settle(step, format!("ring {} cannot grow", t.ring));
            }
        }
    }

    fn with_loaders(&self, loaders: usize, part_records: &impl Fn(usize) -> usize) -> Tuning {
        Tuning {
            loaders,
            io_depth: io_depth_for(part_records(loaders)),
            ..self.tuning
        }
    }

    fn loader_cap(&self, cpu_share: f64) -> usize {
        if cpu_share >= CPU_BOUND_SHARE {
            self.limits.free_cores
        } else {
            self.limits.max_waiting_loaders
        }
    }

    fn cap_reason(&self, cpu_share: f64, cap: usize, allowed: usize) -> String {
        if allowed < cap {
            "the memory budget".to_owned()
        } else if cpu_share >= CPU_BOUND_SHARE {
            format!(
                "the loaders compute ({:.0} % CPU) and {cap} core(s) are free of the compute engine",
                100.0 * cpu_share
            )
        } else {
            format!("at most {cap} loaders")
        }
    }

    fn settle(&mut self, step: u64, why: String) {
        self.settled = true;
        self.decide(step, format!("settled at {}", self.tuning), why);
    }

    fn decide(&mut self, step: u64, what: String, why: String) {
        log::debug!("autotune (step {step}): {what}: {why}");
        self.decisions.push(Decision { step, what, why });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaders(items: u64, busy_ms: u64, cpu_ms: u64, wait_ms: u64) -> StageSnapshot {
        StageSnapshot {
            items,
            busy: Duration::from_millis(busy_ms),
            cpu: Duration::from_millis(cpu_ms),
            wait: Duration::from_millis(wait_ms),
            units: items / 4,
            busy_sq_us2: 0,
            bytes: 0,
        }
    }

    const LIMITS: Limits = Limits {
        free_cores: 1,
        max_waiting_loaders: 8,
        max_ring: 16,
    };

    fn part(loaders: usize) -> usize {
        32usize.div_ceil(2 * loaders)
    }

    #[test]
    fn starts_from_the_equation() {
        // 1 ms per record, sleeping: 32 ms per batch against 10 ms steps → ⌈3.2 × 1.15⌉ = 4.
        let probe = Probe {
            step: Duration::from_millis(10),
            loaders: loaders(64, 64, 1, 0),
        };
        let t = Autotuner::start(32, &probe, LIMITS, part, &|_| true);
        assert_eq!(t.tuning().loaders, 4);
        assert_eq!(t.tuning().ring, 2);
        assert_eq!(t.tuning().io_depth, 4);
        assert!(t.unbalanced().is_none());
        // Computing loaders get only the free cores.
        let busy_cpu = Probe {
            loaders: loaders(64, 64, 64, 0),
            ..probe
        };
        let t = Autotuner::start(32, &busy_cpu, LIMITS, part, &|_| true);
        assert_eq!(t.tuning().loaders, 1);
        assert!(t.unbalanced().unwrap().contains("4 loaders"));
        // The budget caps them too.
        let t = Autotuner::start(32, &probe, LIMITS, part, &|c| c.loaders <= 2);
        assert_eq!(t.tuning().loaders, 2);
    }

    fn window(idle_ms: u64, loader: StageSnapshot) -> Window {
        Window {
            steps: 100,
            wall: Duration::from_millis(1000 + idle_ms),
            waited: Duration::from_millis(idle_ms),
            step_mean: Duration::from_millis(10),
            step_cv: 0.05,
            loaders: loader,
        }
    }

    fn started(loaders_now: usize) -> Autotuner {
        let mut t = Autotuner::new(
            Tuning {
                batch: 32,
                loaders: loaders_now,
                ring: 2,
                io_depth: 16,
            },
            LIMITS,
        );
        t.tuning.io_depth = io_depth_for(part(loaders_now));
        t
    }

    #[test]
    fn a_short_rate_raises_loaders_and_keeps_them_only_if_faster() {
        let mut t = started(1);
        // Idle 50 %, loaders never blocked, mostly sleeping: 2 ms per record.
        let w = window(1000, loaders(1000, 2000, 100, 0));
        let next = t.observe(100, &w, part, &|_| true).expect("a change");
        // 2 ms × 32 × 1.15 / 10 ms = 7.4 → 8 loaders.
        assert_eq!(next.loaders, 8);
        assert_eq!(next.ring, 2);
        // The next window loads no faster: back to 1 loader, and the tuner says why.
        let same = window(1000, loaders(1000, 2000, 100, 0));
        let back = t.observe(200, &same, part, &|_| true).expect("undo");
        assert_eq!(back.loaders, 1);
        assert!(t.settled());
        assert!(t
            .unbalanced()
            .unwrap()
            .contains("more loaders did not load faster"));
    }

    #[test]
    fn balanced_windows_settle_it() {
        let mut t = started(1);
        let w = window(1000, loaders(1000, 2000, 100, 0));
        assert_eq!(t.observe(100, &w, part, &|_| true).unwrap().loaders, 8);
        // Four times the rate and idle 0.5 %: kept, then settled after two good windows.
        let good = window(5, loaders(4000, 8000, 400, 0));
        assert_eq!(t.observe(200, &good, part, &|_| true), None);
        assert!(!t.settled());
        assert_eq!(t.observe(300, &good, part, &|_| true), None);
        assert!(t.settled());
        assert_eq!(t.tuning().loaders, 8);
        assert!(t.unbalanced().is_none());
        assert_eq!(t.decisions().len(), 2);
    }

    #[test]
    fn empty_after_full_grows_the_ring_by_simulation() {
        let mut t = started(2);
        // Idle 5 % while the loaders blocked on a full ring for 30 % of their time: the spread,
        // not the mean. Units of 0.1 to 7.9 ms (cv ≈ 1) and steps with spread 50 %.
        let mut l = loaders(1000, 1000, 900, 600);
        l.units = 250;
        l.busy_sq_us2 = 250 * (4000u64 * 4000) * 2; // E[x²] = 2·mean² → cv 1
        let w = Window {
            step_cv: 0.5,
            ..window(50, l)
        };
        let next = t.observe(100, &w, part, &|_| true).expect("a deeper ring");
        assert!(next.ring > 2, "{next:?}");
        assert_eq!(next.loaders, 2);
        // The budget can forbid it, and the tuner says so.
        let mut t = started(2);
        assert_eq!(t.observe(100, &w, part, &|c| c.ring <= 2), None);
        assert!(t.unbalanced().unwrap().contains("ring 2 is the deepest"));
    }

    #[test]
    fn no_room_for_loaders_is_reported() {
        let mut t = started(1);
        let w = window(1000, loaders(1000, 2000, 100, 0));
        assert_eq!(t.observe(100, &w, part, &|c| c.loaders <= 1), None);
        assert!(t.settled());
        let why = t.unbalanced().unwrap();
        assert!(
            why.contains("no configuration within the limits balances"),
            "{why}"
        );
        assert!(why.contains("memory budget"), "{why}");
    }

    #[test]
    fn the_simulator_prefers_deeper_rings_under_spread() {
        let shallow = predicted_stall(2, 8.0, 1.0, 10.0, 0.5).unwrap();
        let deep = predicted_stall(12, 8.0, 1.0, 10.0, 0.5).unwrap();
        assert!(deep < shallow, "{deep} vs {shallow}");
        // Constant times that balance need no depth at all.
        assert!(predicted_stall(2, 8.0, 0.0, 10.0, 0.0).unwrap() < 1e-9);
    }
}
