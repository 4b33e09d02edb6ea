//! A floor on the share of engine time fine-tuning gets while the daemon serves under load.
//!
//! Inference comes first: the fine-tune's threads (the step's, its loaders', the held-out
//! scoring's) run at `SCHED_IDLE`, and no step starts while a request is answered. Under a
//! steady stream of frames that leaves a fine-tune almost nothing: its loaders and its steps
//! only run in the gaps, and a step preempted by inference is stretched over many of them.
//! With a floor `P` (`fulcrumd --fine-tune-share P`), the serving loop keeps the time spent
//! answering requests (`S`) and the time the fine-tune had (`T`: its turns, and the steps it
//! took in the gaps, each counted at most as long as the fastest step: a step preempted by
//! requests took longer than the engine time it had), both decaying with a time constant of [`WINDOW`]; while `T < P·(S + T)`,
//! it gives the fine-tune a turn right after a round of answers (when the next frame is
//! furthest away): it stops serving until the fine-tune finishes a step (or a batch of its
//! held-out scoring) or a slice has passed, leaving the cores to the fine-tune's threads. A
//! lightly loaded daemon owes nothing (the steps in its gaps count), and a floor of 0 keeps
//! inference-first alone.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The time constant the shares decay with: long enough to hold several steps, short enough
/// that a burst of requests does not bank a long turn for later.
pub const WINDOW: Duration = Duration::from_secs(1);
/// Largest floor accepted: the daemon's first job is to answer.
pub const MAX_SHARE: f32 = 0.9;

/// The floor, settable while the daemon runs (`bench serve` compares several).
#[derive(Clone, Debug, Default)]
pub struct ShareDial(Arc<AtomicU32>);

impl ShareDial {
    pub fn new(share: f32) -> Self {
        let dial = ShareDial::default();
        dial.set(share);
        dial
    }

    pub fn get(&self) -> f32 {
        f32::from_bits(self.0.load(Ordering::Relaxed))
    }

    /// Sets the floor, clamped to `0..=MAX_SHARE`.
    pub fn set(&self, share: f32) {
        let share = if share.is_finite() {
            share.clamp(0.0, MAX_SHARE)
        } else {
            0.0
        };
        self.0.store(share.to_bits(), Ordering::Relaxed);
    }
}

/// What the fine-tune's thread and the serving loop share for turns.
#[derive(Debug)]
pub struct Turns {
    /// Time of the steps taken outside turns (in the gaps), in nanoseconds.
    gap_ns: AtomicU64,
    /// The fastest training step and scoring batch so far, in nanoseconds: what each costs
    /// the engine unpreempted (kept apart: a scoring batch is much the shorter).
    fastest_ns: [AtomicU64; 2],
    /// Steps (and scoring batches) finished so far: a turn ends at the next.
    steps: AtomicU64,
    /// While the serving loop has stopped serving for a turn: the number `steps` will have
    /// when the turn's step is done (one step a turn); 0 otherwise.
    turn: AtomicU64,
}

impl Default for Turns {
    fn default() -> Self {
        Turns {
            gap_ns: AtomicU64::new(0),
            fastest_ns: [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)],
            steps: AtomicU64::new(0),
            turn: AtomicU64::new(0),
        }
    }
}

impl Turns {
    /// The fine-tune's side, after each training step, which took `took`.
    pub fn step_done(&self, took: Duration) {
        self.done(0, took);
    }

    /// The fine-tune's side, after each batch of its held-out scoring.
    pub fn scoring_done(&self, took: Duration) {
        self.done(1, took);
    }

    fn done(&self, kind: usize, took: Duration) {
        let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
        let fastest = self.fastest_ns[kind]
            .fetch_min(ns, Ordering::Relaxed)
            .min(ns);
        if self.turn.load(Ordering::SeqCst) == 0 {
            self.gap_ns.fetch_add(ns.min(fastest), Ordering::Relaxed);
        }
        self.steps.fetch_add(1, Ordering::SeqCst);
    }

