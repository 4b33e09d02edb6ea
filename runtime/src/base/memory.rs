//! The memory budget: everything fulcrum holds is planned from the configuration, checked
//! against `--mem-budget` *before* anything is allocated, and listed item by item on request.

use serde::Serialize;

/// One planned allocation: `count` blocks of `bytes_each`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanItem {
    pub name: String,
    pub count: u64,
    pub bytes_each: u64,
}

impl PlanItem {
    pub fn bytes(&self) -> u64 {
        self.count * self.bytes_each
    }
}

/// Every allocation a configuration will make, with its size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemoryPlan {
    pub items: Vec<PlanItem>,
}

impl MemoryPlan {
    pub fn add(&mut self, name: impl Into<String>, count: u64, bytes_each: u64) {
        self.items.push(PlanItem {
            name: name.into(),
            count,
            bytes_each,
        });
    }

    pub fn total(&self) -> u64 {
        self.items.iter().map(PlanItem::bytes).sum()
    }

    pub fn fits(&self, budget: Option<u64>) -> bool {
        budget.is_none_or(|b| self.total() <= b)
    }

    /// The plan as an aligned table with a total line.
    pub fn table(&self) -> String {
        let width = self
            .items
            .iter()
            .map(|i| i.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        let mut out = String::new();
        for i in &self.items {
            let each = if i.count == 1 {
                String::new()
            } else {
                format!("{} × {}", i.count, human(i.bytes_each))
            };
            out += &format!("  {:<width$}  {:>11}  {each}\n", i.name, human(i.bytes()));
        }
        out += &format!("  {:<width$}  {:>11}\n", "total", human(self.total()));
        out
    }
}

/// `1536` → "1.5 KiB": binary units, one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Parses a size: `512k`, `64M`, `1.5G`, `64MiB` are binary (×1024); `64MB`, `1GB` decimal
/// (×1000); a bare number is bytes.
pub fn parse_size(text: &str) -> Result<u64, super::BadQuantity> {
    use super::BadQuantity;
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| BadQuantity::NotANumber {
        kind: "size",
        given: text.to_owned(),
        examples: "64M, 1.5G, 512k",
    })?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(BadQuantity::UnknownUnit {
                kind: "size",
                given: text.to_owned(),
                unit: other.to_owned(),
                units: "k, M, G (binary) or kB, MB, GB",
            })
        }
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(BadQuantity::OutOfRange {
            given: text.to_owned(),
            rule: "a size must be at least one byte",
        });
    }
    Ok(bytes as u64)
}

/// The largest `x` in `1..=max` for which `fits(x)` holds, given that `fits` is monotone
/// (true up to some point, false after). `None` if not even 1 fits.
pub fn largest_fitting(max: u64, fits: impl Fn(u64) -> bool) -> Option<u64> {
    if max == 0 || !fits(1) {
        return None;
    }
    let (mut lo, mut hi) = (1, max); // fits(lo) holds
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_totals_and_table() {
        let mut p = MemoryPlan::default();
        p.add("ring slots", 4, 32 * 53248);
        p.add("trace log", 1, 2 << 20);
        assert_eq!(p.total(), 4 * 32 * 53248 + (2 << 20));
        let t = p.table();
        assert!(
            t.contains("ring slots")
                && t.contains("4 × 1.6 MiB")
                && t.contains("total")
                && t.contains("8.5 MiB"),
            "{t}"
        );
        assert!(p.fits(None) && p.fits(Some(p.total())) && !p.fits(Some(p.total() - 1)));
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("512k").unwrap(), 512 << 10);
        assert_eq!(parse_size("64MB").unwrap(), 64_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots")
            .unwrap_err()
            .to_string()
            .contains("not a size"));
        assert!(parse_size("3T")
            .unwrap_err()
            .to_string()
            .contains("unknown size unit"));
        assert!(parse_size("0").is_err());
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64.0 MiB");
    }

    #[test]
    fn peak_resident_counts_what_was_touched() {
        let before = peak_resident().expect("Linux reports VmHWM");
        // black_box: an optimised build would drop a block nothing reads.
        let block = std::hint::black_box(vec![1u8; 32 << 20]);
        let after = peak_resident().unwrap();
        assert!(after >= before + (31 << 20), "{before} → {after}");
        drop(block);
        // The test binary's own code is a mapped file.
        let files = resident_files().expect("Linux reports RssFile");
        assert!(files > 0 && files < after, "{files} of {after}");
    }

    #[test]
    fn largest_fitting_finds_the_boundary() {
        assert_eq!(largest_fitting(100, |x| x * 3 <= 50), Some(16));
        assert_eq!(largest_fitting(100, |_| true), Some(100));
        assert_eq!(largest_fitting(100, |_| false), None);
        assert_eq!(largest_fitting(1, |x| x == 1), Some(1));
    }
}

/// This process's peak resident memory so far (`VmHWM` in `/proc/self/status`: every page
/// it has held at once, code included), in bytes; `None` where the kernel does not say. What
/// a run reports beside its [`MemoryPlan`] (the tests hold the two within 8 MiB).
pub fn peak_resident() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// This process's resident memory now (`VmRSS`), in bytes.
pub fn resident() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// This process's resident pages of mapped files now (`RssFile`: its code and libraries,
/// which no memory plan lists), in bytes.
pub fn resident_files() -> Option<u64> {
    status_bytes("RssFile:")
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line
        .trim_start_matches(field)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A limit on this process's memory set outside fulcrum, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessLimit {
    pub bytes: u64,
    pub source: &'static str,
}

/// The tightest memory limit the system puts on this process, if any: `ulimit -v`
/// (`RLIMIT_AS`) and the cgroup's `memory.max` (v2) or `memory.limit_in_bytes` (v1), which is
/// what systemd's `MemoryMax=` and container limits set. A plan over it would be killed or
/// fail mid-run, so it is refused up front instead.
pub fn process_memory_limit() -> Option<ProcessLimit> {
    let mut limits = Vec::new();
    if let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS) {
        if soft != nix::sys::resource::RLIM_INFINITY {
            limits.push(ProcessLimit {
                bytes: soft,
                source: "ulimit -v (RLIMIT_AS)",
            });
        }
    }
    if let Some(bytes) = cgroup_memory_limit() {
        limits.push(ProcessLimit {
            bytes,
            source: "the cgroup's memory limit (systemd MemoryMax=, a container's --memory)",
        });
    }
    limits.into_iter().min_by_key(|l| l.bytes)
}

fn cgroup_memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // Values from 2^60 up mean "no limit" in cgroup v1.
    let real = |v: u64| (v < 1 << 60).then_some(v);
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = if id == "0" && controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            continue;
        };
        if let Ok(v) = std::fs::read_to_string(&file) {
            if let Some(bytes) = v.trim().parse::<u64>().ok().and_then(real) {
                return Some(bytes);
            }
        }
    }
    None
}
