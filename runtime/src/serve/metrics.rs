//! `fulcrumd --metrics FILE`: the daemon's counters in Prometheus' text exposition format,
//! written to a file for node_exporter's textfile collector (a robot has no network listener
//! to scrape). The file is replaced whole by a rename, so a reader never sees half of it.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `fulcrumd_up_seconds` | gauge | seconds since the daemon started |
//! | `fulcrumd_requests_total` | counter | frames answered with detections |
//! | `fulcrumd_errors_total{kind}` | counter | error replies, by the protocol's error kind |
//! | `fulcrumd_refused_total` | counter | connections refused (not allowed, or no slot) |
//! | `fulcrumd_hello_timeouts_total` | counter | connections closed for sending no Hello in time |
//! | `fulcrumd_evicted_total` | counter | silent connections closed to make room for another |
//! | `fulcrumd_reload_failures_total` | counter | reloads and fine-tuned swaps refused |
//! | `fulcrumd_clients` | gauge | connections now |
//! | `fulcrumd_weights_generation` | gauge | bumped by every reload or swap |
//! | `fulcrumd_request_seconds` | histogram | arrival to reply, per frame |
//! | `fulcrumd_frame_pass_seconds` | histogram | the frame's conversion into the model's input |
//! | `fulcrumd_forward_seconds` | histogram | the engine's time per frame |
//! | `fulcrumd_memory_planned_bytes` | gauge | everything planned up front |
//! | `fulcrumd_memory_resident_bytes` | gauge | resident memory now, as the kernel counts it |
//! | `fulcrumd_fine_tune_state` | gauge | 0 idle, 1 running, 2 stopping, 3 finished, 4 failed |
//! | `fulcrumd_fine_tune_step` / `_total_steps` | gauge | the fine-tune's progress |
//! | `fulcrumd_fine_tune_loss` | gauge | its last training loss |
//! | `fulcrumd_fine_tune_map{weights}` | gauge | held-out mAP@0.5 of the `serving` and `candidate` weights |
//!
//! Histogram buckets are the latency histogram's own (within 12.5 % of each `le`): a value
//! is counted under the first `le` at or above its bucket's upper edge.

use std::fmt::Write as _;
use std::path::Path;

use fulcrum_board::protocol::{ErrorCode, FineTuneStatus};

use super::stats::LatencyHistogram;

/// Error codes counted apart; higher ones are counted as the last.
pub const ERROR_KINDS: usize = 16;

/// `le` edges of the histograms, seconds.
const EDGES_S: [f64; 13] = [
    0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// What one exposition shows.
pub struct Snapshot<'a> {
    pub uptime_s: f64,
    pub requests: u64,
    pub errors_by_code: &'a [u64; ERROR_KINDS],
    pub refused: u64,
    pub hello_timeouts: u64,
    pub evicted: u64,
    pub reload_failures: u64,
    pub clients: usize,
    pub weights_generation: u32,
    pub latency: &'a LatencyHistogram,
    pub frame_pass: &'a LatencyHistogram,
    pub forward: &'a LatencyHistogram,
    pub planned_bytes: u64,
    pub resident_bytes: Option<u64>,
    pub fine_tune: Option<FineTuneStatus>,
}

/// The index an error code is counted under.
pub fn error_slot(code: ErrorCode) -> usize {
    usize::from(code.0).min(ERROR_KINDS - 1)
}