    /// The fine-tune's side, before each step: waits while `busy()` says a request is being
    /// answered, unless in a turn, or until `stop()`.
    pub fn wait_for_gap(&self, busy: impl Fn() -> bool, stop: impl Fn() -> bool) {
        while busy() && !self.my_turn() && !stop() {
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// A turn is open and its step has not run yet.
    fn my_turn(&self) -> bool {
        let turn = self.turn.load(Ordering::SeqCst);
        turn != 0 && turn == self.steps.load(Ordering::SeqCst) + 1
    }

    fn gaps(&self) -> Duration {
        Duration::from_nanos(self.gap_ns.load(Ordering::Relaxed))
    }

    /// The serving loop's side: stops serving until a step finishes, `timeout` passes or
    /// `ended()` says the fine-tune is gone; how long that took.
    fn give_turn(&self, timeout: Duration, ended: impl Fn() -> bool) -> Duration {
        let since = Instant::now();
        let before = self.steps.load(Ordering::SeqCst);
        self.turn.store(before + 1, Ordering::SeqCst);
        while self.steps.load(Ordering::SeqCst) == before && since.elapsed() < timeout && !ended() {
            std::thread::sleep(Duration::from_micros(100));
        }
        self.turn.store(0, Ordering::SeqCst);
        since.elapsed()
    }
}

/// The serving loop's books: serving time and the fine-tune's time, decayed.
#[derive(Debug)]
pub struct ShareFloor {
    pub dial: ShareDial,
    /// When the sums were last decayed, and the gap steps' total then.
    last: Instant,
    gaps_then: Duration,
    /// Seconds of serving and of fine-tuning, each decayed by `exp(-age / WINDOW)`.
    serving: f64,
    tuning: f64,
    /// Turns given, and the time serving stopped for them (for the logs and the bench).
    pub turns: u64,
    pub turned: Duration,
}

impl ShareFloor {
    pub fn new(dial: ShareDial) -> Self {
        ShareFloor {
            dial,
            last: Instant::now(),
            gaps_then: Duration::ZERO,
            serving: 0.0,
            tuning: 0.0,
            turns: 0,
            turned: Duration::ZERO,
        }
    }

    /// Counts `busy` spent answering requests.
    pub fn served(&mut self, busy: Duration) {
        self.serving += busy.as_secs_f64();
    }

    /// Whether the fine-tune is owed a turn now: the floor is set and its decayed time is
    /// under the floor's share of the engine's.
    fn owed(&mut self, turns: &Turns, now: Instant) -> bool {
        let decay = (-now.duration_since(self.last).as_secs_f64() / WINDOW.as_secs_f64()).exp();
        let gaps = turns.gaps();
        self.tuning = self.tuning * decay + gaps.saturating_sub(self.gaps_then).as_secs_f64();
        self.serving *= decay;
        (self.last, self.gaps_then) = (now, gaps);
        let share = f64::from(self.dial.get());
        share > 0.0 && self.serving > 0.0 && self.tuning < share * (self.serving + self.tuning)
    }

    /// Gives the running fine-tune a turn where one is owed (see the module docs), of at most
    /// `slice`.
    pub fn maybe_give_turn(&mut self, turns: &Turns, slice: Duration, ended: impl Fn() -> bool) {
        if !self.owed(turns, Instant::now()) {
            return;
        }
        let took = turns.give_turn(slice, ended);
        self.tuning += took.as_secs_f64();
        self.turns += 1;
        self.turned += took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A fine-tune thread stand-in: steps of `step` each, held back while `busy`.
    fn trainer(
        turns: Arc<Turns>,
        busy: Arc<AtomicBool>,
        stop: Arc<AtomicBool>,
        step: Duration,
    ) -> std::thread::JoinHandle<u32> {
        std::thread::spawn(move || {
            let mut steps = 0;
            while !stop.load(Ordering::SeqCst) {
                turns.wait_for_gap(
                    || busy.load(Ordering::SeqCst),
                    || stop.load(Ordering::SeqCst),
                );
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(step);
                turns.step_done(step);
                steps += 1;
            }
            steps
        })
    }

    /// A serving loop stand-in that is always busy: steps only ever run in turns.
    fn always_busy(share: f32, seconds: f64) -> (u32, Duration, Duration) {
        let turns = Arc::new(Turns::default());
        let busy = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let step = Duration::from_millis(4);
        let t = trainer(turns.clone(), busy.clone(), stop.clone(), step);
        let mut floor = ShareFloor::new(ShareDial::new(share));
        let started = Instant::now();
        let mut serving = Duration::ZERO;
        while started.elapsed().as_secs_f64() < seconds {
            let round = Instant::now();
            std::thread::sleep(Duration::from_millis(2)); // answering requests
            floor.served(round.elapsed());
            serving += round.elapsed();
            floor.maybe_give_turn(&turns, Duration::from_millis(50), || false);
        }
        stop.store(true, Ordering::SeqCst);
        let steps = t.join().unwrap();
        (steps, serving, floor.turned + turns.gaps())
    }

    #[test]
    fn without_a_floor_a_busy_loop_lets_no_step_run() {
        let (steps, _, _) = always_busy(0.0, 0.3);
        assert_eq!(steps, 0);
    }

    #[test]
    fn with_a_floor_the_steps_get_about_their_share_and_no_more() {
        for share in [0.1f32, 0.25, 0.5] {
            let (steps, serving, trained) = always_busy(share, 1.5);
            let got = trained.as_secs_f64() / (trained + serving).as_secs_f64();
            assert!(steps > 0, "share {share}: no step ran");
            // Sleeps overshoot on a busy machine; the share is kept within a few steps.
            assert!(
                got > 0.6 * f64::from(share) && got < 1.5 * f64::from(share) + 0.03,
                "share {share}: training got {got:.3} of the time ({steps} steps)"
            );
        }
    }

    #[test]
    fn steps_taken_in_gaps_count_and_a_turn_ends_if_the_fine_tune_is_gone() {
        let turns = Turns::default();
        let mut floor = ShareFloor::new(ShareDial::new(0.25));
        // Steps in the gaps already had more than a quarter: no turn.
        floor.served(Duration::from_millis(30));
        turns.step_done(Duration::from_millis(20));
        floor.maybe_give_turn(&turns, Duration::from_millis(5), || false);
        assert_eq!(floor.turns, 0);
        // A step stretched by preemption counts as long as the fastest: owed again. Scoring
        // batches keep their own fastest.
        turns.scoring_done(Duration::from_millis(1));
        turns.step_done(Duration::from_millis(2));
        turns.step_done(Duration::from_millis(60));
        assert_eq!(turns.gaps(), Duration::from_millis(25));
        // Owed, but the fine-tune ended: the turn ends at once and is taken back.
        floor.served(Duration::from_millis(100));
        let since = Instant::now();
        floor.maybe_give_turn(&turns, Duration::from_secs(5), || true);
        assert_eq!(floor.turns, 1);
        assert!(since.elapsed() < Duration::from_secs(1));
        assert_eq!(turns.turn.load(Ordering::SeqCst), 0);
        // Owed, and nothing finishes a step: the turn ends after the slice.
        floor.served(Duration::from_millis(500));
        let since = Instant::now();
        floor.maybe_give_turn(&turns, Duration::from_millis(20), || false);
        assert_eq!(floor.turns, 2);
        assert!(since.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn the_dial_clamps() {
        let d = ShareDial::new(0.25);
        d.set(3.0);
        assert_eq!(d.get(), MAX_SHARE);
        d.set(f32::NAN);
        assert_eq!(d.get(), 0.0);
        d.set(-1.0);
        assert_eq!(d.get(), 0.0);
    }
}
