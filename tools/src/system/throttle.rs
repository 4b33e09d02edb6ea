//! Did the board slow itself down while it was measured? A [`Watch`] samples the CPU
//! frequency limits, the thermal zones, the cpufreq cooling devices and (on a Raspberry Pi)
//! the firmware's throttle flags in the background; its [`ThrottleReport`] says what it saw
//! and whether the figures were taken throttled.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use super::facts::{read_text, read_u64};

/// What one look at the board found.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Sample {
    /// Each CPU's current frequency limit (`scaling_max_freq`), MHz.
    pub max_mhz: Vec<(u32, u32)>,
    /// Each CPU's current frequency, MHz.
    pub cur_mhz: Vec<(u32, u32)>,
    /// Each thermal zone's type and temperature, °C.
    pub temps_c: Vec<(String, f64)>,
    /// cpufreq / processor cooling devices at a state above 0.
    pub cooling_active: Vec<String>,
    /// The Pi firmware's `get_throttled` bits.
    pub pi_throttled: Option<u32>,
}

/// Before, after and the worst in between.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThrottleReport {
    pub before: Sample,
    pub after: Sample,
    pub samples: usize,
    /// The hottest zone seen, °C.
    pub max_temp_c: Option<f64>,
    /// The lowest frequency limit seen over the one before the run (1 = never lowered).
    pub min_limit_ratio: Option<f64>,
    pub throttled: bool,
    /// Why it counts as throttled, or why that cannot be told here.
    pub notes: Vec<String>,
}

/// Reads a [`Sample`] under `root` (`/` on a board).
pub fn sample(root: &Path) -> Sample {
    let mut s = Sample::default();
    let cpus = std::fs::read_dir(root.join("sys/devices/system/cpu"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("cpu")?
                .parse::<u32>()
                .ok()
        });
    let mut cpus: Vec<u32> = cpus.collect();
    cpus.sort_unstable();
    for cpu in cpus {
        let f = |file: &str| {
            read_u64(
                root,
                &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/{file}"),
            )
        };
        if let Some(khz) = f("scaling_max_freq") {
            s.max_mhz.push((cpu, (khz / 1000) as u32));
        }
        if let Some(khz) = f("scaling_cur_freq") {
            s.cur_mhz.push((cpu, (khz / 1000) as u32));
        }
    }
    for (dir, name) in entries(root, "sys/class/thermal") {
        if name.starts_with("thermal_zone") {
            let kind = read_text(root, &format!("{dir}/type")).map(|t| t.trim().to_owned());
            if let (Some(kind), Some(milli)) = (kind, read_text(root, &format!("{dir}/temp"))) {
                if let Ok(m) = milli.trim().parse::<i64>() {
                    s.temps_c.push((kind, m as f64 / 1000.0));
                }
            }
        } else if name.starts_with("cooling_device") {
            let kind = read_text(root, &format!("{dir}/type")).unwrap_or_default();
            let kind = kind.trim();
            let cpu_cooling = kind.starts_with("cpufreq") || kind == "Processor";
            if cpu_cooling && read_u64(root, &format!("{dir}/cur_state")).is_some_and(|v| v > 0) {
                s.cooling_active.push(kind.to_owned());
            }
        }
    }
    s.pi_throttled = read_text(root, "sys/devices/platform/soc/soc:firmware/get_throttled")
        .and_then(|t| u32::from_str_radix(t.trim().trim_start_matches("0x"), 16).ok());
    s
}

/// `(path under root, file name)` of a sysfs folder's entries, sorted.
fn entries(root: &Path, dir: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(root.join(dir))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            Some((format!("{dir}/{name}"), name))
        })
        .collect();
    out.sort();
    out
}

/// The Pi firmware's "now" bits: under-voltage, frequency capped, throttled, soft temperature
/// limit.
const PI_NOW_BITS: u32 = 0xf;

/// The report of the samples `all` (first: before the run, last: after it).
pub fn report(all: &[Sample]) -> ThrottleReport {
    let before = all.first().cloned().unwrap_or_default();
    let after = all.last().cloned().unwrap_or_default();
    let mut notes = Vec::new();
    let max_temp_c = all
        .iter()
        .flat_map(|s| s.temps_c.iter().map(|t| t.1))
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
    let limit0: u32 = before.max_mhz.iter().map(|c| c.1).sum();
    let min_limit_ratio = (limit0 > 0).then(|| {
        all.iter()
            .map(|s| s.max_mhz.iter().map(|c| c.1).sum::<u32>() as f64 / limit0 as f64)
            .fold(1.0f64, f64::min)
    });
    if let Some(r) = min_limit_ratio.filter(|r| *r < 0.999) {
        notes.push(format!(
            "the CPU frequency limit dropped to {:.0} % of where it began",
            100.0 * r
        ));
    }
    if let Some(kind) = all.iter().flat_map(|s| &s.cooling_active).next() {
        notes.push(format!("the {kind} cooling device was active"));
    }
    if let Some(bits) = all
        .iter()
        .filter_map(|s| s.pi_throttled)
        .find(|b| b & PI_NOW_BITS != 0)
    {
        notes.push(format!(
            "the Pi firmware reported throttling (get_throttled {bits:#x})"
        ));
    }
    let throttled = !notes.is_empty();
    let observable = limit0 > 0 || max_temp_c.is_some() || before.pi_throttled.is_some();
    if !observable {
        notes.push(
            "no cpufreq, thermal or firmware data here: throttling cannot be told".to_owned(),
        );
    }
    ThrottleReport {
        before,
        after,
        samples: all.len(),
        max_temp_c,
        min_limit_ratio,
        throttled,
        notes,
    }
}

