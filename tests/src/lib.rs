//! Helpers shared by fulcrum's end-to-end tests (the tests themselves are in `tests/`).
//!
//! - [`require_uring`] / [`backends`]: io_uring where the kernel has it; absent, the io_uring
//!   cases are skipped with a visible `SKIP:` line, unless `FULCRUM_REQUIRE_IO_URING=1`, where
//!   absence fails the test.
//! - [`pack_synthetic`] and friends: small packed datasets in a temporary directory.
//! - [`with_timeout`] and [`load_all`]: consume a loader on a watchdog thread, so that a hang
//!   fails the test instead of stalling the run.

pub mod alloc;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use fulcrum::format::{shard_file_name, Manifest, RecordLayout, HEADER_SIZE};
use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::{AugmentConfig, Dataset, Loader, LoaderConfig};
use fulcrum::pack::{self, PackOptions, Source};

/// The test data beside the checkout (`../shared/data` from the repository root).
pub const DATA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data");

/// Generous limit for one loader run in a test: hitting it means a hang, not slowness.
pub const HANG_TIMEOUT: Duration = Duration::from_secs(30);

pub fn coco128_dir() -> PathBuf {
    Path::new(DATA_DIR).join("coco128")
}

pub fn raccoon_dir() -> PathBuf {
    Path::new(DATA_DIR).join("raccoon")
}

/// Whether `FULCRUM_REQUIRE_IO_URING=1` is set (CI): then absence of io_uring is a failure.
pub fn uring_required() -> bool {
    std::env::var("FULCRUM_REQUIRE_IO_URING").is_ok_and(|v| v == "1")
}

/// Whether io_uring can be used here. When it cannot, prints `SKIP: …` and returns false, or
/// panics if `FULCRUM_REQUIRE_IO_URING=1`.
pub fn require_uring() -> bool {
    match fulcrum::io::probe_uring() {
        Ok(()) => true,
        Err(e) if uring_required() => {
            panic!("FULCRUM_REQUIRE_IO_URING=1 but io_uring is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIP: io_uring case(s) skipped: io_uring unavailable here: {e}");
            false
        }
    }
}

/// The backends to run a case on: pread always, io_uring where available.
pub fn backends() -> Vec<IoKind> {
    let mut kinds = vec![IoKind::Pread];
    if require_uring() {
        kinds.push(IoKind::Uring);
    }
    kinds
}

/// How to pack a synthetic dataset; [`SyntheticSpec::pack`] writes it.
#[derive(Debug, Clone, Copy)]
pub struct SyntheticSpec {
    pub count: u64,
    pub size: u32,
    pub seed: u64,
    pub records_per_shard: u32,
    pub threads: usize,
    pub max_boxes: u32,
}

impl SyntheticSpec {
    pub fn new(count: u64, size: u32) -> Self {
        SyntheticSpec {
            count,
            size,
            seed: 1,
            records_per_shard: 1024,
            threads: 2,
            max_boxes: 8,
        }
    }

    pub fn per_shard(self, records_per_shard: u32) -> Self {
        SyntheticSpec {
            records_per_shard,
            ..self
        }
    }

    pub fn threads(self, threads: usize) -> Self {
        SyntheticSpec { threads, ..self }
    }

    /// Packs into `out` (which must not exist yet) and returns `out`.
    pub fn pack_into(&self, out: &Path) -> PathBuf {
        let options = PackOptions {
            size: self.size,
            max_boxes: self.max_boxes,
            records_per_shard: self.records_per_shard,
            threads: self.threads,
            ..PackOptions::new(
                Source::Synthetic {
                    count: self.count,
                    seed: self.seed,
                },
                out,
            )
        };
        let report = pack::pack(&options, &|_, _| {})
            .unwrap_or_else(|e| panic!("packing {self:?} into {}: {e}", out.display()));
        assert_eq!(report.manifest.records, self.count);
        out.to_owned()
    }

    /// Packs into a new folder under `parent` and returns its path.
    pub fn pack(&self, parent: &Path) -> PathBuf {
        let name = format!(
            "synthetic-{}x{}-s{}-r{}-t{}",
            self.count, self.size, self.seed, self.records_per_shard, self.threads
        );
        self.pack_into(&parent.join(name))
    }
}

/// Packs `count` synthetic records of `size × size` (seed 1, one shard) under `dir`.
pub fn pack_synthetic(dir: &Path, count: u64, size: u32) -> PathBuf {
    SyntheticSpec::new(count, size).pack(dir)
}

/// Packs `count` synthetic records of `size × size` under `dir`, `per_shard` records a shard.
pub fn pack_synthetic_sharded(dir: &Path, count: u64, size: u32, per_shard: u32) -> PathBuf {
    SyntheticSpec::new(count, size)
        .per_shard(per_shard)
        .pack(dir)
}

/// Path of shard `index` of the dataset in `dir`.
pub fn shard_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(shard_file_name(index))
}

/// The record layout of the dataset in `dir`, from its manifest.
pub fn layout_of(dir: &Path) -> RecordLayout {
    Manifest::load(dir).expect("manifest").layout()
}

