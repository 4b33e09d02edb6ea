//! `fulcrum bench io`: how fast records come off disk and out of the loaders, as ratios to the
//! raw read limit measured in the same run (machines are shared and noisy; ratios travel).
//!
//! Measurements over one packed dataset, each time-bound:
//! 1. **raw**: every shard read front to back with io_uring and the dataset's `O_DIRECT` mode,
//!    one record per read, `queue_depth` reads in flight: the limit. Where io_uring is
//!    unavailable, plain sequential `pread`s of the same size.
//! 2. **io_uring** and 3. **pread**: the backends reading records into the ring in file order,
//!    the raw run's access pattern, block size and reads in flight (two threads with
//!    `queue_depth / 2` each), no verification and no augmentation: the backend alone.
//! 4. **io_uring, shuffled**: the same in epoch order, which is what training reads; the gap to
//!    (2) is the cost of random access on this storage, not of the backend.
//! 5. **loaders**: the real pipeline (`loaders` threads, checksums verified, augmentation on)
//!    with buffered reads from a warm page cache: the CPU side of `T_g`.
//!
//! (1)–(4) run interleaved in rounds, so that drift in shared storage hits them alike.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::base::HostMemory;
use crate::io::{self, DirectMode, IoKind, UringOptions};
use crate::loader::{self, AugmentConfig, Dataset, Loader, LoaderConfig};

/// Threads reading in the backend runs.
const BACKEND_THREADS: usize = 2;
/// Interleaved rounds of the read measurements.
const ROUNDS: u32 = 3;

/// Adds one round's figures to a running total.
fn add(total: &mut Throughput, round: Throughput) {
    let (records, bytes) = (total.records + round.records, total.bytes + round.bytes);
    *total = Throughput::new(
        records,
        bytes,
        Duration::from_secs_f64(total.seconds + round.seconds),
    );
}

