//! A fixed-capacity event log of the input pipeline, exported as Chrome trace JSON.
//!
//! Capacity is fixed when the log is made; recording claims a slot with one atomic increment
//! and writes four atomics, so it allocates nothing and never blocks a loader. Events past the
//! capacity are counted and dropped, not recorded: a long run keeps its beginning. The JSON
//! opens in Perfetto (ui.perfetto.dev) or chrome://tracing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::time::Instant;

/// What a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A loader waited for a free ring slot.
    SlotWait = 1,
    /// A loader read, verified and augmented one unit (part of a batch).
    Load = 2,
    /// The consumer waited for the next batch.
    ConsumerWait = 3,
    /// The consumer held a batch (in training: copying it into the step's input).
    Consume = 4,
    /// The training step on the device (recorded by the trainer).
    Step = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::SlotWait,
            2 => Kind::Load,
            3 => Kind::ConsumerWait,
            4 => Kind::Consume,
            5 => Kind::Step,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::SlotWait => "wait for slot",
            Kind::Load => "load",
            Kind::ConsumerWait => "wait for batch",
            Kind::Consume => "take batch",
            Kind::Step => "device step",
        }
    }
}

/// One recorded span. `row` is the loader index, or [`CONSUMER_ROW`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub row: u16,
    pub batch: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The row of the consumer's events.
pub const CONSUMER_ROW: u16 = u16::MAX;

struct Slot {
    /// `kind << 16 | row`, written last; 0 while the slot is not yet complete.
    head: AtomicU64,
    batch: AtomicU64,
    start: AtomicU64,
    end: AtomicU64,
}

impl std::fmt::Debug for TraceLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TraceLog({} of {} events)",
            self.next.load(Relaxed).min(self.slots.len()),
            self.slots.len()
        )
    }
}

pub struct TraceLog {
    origin: Instant,
    slots: Box<[Slot]>,
    next: AtomicUsize,
}

impl TraceLog {
    /// A log of `capacity` events (32 bytes each), allocated now.
    pub fn new(capacity: usize) -> Self {
        let slots = (0..capacity)
            .map(|_| Slot {
                head: AtomicU64::new(0),
                batch: AtomicU64::new(0),
                start: AtomicU64::new(0),
                end: AtomicU64::new(0),
            })
            .collect();
        TraceLog {
            origin: Instant::now(),
            slots,
            next: AtomicUsize::new(0),
        }
    }