/// Samples the board in the background until [`Watch::finish`].
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Sample>>>,
}

impl Watch {
    /// Takes the "before" sample now and one every `every` after it (at most 10 000 kept).
    pub fn start(root: PathBuf, every: Duration) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let first = sample(&root);
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("throttle-watch".into())
            .spawn(move || {
                let mut all = vec![first];
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(every);
                    if all.len() < 10_000 {
                        all.push(sample(&root));
                    }
                }
                all
            })
            .ok();
        Watch { stop, thread }
    }

    /// Takes the "after" sample and reports.
    pub fn finish(mut self) -> ThrottleReport {
        self.stop.store(true, Ordering::Relaxed);
        let all = match self.thread.take() {
            Some(t) => {
                t.thread().unpark();
                t.join().unwrap_or_default()
            }
            None => Vec::new(),
        };
        report(&all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn board(root: &Path, limit_khz: u32, temp_milli: u32, cooling: u32) {
        for cpu in 0..2 {
            let f = format!("sys/devices/system/cpu/cpu{cpu}/cpufreq");
            write(
                root,
                &format!("{f}/scaling_max_freq"),
                &format!("{limit_khz}\n"),
            );
            write(
                root,
                &format!("{f}/scaling_cur_freq"),
                &format!("{limit_khz}\n"),
            );
        }
        write(
            root,
            "sys/class/thermal/thermal_zone0/type",
            "cpu-thermal\n",
        );
        write(
            root,
            "sys/class/thermal/thermal_zone0/temp",
            &format!("{temp_milli}\n"),
        );
        write(
            root,
            "sys/class/thermal/cooling_device0/type",
            "cpufreq-cpu0\n",
        );
        write(
            root,
            "sys/class/thermal/cooling_device0/cur_state",
            &format!("{cooling}\n"),
        );
    }

    #[test]
    fn a_cool_run_is_not_throttled() {
        let tmp = tempfile::tempdir().unwrap();
        board(tmp.path(), 2_400_000, 51_200, 0);
        let s = sample(tmp.path());
        assert_eq!(s.max_mhz, [(0, 2400), (1, 2400)]);
        assert_eq!(s.temps_c, [("cpu-thermal".to_owned(), 51.2)]);
        let r = report(&[s.clone(), s]);
        assert!(!r.throttled, "{:?}", r.notes);
        assert_eq!((r.max_temp_c, r.min_limit_ratio), (Some(51.2), Some(1.0)));
    }

    #[test]
    fn a_lowered_limit_or_an_active_cooling_device_is_throttling() {
        let tmp = tempfile::tempdir().unwrap();
        board(tmp.path(), 2_400_000, 60_000, 0);
        let before = sample(tmp.path());
        board(tmp.path(), 1_800_000, 85_000, 2);
        let during = sample(tmp.path());
        board(tmp.path(), 2_400_000, 70_000, 0);
        let r = report(&[before, during, sample(tmp.path())]);
        assert!(r.throttled);
        assert_eq!(r.min_limit_ratio, Some(0.75));
        assert_eq!(r.max_temp_c, Some(85.0));
        assert!(r.notes.iter().any(|n| n.contains("75 %")), "{:?}", r.notes);
        assert!(
            r.notes.iter().any(|n| n.contains("cpufreq-cpu0")),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn the_pi_firmware_flags_count() {
        let tmp = tempfile::tempdir().unwrap();
        board(tmp.path(), 2_400_000, 60_000, 0);
        let path = "sys/devices/platform/soc/soc:firmware/get_throttled";
        write(tmp.path(), path, "50000\n");
        let before = sample(tmp.path());
        // Bits 16.. are "since boot": not this run.
        assert!(!report(std::slice::from_ref(&before)).throttled);
        write(tmp.path(), path, "50004\n");
        assert!(report(&[before, sample(tmp.path())]).throttled);
    }

    #[test]
    fn a_machine_without_sysfs_says_it_cannot_tell() {
        let tmp = tempfile::tempdir().unwrap();
        let w = Watch::start(tmp.path().to_owned(), Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(30));
        let r = w.finish();
        assert!(r.samples >= 2, "{} samples", r.samples);
        assert!(!r.throttled);
        assert!(r.notes[0].contains("cannot be told"));
    }
}