/// Byte offset of local record `local` in a shard of `layout`.
pub fn record_offset(layout: &RecordLayout, local: u64) -> u64 {
    HEADER_SIZE as u64 + local * layout.record_size as u64
}

/// Reads local record `local` of shard `shard` straight from the file.
pub fn read_record(dir: &Path, shard: u32, local: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let layout = layout_of(dir);
    let file = std::fs::File::open(shard_path(dir, shard)).expect("open shard");
    let mut buf = vec![0u8; layout.record_size];
    file.read_exact_at(&mut buf, record_offset(&layout, local))
        .expect("read record");
    buf
}

/// Overwrites local record `local` of shard `shard` in place.
pub fn write_record(dir: &Path, shard: u32, local: u64, record: &[u8]) {
    use std::os::unix::fs::FileExt;
    let layout = layout_of(dir);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(shard_path(dir, shard))
        .expect("open shard for writing");
    file.write_all_at(record, record_offset(&layout, local))
        .expect("write record");
    file.sync_all().expect("sync shard");
}

/// Runs `f` on its own thread and returns its result; panics (failing the test) if it takes
/// longer than `timeout`, which for a loader means it hung. A panic inside `f` is re-raised.
pub fn with_timeout<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("watchdog: {what}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn test thread");
    match rx.recv_timeout(timeout) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sends before it ends"),
        },
        // The thread is left behind: it is stuck, and the test fails now.
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: no result within {timeout:?}: the loader hangs")
        }
    }
}

/// A loader configuration for tests: small batches, the given backend, augmentation off.
pub fn test_config(io: IoKind, batch: usize, epochs: u64) -> LoaderConfig {
    LoaderConfig {
        batch,
        ring_slots: 3,
        loaders: 2,
        epochs,
        seed: 7,
        io,
        augment: AugmentConfig::off(),
        ..LoaderConfig::default()
    }
}

/// What [`load_all`] saw.
#[derive(Debug, Default)]
pub struct LoadOutcome {
    /// Every delivered batch's bytes, in order.
    pub batches: Vec<Vec<u8>>,
    /// The error that ended the run early, if any (its `Display`).
    pub error: Option<String>,
    /// Corrupt records replaced by substitutes.
    pub substituted: u64,
    /// The backend that ran ("io_uring" or "pread").
    pub backend: &'static str,
}

/// Opens `dir` and consumes every batch `config` delivers, on a watchdog thread (a hang fails
/// the test). An error of `Dataset::open` or `Loader::start` panics; one of `next_batch` is
/// returned in [`LoadOutcome::error`].
pub fn load_all(dir: &Path, direct: DirectMode, config: &LoaderConfig) -> LoadOutcome {
    let dir = dir.to_owned();
    let config = config.clone();
    let what = format!("loading {} with {:?}", dir.display(), config.io);
    with_timeout(&what, HANG_TIMEOUT, move || {
        let dataset = Dataset::open(&dir, direct)
            .unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()));
        let mut loader = Loader::start(&dataset, &config)
            .unwrap_or_else(|e| panic!("starting a loader on {}: {e}", dir.display()));
        let mut outcome = LoadOutcome {
            backend: loader.backend().name(),
            ..LoadOutcome::default()
        };
        loop {
            match loader.next_batch() {
                Ok(Some(batch)) => outcome.batches.push(batch.records().to_vec()),
                Ok(None) => break,
                Err(e) => {
                    outcome.error = Some(e.to_string());
                    break;
                }
            }
        }
        outcome.substituted = loader.counters().substituted;
        outcome
    })
}

/// Every file of a folder (name → bytes), sorted by name, for byte-for-byte comparisons.
pub fn read_dir_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let entry = entry.expect("dir entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(entry.path()).expect("read file");
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

/// Asserts two packed datasets are byte-identical, file by file, naming the first difference.
pub fn assert_same_files(a: &Path, b: &Path) {
    let (fa, fb) = (read_dir_files(a), read_dir_files(b));
    let names = |f: &[(String, Vec<u8>)]| f.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&fa), names(&fb), "file lists differ");
    for ((name, x), (_, y)) in fa.iter().zip(&fb) {
        if x != y {
            let at = x.iter().zip(y).position(|(p, q)| p != q);
            panic!(
                "{name} differs between {} and {} ({} vs {} bytes, first difference at {at:?})",
                a.display(),
                b.display(),
                x.len(),
                y.len()
            );
        }
    }
}

/// A short det-s training for the trainer's tests: batch 8, `epochs` epochs, lr 1e-2 with 5
/// warm-up steps, one loader, a ring of 2, from `data` into `out`.
pub fn small_training(data: &Path, out: &Path, epochs: u64) -> fulcrum::train::TrainConfig {
    fulcrum::train::TrainConfig {
        data: data.to_path_buf(),
        batch: 8,
        epochs,
        lr: 1e-2,
        warmup: 5,
        loaders: 1,
        ring: 2,
        out: out.to_path_buf(),
        ..Default::default()
    }
}