#[derive(Debug, Clone)]
pub struct IoBenchConfig {
    pub data: PathBuf,
    pub batch: usize,
    pub loaders: usize,
    pub ring_slots: usize,
    pub queue_depth: u32,
    /// Wall time per measurement.
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Throughput {
    pub records: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub records_per_s: f64,
}

impl Throughput {
    pub fn new(records: u64, bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Throughput {
            records,
            bytes,
            seconds,
            mb_per_s: bytes as f64 / seconds / 1e6,
            records_per_s: records as f64 / seconds,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct IoBenchReport {
    pub data: String,
    pub records_in_dataset: u64,
    pub record_bytes: usize,
    pub queue_depth: u32,
    pub batch: usize,
    pub loaders: usize,
    /// Whether the raw and backend runs used O_DIRECT (false where the filesystem refuses it).
    pub direct: bool,
    pub raw: Throughput,
    /// How the raw limit was read: "io_uring", or "pread" where io_uring is unavailable.
    pub raw_method: &'static str,
    /// `None` where io_uring is unavailable (the reason is in `uring_unavailable`).
    pub uring: Option<Throughput>,
    pub uring_shuffled: Option<Throughput>,
    pub uring_unavailable: Option<String>,
    pub pread: Throughput,
    pub loaders_augment: Throughput,
    /// Loader CPU time per record with augmentation (`T_g`), microseconds.
    pub loader_cpu_us_per_record: f64,
    pub uring_vs_raw: Option<f64>,
    pub pread_vs_raw: f64,
}

pub fn bench_io(config: &IoBenchConfig, say: &dyn Fn(&str)) -> loader::Result<IoBenchReport> {
    let per = Duration::from_secs_f64(config.seconds);
    let dataset = Dataset::open(&config.data, DirectMode::Auto)?;
    let rs = dataset.layout.record_size;
    let qd = config.queue_depth.max(1);

    let per_thread = qd.div_ceil(BACKEND_THREADS as u32);
    let backend_config = |io, shuffle| LoaderConfig {
        batch: config.batch.max(qd as usize),
        ring_slots: config.ring_slots,
        loaders: BACKEND_THREADS,
        part_records: per_thread as usize,
        epochs: u64::MAX / (dataset.records() + 1),
        shuffle,
        augment: AugmentConfig::off(),
        verify: false,
        io,
        uring: UringOptions {
            queue_depth: per_thread,
            sqpoll: false,
        },
        ..LoaderConfig::default()
    };
    let uring_unavailable = io::probe_uring().err().map(|e| e.to_string());
    let slice = per / ROUNDS;
    let (mut raw, mut uring, mut pread, mut shuffled) = Default::default();
    for round in 1..=ROUNDS {
        say(&format!("round {round}/{ROUNDS}: raw sequential read, io_uring and pread backends into the ring"));
        add(
            &mut raw,
            raw_read(&dataset, qd, slice, uring_unavailable.is_none())?,
        );
        if uring_unavailable.is_none() {
            add(
                &mut uring,
                run_loader(&dataset, &backend_config(IoKind::Uring, false), slice)?.0,
            );
            add(
                &mut shuffled,
                run_loader(&dataset, &backend_config(IoKind::Uring, true), slice)?.0,
            );
        }
        add(
            &mut pread,
            run_loader(&dataset, &backend_config(IoKind::Pread, false), slice)?.0,
        );
    }
    let uring = uring_unavailable.is_none().then_some(uring);
    let uring_shuffled = uring_unavailable.is_none().then_some(shuffled);

    say("loaders with augmentation (buffered reads, warm page cache)");
    let buffered = Dataset::open(&config.data, DirectMode::Off)?;
    let loaders_config = LoaderConfig {
        batch: config.batch,
        ring_slots: config.ring_slots,
        loaders: config.loaders,
        epochs: u64::MAX / (dataset.records() + 1),
        uring: UringOptions {
            queue_depth: qd,
            sqpoll: false,
        },
        ..LoaderConfig::default()
    };
    // One untimed pass warms the page cache.
    run_loader(
        &buffered,
        &loaders_config,
        Duration::from_secs_f64(config.seconds.min(1.0)),
    )?;
    let (loaders_augment, cpu) = run_loader(&buffered, &loaders_config, per)?;

    Ok(IoBenchReport {
        data: config.data.display().to_string(),
        records_in_dataset: dataset.records(),
        record_bytes: rs,
        queue_depth: qd,
        batch: config.batch,
        loaders: config.loaders,
        direct: dataset.files.is_direct(),
        uring_vs_raw: uring.map(|u| u.mb_per_s / raw.mb_per_s),
        pread_vs_raw: pread.mb_per_s / raw.mb_per_s,
        raw_method: if uring.is_some() { "io_uring" } else { "pread" },
        raw,
        uring,
        uring_shuffled,
        uring_unavailable,
        pread,
        loaders_augment,
        loader_cpu_us_per_record: cpu.as_secs_f64() * 1e6 / loaders_augment.records.max(1) as f64,
    })
}

fn raw_read(dataset: &Dataset, qd: u32, per: Duration, uring: bool) -> loader::Result<Throughput> {
    let rs = dataset.layout.record_size;
    let mut scratch = HostMemory::zeroed(rs * qd as usize).ok_or(crate::ring::Error::Alloc {
        bytes: rs * qd as usize,
    })?;
    let started = Instant::now();
    let mut bytes = 0;
    while started.elapsed() < per {
        bytes += match uring {
            true => io::raw_sequential_read(&dataset.files, rs, qd, scratch.as_mut_slice())?,
            false => io::raw_sequential_pread(&dataset.files, rs, scratch.as_mut_slice())?,
        };
    }
    // Shard headers are read too; at one page per shard they do not move the record count.
    Ok(Throughput::new(bytes / rs as u64, bytes, started.elapsed()))
}

/// Runs the loader for `per` and returns its delivered throughput and loader CPU time.
fn run_loader(
    dataset: &Dataset,
    config: &LoaderConfig,
    per: Duration,
) -> loader::Result<(Throughput, Duration)> {
    let mut loader = Loader::start(dataset, config)?;
    let rs = dataset.layout.record_size as u64;
    // The first batch pays for thread start and ring setup: time from after it.
    drop(loader.next_batch()?);
    let before = loader.counters();
    let started = Instant::now();
    let mut records = 0u64;
    while started.elapsed() < per {
        match loader.next_batch()? {
            Some(batch) => records += batch.len() as u64,
            None => break,
        }
    }
    let elapsed = started.elapsed();
    let cpu = loader
        .counters()
        .loaders
        .cpu
        .saturating_sub(before.loaders.cpu);
    Ok((Throughput::new(records, records * rs, elapsed), cpu))
}

/// The default bench dataset of `records` synthetic images, packed on first use (saying so
/// through `say`) and reused after.
pub fn ensure_bench_data(records: u64, say: &dyn Fn(&str)) -> crate::pack::Result<PathBuf> {
    ensure_bench_data_sized(records, DEFAULT_BENCH_SIZE, say)
}

/// The pixel side of the default bench dataset's records (det-s's input).
pub const DEFAULT_BENCH_SIZE: u32 = 128;

/// [`ensure_bench_data`] with records of `size` × `size` pixels (a larger model's input).
pub fn ensure_bench_data_sized(
    records: u64,
    size: u32,
    say: &dyn Fn(&str),
) -> crate::pack::Result<PathBuf> {
    use crate::pack::{pack, PackOptions, Source};
    let dir = default_bench_data_sized(records, size);
    if !dir.join(crate::format::MANIFEST_FILE).exists() {
        say(&format!(
            "packing {records} synthetic records into {} (once)",
            dir.display()
        ));
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| crate::pack::Error::Io {
                path: parent.to_owned(),
                source: e,
            })?;
        }
        let options = PackOptions {
            force: true,
            size,
            ..PackOptions::new(
                Source::Synthetic {
                    count: records,
                    seed: 1,
                },
                &dir,
            )
        };
        pack(&options, &|_, _| {})?;
    }
    Ok(dir)
}

/// Where the default bench dataset lives: under the user's cache directory.
pub fn default_bench_data(records: u64) -> PathBuf {
    default_bench_data_sized(records, DEFAULT_BENCH_SIZE)
}

/// [`default_bench_data`] for records of `size` pixels (the default size keeps its old name).
pub fn default_bench_data_sized(records: u64, size: u32) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("fulcrum").join(if size == DEFAULT_BENCH_SIZE {
        format!("bench-synthetic-{records}")
    } else {
        format!("bench-synthetic-{records}-{size}px")
    })
}
