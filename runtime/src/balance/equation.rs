//! The balance equation `T_g · B / C ≤ T_step`, evaluated and explained.
//!
//! One sample costs `T_g` of CPU to produce, `C` loader cores share the work, a batch holds `B`
//! samples and one training step takes `T_step` on the device. Loading a batch then takes
//! `T_g·B/C` of wall time; when that exceeds `T_step` the device waits, idle
//! `1 − T_step / (T_g·B/C)` of the time. Buffers (ring depth) do not change these averages: they
//! absorb variance only (see the simulator). With the disk's bandwidth known, the time to read
//! a batch's bytes is a third bound, and the largest of the three is what binds.

use std::time::Duration;

use serde::Serialize;

/// What the equation is evaluated for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalanceInput {
    /// CPU time per sample (`T_g`).
    pub tg: Duration,
    /// Loader cores (`C`).
    pub cores: f64,
    /// Samples per batch (`B`).
    pub batch: u32,
    /// Device time per training step (`T_step`).
    pub step: Duration,
    /// Part of `T_g` spent decoding images, which packing once removes (if known).
    pub decode: Option<Duration>,
    /// Part of `T_g` spent augmenting, which moving augmentation to the device removes.
    pub augment: Option<Duration>,
    /// Bytes read per sample and the disk's sequential bandwidth in bytes/s (if known).
    pub disk: Option<(f64, f64)>,
}

/// The stage that limits throughput.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    Disk,
    LoaderCpu,
    Device,
}

impl Binding {
    pub fn describe(self) -> &'static str {
        match self {
            Binding::Disk => "disk bandwidth",
            Binding::LoaderCpu => "loader CPU",
            Binding::Device => "device",
        }
    }
}

/// A what-if: `T_g` after a change and the device idle fraction it would give.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WhatIf {
    pub tg_ms: f64,
    pub load_per_batch_ms: f64,
    pub device_idle: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BalanceReport {
    /// `T_g·B/C`.
    pub load_per_batch_ms: f64,
    pub step_ms: f64,
    /// Time to read one batch's bytes at the disk's bandwidth, if known.
    pub disk_per_batch_ms: Option<f64>,
    pub input_bound: bool,
    pub binding: Binding,
    /// Fraction of time the device waits for input.
    pub device_idle: f64,
    pub device_utilisation: f64,
    /// Fraction of time the loaders are busy (below 1 when the device binds).
    pub loader_utilisation: f64,
    /// Loader cores that would balance at this batch: `⌈T_g·B / T_step⌉`.
    pub cores_needed: f64,
    /// Largest `T_g` that balances: `T_step·C/B`.
    pub max_tg_ms: f64,
    pub with_packing: Option<WhatIf>,
    pub with_device_augment: Option<WhatIf>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Device idle fraction for a batch loading time and step time.
fn idle(load_ms: f64, step_ms: f64) -> f64 {
    if load_ms > step_ms {
        1.0 - step_ms / load_ms
    } else {
        0.0
    }
}

/// Inputs the equation cannot be evaluated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BalanceError {
    #[error("--cores and --batch must be positive")]
    CoresOrBatch,
    #[error("--tg and --step must be positive durations")]
    Durations,
}

pub fn evaluate(input: &BalanceInput) -> Result<BalanceReport, BalanceError> {
    if input.cores <= 0.0 || input.batch == 0 {
        return Err(BalanceError::CoresOrBatch);
    }
    if input.step.is_zero() || input.tg.is_zero() {
        return Err(BalanceError::Durations);
    }
    let (tg, step, batch) = (ms(input.tg), ms(input.step), input.batch as f64);
    let load = tg * batch / input.cores;
    let disk = input
        .disk
        .map(|(bytes, bandwidth)| bytes * batch / bandwidth * 1e3);
    let input_time = load.max(disk.unwrap_or(0.0));
    let binding = if input_time <= step {
        Binding::Device
    } else if disk.is_some_and(|d| d > load) {
        Binding::Disk
    } else {
        Binding::LoaderCpu
    };
    let device_idle = idle(input_time, step);
    let what_if = |removed: Option<Duration>| {
        removed.map(|r| {
            let tg_after = (tg - ms(r)).max(0.0);
            let load_after = tg_after * batch / input.cores;
            WhatIf {
                tg_ms: tg_after,
                load_per_batch_ms: load_after,
                device_idle: idle(load_after.max(disk.unwrap_or(0.0)), step),
            }
        })
    };
    Ok(BalanceReport {
        load_per_batch_ms: load,
        step_ms: step,
        disk_per_batch_ms: disk,
        input_bound: input_time > step,
        binding,
        device_idle,
        device_utilisation: 1.0 - device_idle,
        loader_utilisation: (load / step).min(1.0),
        cores_needed: (tg * batch / step).ceil(),
        max_tg_ms: step * input.cores / batch,
        with_packing: what_if(input.decode),
        with_device_augment: what_if(input.augment),
    })
}

