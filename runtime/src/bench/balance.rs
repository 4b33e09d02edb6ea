//! `fulcrum bench balance`: the same training, starved and autotuned, in one run.
//!
//! A short calibration run measures the step time; every loader is then slowed by a sleep
//! per record so that one loader needs `slowdown` × the step time per batch (a stand-in for
//! a weak board's decoding). The starved run trains with one loader and a double-buffered
//! ring; the autotuned run trains with `--autotune` from scratch on the same data, the same
//! slowdown and the same number of steps. Both report the device idle waiting for input.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Serialize;

use crate::train::autotune::{Decision, Tuning};
use crate::train::{self, Observer, Result, RunOptions, StepReport, TrainConfig, TrainReport};

#[derive(Debug, Clone)]
pub struct BalanceBenchConfig {
    /// Packed dataset.
    pub data: PathBuf,
    pub batch: u32,
    /// Training steps per run.
    pub steps: u64,
    /// One loader's time per batch as a multiple of the step time.
    pub slowdown: f64,
    /// Scratch folder for the runs' checkpoints.
    pub scratch: PathBuf,
    pub options: RunOptions,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub name: String,
    pub tuning: Tuning,
    pub steps: u64,
    pub seconds: f64,
    pub samples_per_s: f64,
    /// Device idle waiting for input over the whole step loop.
    pub device_idle: f64,
    /// The same after the autotuner settled.
    pub device_idle_settled: Option<f64>,
    /// Seconds the autotuner's probe took before the first step.
    pub probe_seconds: Option<f64>,
    pub decisions: Vec<Decision>,
    pub unbalanced: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BalanceBenchReport {
    pub engine: String,
    pub batch: u32,
    /// The calibrated step time (median).
    pub step_ms: f64,
    /// Sleep per record added to every loader.
    pub delay_per_record_ms: f64,
    pub starved: RunFigures,
    pub autotuned: RunFigures,
}

/// Keeps every step's device time.
struct StepTimes(Vec<Duration>);
impl Observer for StepTimes {
    fn step(&mut self, r: &StepReport) {
        self.0.push(r.device);
    }
}

pub fn run(c: &BalanceBenchConfig, say: &dyn Fn(&str)) -> Result<BalanceBenchReport> {
    let stop = AtomicBool::new(false);
    let base = TrainConfig {
        data: c.data.clone(),
        batch: c.batch,
        epochs: 1000,
        loaders: 1,
        ring: 2,
        checkpoint_every: u64::MAX,
        ..TrainConfig::default()
    };
    // The runs' folders go when the bench ends, whichever way it ends.
    struct RemoveOnDrop<'a>(&'a Path);
    impl Drop for RemoveOnDrop<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _scratch = RemoveOnDrop(&c.scratch);
    let fresh = |name: &str| -> Result<PathBuf> {
        let dir = c.scratch.join(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(train::Error::Config(format!("{}: {e}", dir.display())))
            }
            _ => {}
        }
        Ok(dir)
    };

    say("calibrating: 12 steps with a fast loader");
    let mut times = StepTimes(Vec::new());
    let calibration = train::train(
        &TrainConfig {
            out: fresh("calibrate")?,
            ..base.clone()
        },
        &RunOptions {
            max_steps: Some(12),
            ..c.options.clone()
        },
        &stop,
        &mut times,
    )?;
    let mut steady: Vec<Duration> = times.0.iter().skip(2).copied().collect();
    steady.sort();
    let step = steady.get(steady.len() / 2).copied().unwrap_or_default();
    let delay = step.mul_f64(c.slowdown / c.batch as f64);
    say(&format!(
        "step {:.2} ms on {}: every loader sleeps {:.3} ms per record ({}× a step per batch for one loader)",
        step.as_secs_f64() * 1e3,
        calibration.engine,
        delay.as_secs_f64() * 1e3,
        c.slowdown
    ));

    let slowed = RunOptions {
        max_steps: Some(c.steps),
        loader_slow_down: delay,
        ..c.options.clone()
    };
    let run = |name: &str, config: TrainConfig| -> Result<RunFigures> {
        say(&format!("{name}: {} steps", c.steps));
        let report = train::train(
            &TrainConfig {
                out: fresh(name)?,
                ..config
            },
            &slowed,
            &stop,
            &mut train::Quiet,
        )?;
        Ok(figures(name, &report, c.batch))
    };
    let starved = run("starved", base.clone())?;
    let autotuned = run(
        "autotuned",
        TrainConfig {
            autotune: true,
            ..base.clone()
        },
    )?;
    Ok(BalanceBenchReport {
        engine: calibration.engine,
        batch: c.batch,
        step_ms: step.as_secs_f64() * 1e3,
        delay_per_record_ms: delay.as_secs_f64() * 1e3,
        starved,
        autotuned,
    })
}

fn figures(name: &str, r: &TrainReport, batch: u32) -> RunFigures {
    let loop_seconds = r.loop_time.as_secs_f64();
    RunFigures {
        name: name.to_owned(),
        tuning: r.tuning,
        steps: r.progress.step,
        seconds: loop_seconds,
        samples_per_s: (r.progress.step * batch as u64) as f64 / loop_seconds.max(1e-9),
        device_idle: r.input_wait,
        device_idle_settled: r.input_wait_settled,
        probe_seconds: r.probe_time.map(|p| p.as_secs_f64()),
        decisions: r.decisions.clone(),
        unbalanced: r.unbalanced.clone(),
    }
}