/// Writes `s` in the text exposition format into `out` (cleared first).
pub fn render(out: &mut String, s: &Snapshot<'_>) {
    out.clear();
    gauge(
        out,
        "fulcrumd_up_seconds",
        "Seconds since the daemon started.",
        s.uptime_s,
    );
    counter(
        out,
        "fulcrumd_requests_total",
        "Frames answered with detections.",
        s.requests,
    );
    let _ = writeln!(
        out,
        "# HELP fulcrumd_errors_total Error replies, by kind.\n# TYPE fulcrumd_errors_total counter"
    );
    for (code, &n) in s.errors_by_code.iter().enumerate() {
        if n > 0 {
            let kind = ErrorCode(code as u16).name().replace(' ', "_");
            let _ = writeln!(out, "fulcrumd_errors_total{{kind=\"{kind}\"}} {n}");
        }
    }
    counter(
        out,
        "fulcrumd_refused_total",
        "Connections refused (not allowed, or no slot).",
        s.refused,
    );
    counter(
        out,
        "fulcrumd_hello_timeouts_total",
        "Connections closed for sending no Hello in time.",
        s.hello_timeouts,
    );
    counter(
        out,
        "fulcrumd_evicted_total",
        "Connections without a Hello closed to make room for another.",
        s.evicted,
    );
    counter(
        out,
        "fulcrumd_reload_failures_total",
        "Reloads and fine-tuned swaps refused.",
        s.reload_failures,
    );
    gauge(
        out,
        "fulcrumd_clients",
        "Connections now.",
        s.clients as f64,
    );
    gauge(
        out,
        "fulcrumd_weights_generation",
        "Bumped by every reload or swap.",
        f64::from(s.weights_generation),
    );
    histogram(
        out,
        "fulcrumd_request_seconds",
        "Arrival to reply, per frame.",
        s.latency,
    );
    histogram(
        out,
        "fulcrumd_frame_pass_seconds",
        "The frame's conversion into the model's input.",
        s.frame_pass,
    );
    histogram(
        out,
        "fulcrumd_forward_seconds",
        "The engine's time per frame.",
        s.forward,
    );
    gauge(
        out,
        "fulcrumd_memory_planned_bytes",
        "Memory planned up front.",
        s.planned_bytes as f64,
    );
    if let Some(rss) = s.resident_bytes {
        gauge(
            out,
            "fulcrumd_memory_resident_bytes",
            "Resident memory now.",
            rss as f64,
        );
    }
    if let Some(f) = &s.fine_tune {
        gauge(
            out,
            "fulcrumd_fine_tune_state",
            "0 idle, 1 running, 2 stopping, 3 finished, 4 failed.",
            f64::from(f.state as u8),
        );
        gauge(
            out,
            "fulcrumd_fine_tune_step",
            "Steps taken.",
            f64::from(f.step),
        );
        gauge(
            out,
            "fulcrumd_fine_tune_total_steps",
            "Steps planned.",
            f64::from(f.total_steps),
        );
        gauge(
            out,
            "fulcrumd_fine_tune_loss",
            "Last training loss.",
            f64::from(f.loss),
        );
        let _ = writeln!(
            out,
            "# HELP fulcrumd_fine_tune_map Held-out mAP@0.5.\n# TYPE fulcrumd_fine_tune_map gauge\n\
             fulcrumd_fine_tune_map{{weights=\"serving\"}} {}\n\
             fulcrumd_fine_tune_map{{weights=\"candidate\"}} {}",
            f.serving_map, f.candidate_map
        );
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
    );
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn histogram(out: &mut String, name: &str, help: &str, h: &LatencyHistogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for edge in EDGES_S {
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{edge}\"}} {}",
            h.count_at_most((edge * 1e6) as u64)
        );
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count());
    let _ = writeln!(out, "{name}_sum {}", h.sum_us() as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {}", h.count());
}

/// Replaces `path` with `text`: written beside it, then renamed over it. Not synced: metrics
/// are worth nothing after a power cut, and an fsync could stall the serving loop.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_has_every_metric_with_its_type() {
        let mut latency = LatencyHistogram::default();
        for us in [100, 800, 3_000, 40_000] {
            latency.record(us);
        }
        let mut errors = [0; ERROR_KINDS];
        errors[error_slot(ErrorCode::BAD_FRAME)] = 3;
        errors[error_slot(ErrorCode(999))] = 1;
        let empty = LatencyHistogram::default();
        let snapshot = Snapshot {
            uptime_s: 12.5,
            requests: 4,
            errors_by_code: &errors,
            refused: 2,
            hello_timeouts: 1,
            evicted: 0,
            reload_failures: 5,
            clients: 3,
            weights_generation: 7,
            latency: &latency,
            frame_pass: &empty,
            forward: &empty,
            planned_bytes: 1 << 20,
            resident_bytes: Some(3 << 20),
            fine_tune: None,
        };
        let mut text = String::new();
        render(&mut text, &snapshot);
        for line in [
            "fulcrumd_requests_total 4",
            "fulcrumd_errors_total{kind=\"bad_frame\"} 3",
            "fulcrumd_errors_total{kind=\"unknown_error\"} 1",
            "fulcrumd_reload_failures_total 5",
            "fulcrumd_clients 3",
            "fulcrumd_weights_generation 7",
            "fulcrumd_request_seconds_bucket{le=\"0.00025\"} 1",
            "fulcrumd_request_seconds_bucket{le=\"0.001\"} 2",
            "fulcrumd_request_seconds_bucket{le=\"0.005\"} 3",
            "fulcrumd_request_seconds_bucket{le=\"0.05\"} 4",
            "fulcrumd_request_seconds_bucket{le=\"+Inf\"} 4",
            "fulcrumd_request_seconds_sum 0.0439",
            "fulcrumd_request_seconds_count 4",
            "fulcrumd_memory_resident_bytes 3145728",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("fine_tune"), "{text}");
        // Every sample's metric has a TYPE line before it.
        let mut typed = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_owned());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| typed.contains(*b)))
                    .unwrap_or(name);
                assert!(typed.contains(base), "{l} has no TYPE");
            }
        }
        // The file is replaced whole.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fulcrumd.prom");
        write(&path, &text).unwrap();
        write(&path, "fulcrumd_up_seconds 1\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "fulcrumd_up_seconds 1\n"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