/// Longest duration [`parse_duration`] takes: every one fulcrum asks for (a sample's load time,
/// a training step, a loader's added delay) is far shorter, so more is a typo.
const MAX_DURATION_S: f64 = 3600.0;

/// Parses a duration like `28ms`, `30us`, `30µs`, `0.5s`, `120ns`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, crate::base::BadQuantity> {
    use crate::base::BadQuantity;
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| BadQuantity::NotANumber {
        kind: "duration",
        given: text.to_owned(),
        examples: "28ms, 30us, 0.5s",
    })?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        other => {
            return Err(BadQuantity::UnknownUnit {
                kind: "duration",
                given: text.to_owned(),
                unit: other.to_owned(),
                units: "s, ms, us or ns",
            })
        }
    };
    let seconds = value * scale;
    if !(0.0..=MAX_DURATION_S).contains(&seconds) {
        return Err(BadQuantity::OutOfRange {
            given: text.to_owned(),
            rule: "a duration must be between 0 and an hour",
        });
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(tg_ms: f64, cores: f64, batch: u32, step_ms: f64) -> BalanceInput {
        BalanceInput {
            tg: Duration::from_secs_f64(tg_ms / 1e3),
            cores,
            batch,
            step: Duration::from_secs_f64(step_ms / 1e3),
            decode: None,
            augment: None,
            disk: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn the_field_example_of_the_design() {
        // 28 ms per sample, 4 cores, batch 32, 10.4 ms per step: 224 ms vs 10.4 ms, 96 % idle.
        let r = evaluate(&input(28.0, 4.0, 32, 10.4)).unwrap();
        assert!(close(r.load_per_batch_ms, 224.0));
        assert!(r.input_bound);
        assert_eq!(r.binding, Binding::LoaderCpu);
        assert!(close(r.device_idle, 1.0 - 10.4 / 224.0));
        assert_eq!((r.device_idle * 100.0).round(), 95.0);
        assert_eq!(r.cores_needed, 87.0); // 28·32/10.4 = 86.15…
        assert!(close(r.max_tg_ms, 10.4 * 4.0 / 32.0));
        assert!(close(r.loader_utilisation, 1.0));
    }

    #[test]
    fn compute_bound_leaves_loaders_idle_and_the_device_busy() {
        let r = evaluate(&input(0.03, 2.0, 32, 40.0)).unwrap();
        assert!(!r.input_bound);
        assert_eq!(r.binding, Binding::Device);
        assert_eq!(r.device_idle, 0.0);
        assert!(close(r.loader_utilisation, 0.48 / 40.0));
        assert_eq!(r.cores_needed, 1.0);
    }

    #[test]
    fn what_ifs_and_disk_binding() {
        let mut i = input(28.0, 4.0, 32, 10.4);
        i.decode = Some(Duration::from_millis(25));
        i.augment = Some(Duration::from_millis(2));
        let r = evaluate(&i).unwrap();
        let packed = r.with_packing.unwrap();
        assert!(close(packed.tg_ms, 3.0) && close(packed.load_per_batch_ms, 24.0));
        assert!(close(packed.device_idle, 1.0 - 10.4 / 24.0));
        assert!(close(r.with_device_augment.unwrap().tg_ms, 26.0));

        // 50 KB per sample at 100 MB/s: 16 ms per batch of 32, above 10 ms loading and 12 ms step.
        let mut i = input(1.25, 4.0, 32, 12.0);
        i.disk = Some((50_000.0, 100e6));
        let r = evaluate(&i).unwrap();
        assert_eq!(r.binding, Binding::Disk);
        assert!(close(r.disk_per_batch_ms.unwrap(), 16.0));
        assert!(close(r.device_idle, 1.0 - 12.0 / 16.0));
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(evaluate(&input(1.0, 0.0, 32, 1.0)).is_err());
        assert!(evaluate(&input(1.0, 2.0, 0, 1.0)).is_err());
        assert!(evaluate(&input(1.0, 2.0, 8, 0.0)).is_err());
    }

    #[test]
    fn durations_with_units() {
        assert_eq!(parse_duration("28ms").unwrap(), Duration::from_millis(28));
        assert_eq!(parse_duration("30us").unwrap(), Duration::from_micros(30));
        assert_eq!(parse_duration("30µs").unwrap(), Duration::from_micros(30));
        assert_eq!(parse_duration("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("120ns").unwrap(), Duration::from_nanos(120));
        let says = |text: &str| parse_duration(text).unwrap_err().to_string();
        assert!(says("fast").contains("not a duration"));
        assert!(says("3h").contains("unknown duration unit"));
        assert!(parse_duration("-1ms").is_err());
        assert!(parse_duration("nan").is_err() && parse_duration("inf").is_err());
        for absurd in ["1e300", "99999999999999999999", "3601s"] {
            assert!(says(absurd).contains("between 0 and an hour"), "{absurd}");
        }
        assert!(says(&"9".repeat(100_000)).len() < 200);
    }
}