    pub fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }

    /// Nanoseconds since the log was made: the time base of every event.
    pub fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    pub fn at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Records a span; dropped (and counted) once the log is full.
    pub fn record(&self, kind: Kind, row: u16, batch: u64, start_ns: u64, end_ns: u64) {
        let i = self.next.fetch_add(1, Relaxed);
        let Some(slot) = self.slots.get(i) else {
            return;
        };
        slot.batch.store(batch, Relaxed);
        slot.start.store(start_ns, Relaxed);
        slot.end.store(end_ns.max(start_ns), Relaxed);
        slot.head.store((kind as u64) << 16 | row as u64, Release);
    }

    /// Events that did not fit.
    pub fn dropped(&self) -> usize {
        self.next.load(Relaxed).saturating_sub(self.slots.len())
    }

    /// The recorded events, in start order.
    pub fn events(&self) -> Vec<Event> {
        let n = self.next.load(Acquire).min(self.slots.len());
        let mut events: Vec<Event> = self.slots[..n]
            .iter()
            .filter_map(|s| {
                let head = s.head.load(Acquire);
                Some(Event {
                    kind: Kind::from_u8((head >> 16) as u8)?,
                    row: head as u16,
                    batch: s.batch.load(Relaxed),
                    start_ns: s.start.load(Relaxed),
                    end_ns: s.end.load(Relaxed),
                })
            })
            .collect();
        events.sort_by_key(|e| (e.start_ns, e.row));
        events
    }

    /// Chrome trace JSON ("X" complete events in microseconds, one thread per row).
    pub fn to_chrome_json(&self) -> String {
        use serde_json::json;
        let events = self.events();
        let mut rows: Vec<u16> = events.iter().map(|e| e.row).collect();
        rows.sort_unstable();
        rows.dedup();
        let mut out =
            vec![json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "fulcrum"}})];
        for (k, &row) in rows.iter().enumerate() {
            let name = if row == CONSUMER_ROW {
                "consumer".to_owned()
            } else {
                format!("loader {row}")
            };
            out.push(json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": row, "args": {"name": name}}));
            out.push(json!({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": row, "args": {"sort_index": k}}));
        }
        out.extend(events.iter().map(|e| {
            json!({
                "name": e.kind.name(), "cat": "pipeline", "ph": "X", "pid": 1, "tid": e.row,
                "ts": e.start_ns as f64 / 1e3, "dur": (e.end_ns - e.start_ns) as f64 / 1e3,
                "args": {"batch": e.batch},
            })
        }));
        let doc = json!({"displayTimeUnit": "ms", "traceEvents": out, "otherData": {"dropped_events": self.dropped()}});
        doc.to_string() + "\n"
    }
}

impl TraceLog {
    /// The recorded events as the simulator's timeline (see [`crate::balance::timeline`]), so
    /// a measured run and its simulation draw the same way: one row per loader (its load
    /// units), the ready queue (a batch counts from the end of its last load until the
    /// consumer stops waiting for it) and the consumer (device steps busy, waits stalled).
    pub fn to_timeline(&self, title: &str, ring_slots: u32) -> crate::balance::timeline::Timeline {
        use crate::balance::timeline::{
            ConsumerSpan, ConsumerState, LoaderRow, QueueSeries, Span, Timeline,
        };
        use std::collections::BTreeMap;
        let events = self.events();
        let origin = events.iter().map(|e| e.start_ns).min().unwrap_or(0);
        let sec = |ns: u64| (ns - origin) as f64 / 1e9;
        let mut loaders: BTreeMap<u16, Vec<Span>> = BTreeMap::new();
        let mut ready: BTreeMap<u64, u64> = BTreeMap::new();
        let mut consumer = Vec::new();
        let mut queue_changes: Vec<(u64, i32)> = Vec::new();
        for e in &events {
            match e.kind {
                Kind::Load => {
                    loaders.entry(e.row).or_default().push(Span {
                        start: sec(e.start_ns),
                        end: sec(e.end_ns),
                        batch: e.batch,
                    });
                    let r = ready.entry(e.batch).or_default();
                    *r = (*r).max(e.end_ns);
                }
                Kind::ConsumerWait => {
                    consumer.push(ConsumerSpan {
                        start: sec(e.start_ns),
                        end: sec(e.end_ns),
                        state: ConsumerState::Stall,
                    });
                    queue_changes.push((e.end_ns, -1));
                }
                Kind::Step => consumer.push(ConsumerSpan {
                    start: sec(e.start_ns),
                    end: sec(e.end_ns),
                    state: ConsumerState::Busy {
                        batch: e.batch,
                        loader: None,
                    },
                }),
                Kind::SlotWait | Kind::Consume => {}
            }
        }
        queue_changes.extend(ready.values().map(|&t| (t, 1)));
        queue_changes.sort();
        let mut level = 0i32;
        let mut steps = vec![(0.0, 0)];
        for (t, d) in queue_changes {
            level = (level + d).max(0);
            steps.push((sec(t.max(origin)), level as u32));
        }
        let end = events.iter().map(|e| sec(e.end_ns)).fold(0.0, f64::max);
        let stalled: f64 = consumer
            .iter()
            .filter(|c| c.state == ConsumerState::Stall)
            .map(|c| c.end - c.start)
            .sum();
        Timeline {
            title: title.to_owned(),
            notes: vec![format!(
                "measured: {} events over {:.2} s; consumer waited {:.1} % of it{}",
                events.len(),
                end,
                100.0 * stalled / end.max(1e-9),
                if self.dropped() > 0 {
                    format!(
                        "; {} events past the log's capacity dropped",
                        self.dropped()
                    )
                } else {
                    String::new()
                }
            )],
            end,
            loaders: loaders
                .into_iter()
                .map(|(row, spans)| LoaderRow {
                    label: format!("loader {row}"),
                    spans,
                })
                .collect(),
            queue: QueueSeries {
                label: "ready batches".to_owned(),
                capacity: Some(ring_slots),
                steps,
            },
            consumer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_across_threads_and_drops_past_capacity() {
        let log = std::sync::Arc::new(TraceLog::new(100));
        let threads: Vec<_> = (0..4u16)
            .map(|row| {
                let log = log.clone();
                std::thread::spawn(move || {
                    for b in 0..30 {
                        log.record(Kind::Load, row, b, b * 10, b * 10 + 5);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let events = log.events();
        assert_eq!(events.len(), 100);
        assert_eq!(log.dropped(), 20);
        assert!(events.windows(2).all(|w| w[0].start_ns <= w[1].start_ns));
        assert!(events
            .iter()
            .all(|e| e.kind == Kind::Load && e.end_ns == e.start_ns + 5 && e.row < 4));
    }

    #[test]
    fn chrome_json_parses_and_holds_the_events() {
        let log = TraceLog::new(8);
        log.record(Kind::Load, 0, 7, 1_000, 251_000);
        log.record(Kind::ConsumerWait, CONSUMER_ROW, 7, 0, 251_500);
        log.record(Kind::Consume, CONSUMER_ROW, 7, 251_500, 300_000);
        let doc: serde_json::Value =
            serde_json::from_str(&log.to_chrome_json()).expect("valid JSON");
        let events = doc["traceEvents"].as_array().unwrap();
        let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 3);
        let load = spans.iter().find(|e| e["name"] == "load").unwrap();
        assert_eq!(
            (
                load["ts"].as_f64(),
                load["dur"].as_f64(),
                load["args"]["batch"].as_u64()
            ),
            (Some(1.0), Some(250.0), Some(7))
        );
        let names: Vec<_> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["loader 0", "consumer"]);
        assert_eq!(doc["otherData"]["dropped_events"], 0);
    }
}
