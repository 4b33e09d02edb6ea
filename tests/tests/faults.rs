//! Bad data and failing disks: every fault gives a clear error naming the file (and the record,
//! where there is one) or, with `OnCorrupt::Skip`, a counted deterministic substitute; never a
//! panic or a hang. Loader runs go through `load_all`/`with_timeout`, which fail on a hang.
//!
//! Open-time checks (header, length, manifest) do not depend on the read backend and run once
//! per `DirectMode`; everything that reads records runs on pread and, where available, io_uring.
//! io_uring being refused by the kernel is tested in `tools/tests/cli.rs` (it needs a child
//! process with `FULCRUM_FAULT_URING` set).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fulcrum::format::{self, Manifest, FLAG_SUBSTITUTE, HEADER_SIZE};
use fulcrum::io::{self, DirectMode, IoKind};
use fulcrum::loader::order::EpochOrder;
use fulcrum::loader::{self, AugmentConfig, Dataset, Loader, LoaderConfig, OnCorrupt};
use fulcrum_tests::*;

/// 64 records of 32×32 in 4 shards of 16: 8 batches of 8 per epoch, nothing dropped.
const COUNT: u64 = 64;
const PER_SHARD: u32 = 16;
const BATCH: usize = 8;

fn dataset(tmp: &Path) -> std::path::PathBuf {
    pack_synthetic_sharded(tmp, COUNT, 32, PER_SHARD)
}

/// `Dataset::open`'s error; panics if the open succeeds.
fn open_error(dir: &Path, mode: DirectMode) -> loader::Error {
    match Dataset::open(dir, mode) {
        Ok(_) => panic!("{} opened although it is broken", dir.display()),
        Err(e) => e,
    }
}

/// The shard-format error inside an open error (open wraps it in io and loader errors).
fn format_error(e: &loader::Error) -> Option<&format::Error> {
    match e {
        loader::Error::Format(f) | loader::Error::Io(io::Error::Format(f)) => Some(f),
        _ => None,
    }
}

fn truncate(path: &Path, len: u64) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open shard for truncation");
    f.set_len(len).expect("truncate");
}

/// The number after the first "record " in `msg`.
fn record_number(msg: &str) -> Option<u64> {
    let rest = &msg[msg.find("record ")? + "record ".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Rewrites the header's CRC32C (last 4 bytes of the header page) after a patch.
fn patch_header(path: &Path, at: usize, bytes: &[u8], fix_crc: bool) {
    let mut data = std::fs::read(path).expect("read shard");
    data[at..at + bytes.len()].copy_from_slice(bytes);
    if fix_crc {
        let crc = crc32c::crc32c(&data[..HEADER_SIZE - 4]);
        data[HEADER_SIZE - 4..HEADER_SIZE].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(path, data).expect("write shard");
}

#[test]
fn truncated_shard_is_refused_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    let layout = layout_of(&dir);
    let shard = shard_path(&dir, 2);
    let full = std::fs::metadata(&shard).unwrap().len();
    assert_eq!(full, record_offset(&layout, PER_SHARD as u64));

    // Cut inside the records (not on a record boundary), then inside the header itself.
    for cut in [record_offset(&layout, 5) + 100, 100] {
        truncate(&shard, cut);
        for mode in [DirectMode::Auto, DirectMode::Off] {
            let err = open_error(&dir, mode);
            let msg = err.to_string();
            match format_error(&err) {
                Some(format::Error::Truncated {
                    path,
                    actual,
                    expected,
                }) => {
                    assert_eq!(path, &shard, "{msg}");
                    assert_eq!(*actual, cut, "{msg}");
                    let want = if cut < HEADER_SIZE as u64 {
                        HEADER_SIZE as u64
                    } else {
                        full
                    };
                    assert_eq!(*expected, want, "{msg}");
                }
                _ => panic!("expected Truncated for a shard cut to {cut} bytes, got: {err:?}"),
            }
            assert!(
                msg.contains("shard-00002.fsh") && msg.contains("truncated"),
                "{msg}"
            );
        }
    }
}

#[test]
fn wrong_magic_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    let shard = shard_path(&dir, 1);
    patch_header(&shard, 0, b"NOTMAGIC", true);
    let err = open_error(&dir, DirectMode::Auto);
    let msg = err.to_string();
    assert!(
        matches!(format_error(&err), Some(format::Error::BadMagic { path }) if path == &shard),
        "{err:?}"
    );
    assert!(
        msg.contains("shard-00001.fsh") && msg.contains("magic"),
        "{msg}"
    );
}

#[test]
fn wrong_version_is_refused_naming_the_file_and_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    let shard = shard_path(&dir, 3);
    let next = format::FORMAT_VERSION + 1;
    // The CRC is made right again, so that the version check (not the CRC check) fires.
    patch_header(&shard, 8, &next.to_le_bytes(), true);
    let err = open_error(&dir, DirectMode::Auto);
    let msg = err.to_string();
    match format_error(&err) {
        Some(format::Error::BadVersion {
            path,
            found,
            expected,
        }) => {
            assert_eq!(path, &shard);
            assert_eq!((*found, *expected), (next, format::FORMAT_VERSION));
        }
        _ => panic!("expected BadVersion, got {err:?}"),
    }
    assert!(
        msg.contains("shard-00003.fsh") && msg.contains(&format!("version {next}")),
        "{msg}"
    );
}

#[test]
fn corrupt_header_checksum_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    let shard = shard_path(&dir, 0);
    // A changed record count without a fixed CRC: the header checksum catches it.
    patch_header(&shard, 20, &3u32.to_le_bytes(), false);
    let err = open_error(&dir, DirectMode::Auto);
    let msg = err.to_string();
    assert!(
        matches!(format_error(&err), Some(format::Error::BadHeader { path, .. }) if path == &shard),
        "{err:?}"
    );
    assert!(
        msg.contains("shard-00000.fsh") && msg.contains("checksum"),
        "{msg}"
    );
}

#[test]
fn manifest_that_disagrees_with_a_shard_is_a_mismatch_naming_the_shard() {
    let tmp = tempfile::tempdir().unwrap();
    // 70 records, 32 a shard: 32 + 32 + 6.
    let dir = pack_synthetic_sharded(tmp.path(), 70, 32, 32);
    let mut m = Manifest::load(&dir).unwrap();
    assert_eq!(m.shards[2].records, 6);
    // Still a valid manifest on its own, but shard 2 holds 6 records, not 5.
    m.shards[2].records = 5;
    m.records = 69;
    std::fs::write(dir.join(format::MANIFEST_FILE), m.to_json()).unwrap();
    let err = open_error(&dir, DirectMode::Auto);
    let msg = err.to_string();
    assert!(
        matches!(format_error(&err), Some(format::Error::Mismatch { path, .. }) if path == &shard_path(&dir, 2)),
        "{err:?}"
    );
    assert!(
        msg.contains("shard-00002.fsh") && msg.contains("6 records, manifest says 5"),
        "{msg}"
    );

    // A shard of another dataset (other seed) in its place: the dataset id differs.
    let other = SyntheticSpec {
        seed: 2,
        ..SyntheticSpec::new(70, 32).per_shard(32)
    }
    .pack(tmp.path());
    let dir = pack_synthetic_sharded(&tmp.path().join("again"), 70, 32, 32);
    std::fs::copy(shard_path(&other, 1), shard_path(&dir, 1)).unwrap();
    let err = open_error(&dir, DirectMode::Auto);
    let msg = err.to_string();
    assert!(
        matches!(format_error(&err), Some(format::Error::Mismatch { .. })),
        "{err:?}"
    );
    assert!(
        msg.contains("shard-00001.fsh") && msg.contains("dataset id"),
        "{msg}"
    );
}

/// Flips one byte of local record `local`'s image in shard `shard`.
fn corrupt_image(dir: &Path, shard: u32, local: u64) {
    let mut rec = read_record(dir, shard, local);
    rec[100] ^= 0x5A;
    write_record(dir, shard, local, &rec);
}

#[test]
fn checksum_mismatch_fails_naming_shard_and_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    corrupt_image(&dir, 1, 5);
    for io in backends() {
        let out = load_all(&dir, DirectMode::Auto, &test_config(io, BATCH, 1));
        let msg = out
            .error
            .unwrap_or_else(|| panic!("{io:?}: a corrupt record was delivered without error"));
        assert!(
            msg.contains("shard-00001.fsh")
                && msg.contains("record 5:")
                && msg.contains("checksum"),
            "{io:?}: {msg}"
        );
        assert!(msg.contains("--on-corrupt skip"), "says what to do: {msg}");
        assert!(
            out.batches.len() < COUNT as usize / BATCH,
            "{io:?}: run ended early"
        );
    }
}

#[test]
fn checksum_mismatch_with_skip_substitutes_counts_and_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    // 66 records: 8 batches of 8 per epoch, 2 records dropped per epoch (which ones depends on
    // the epoch's permutation), so some corrupt records may not be delivered in an epoch.
    let records = 66u64;
    let dir = pack_synthetic_sharded(tmp.path(), records, 32, PER_SHARD);
    let corrupt: BTreeSet<u64> = [0u64, 21, 63, 65].into_iter().collect();
    for &g in &corrupt {
        corrupt_image(&dir, (g / PER_SHARD as u64) as u32, g % PER_SHARD as u64);
    }
    let layout = layout_of(&dir);
    let rs = layout.record_size;
    let epochs = 3;
    let delivered_per_epoch = (records / BATCH as u64) * BATCH as u64;

    for io in backends() {
        let config = LoaderConfig {
            on_corrupt: OnCorrupt::Skip,
            augment: AugmentConfig::default(),
            ..test_config(io, BATCH, epochs)
        };
        // The corrupt records that sit in the delivered part of each epoch's order.
        let mut expected = 0;
        for epoch in 0..epochs {
            let order = EpochOrder::new(records, config.seed, epoch, true);
            expected += (0..delivered_per_epoch)
                .filter(|&i| corrupt.contains(&order.get(i)))
                .count() as u64;
        }
        assert!(expected > 0, "the test needs some corrupt record delivered");

        let a = load_all(&dir, DirectMode::Auto, &config);
        assert_eq!(a.error, None, "{io:?}");
        assert_eq!(a.batches.len() as u64, epochs * (records / BATCH as u64));
        let mut flagged = 0;
        for batch in &a.batches {
            for rec in batch.chunks_exact(rs) {
                let meta = layout.read_meta(rec);
                if meta.flags & FLAG_SUBSTITUTE != 0 {
                    flagged += 1;
                    assert!(
                        corrupt.contains(&meta.index),
                        "substitute for {}",
                        meta.index
                    );
                    assert_eq!(layout.box_count(rec), 0, "a substitute has no boxes");
                } else {
                    assert!(
                        !corrupt.contains(&meta.index),
                        "corrupt {} delivered",
                        meta.index
                    );
                }
            }
        }
        assert_eq!(a.substituted, expected, "{io:?}: substituted counter");
        assert_eq!(flagged, expected, "{io:?}: flagged records delivered");

        let b = load_all(&dir, DirectMode::Auto, &config);
        assert_eq!(b.substituted, expected);
        assert!(a.batches == b.batches, "{io:?}: two runs differ");
    }
}

#[test]
fn class_out_of_range_fails_naming_the_record_and_class() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    let layout = layout_of(&dir);
    // The first record of shard 2 with a box; its class goes out of range, its CRC is made
    // right again, so only the label check can object.
    let (local, mut rec) = (0..PER_SHARD as u64)
        .map(|i| (i, read_record(&dir, 2, i)))
        .find(|(_, r)| layout.box_count(r) > 0)
        .expect("a record with a box");
    let mut b = layout.read_box(&rec, 0);
    b.class = 7;
    layout.write_box(&mut rec, 0, &b);
    let crc = layout.checksum(&rec);
    rec[layout.image_bytes..layout.image_bytes + 4].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(layout.stored_checksum(&rec), layout.checksum(&rec));
    write_record(&dir, 2, local, &rec);

    for io in backends() {
        let out = load_all(&dir, DirectMode::Auto, &test_config(io, BATCH, 1));
        let msg = out.error.unwrap_or_else(|| panic!("{io:?}: no error"));
        assert!(
            msg.contains("shard-00002.fsh")
                && msg.contains(&format!("record {local}:"))
                && msg.contains("class 7 out of range"),
            "{io:?}: {msg}"
        );
        assert!(
            !msg.contains("checksum"),
            "only the label check fires: {msg}"
        );
    }
}

#[test]
fn shard_truncated_after_open_mid_epoch_gives_an_error_naming_file_and_record() {
    for io in backends() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dataset(tmp.path());
        let layout = layout_of(&dir);
        let shard = shard_path(&dir, 1);
        // Records 0 and 1 of shard 1 survive, record 2 is cut in half, the rest is gone.
        let cut = record_offset(&layout, 2) + layout.record_size as u64 / 2;
        let config = LoaderConfig {
            ring_slots: 2,
            ..test_config(io, BATCH, 4)
        };
        let (d, s) = (dir.clone(), shard.clone());
        let (delivered, msg) = with_timeout("truncation mid-epoch", HANG_TIMEOUT, move || {
            let dataset = Dataset::open(&d, DirectMode::Auto).expect("open");
            let mut loader = Loader::start(&dataset, &config).expect("start");
            // While batch 0 is held, at most batch 1 can be filled: everything after is read
            // from the truncated file.
            let first = loader.next_batch().expect("batch 0").expect("batch 0");
            truncate(&s, cut);
            drop(first);
            let mut delivered = 1;
            loop {
                match loader.next_batch() {
                    Ok(Some(_)) => delivered += 1,
                    Ok(None) => return (delivered, None),
                    Err(e) => return (delivered, Some(e.to_string())),
                }
            }
        });
        let msg = msg.unwrap_or_else(|| {
            panic!("{io:?}: all {delivered} batches delivered from a truncated shard")
        });
        assert!(msg.contains("shard-00001.fsh"), "{io:?}: {msg}");
        let record = record_number(&msg).unwrap_or_else(|| panic!("no record in: {msg}"));
        assert!((2..PER_SHARD as u64).contains(&record), "{io:?}: {msg}");
        assert!(delivered < 4 * COUNT as usize / BATCH, "{io:?}");
    }
}

#[test]
fn shard_truncated_to_its_header_while_loading_errors_instead_of_hanging() {
    for io in backends() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dataset(tmp.path());
        let shard = shard_path(&dir, 2);
        // Enough epochs that the run cannot end before the truncation lands.
        let config = test_config(io, BATCH, 100_000);
        let d = dir.clone();
        let msg = with_timeout("truncation while running", HANG_TIMEOUT, move || {
            let dataset = Dataset::open(&d, DirectMode::Auto).expect("open");
            let mut loader = Loader::start(&dataset, &config).expect("start");
            let mut cutter = None;
            let mut n = 0u64;
            loop {
                match loader.next_batch() {
                    Ok(Some(_)) => n += 1,
                    Ok(None) => return None,
                    Err(e) => return Some(e.to_string()),
                }
                if n == 3 {
                    // Cut the file from another thread while the loaders keep going.
                    let s = shard.clone();
                    cutter = Some(std::thread::spawn(move || truncate(&s, HEADER_SIZE as u64)));
                }
                if let Some(c) = cutter.take_if(|c| c.is_finished()) {
                    c.join().expect("truncation thread");
                }
            }
        });
        let msg = msg.unwrap_or_else(|| panic!("{io:?}: run completed on a truncated shard"));
        assert!(msg.contains("shard-00002.fsh"), "{io:?}: {msg}");
        assert!(
            record_number(&msg).is_some_and(|r| r < PER_SHARD as u64),
            "{io:?}: {msg}"
        );
    }
}

#[test]
fn shard_deleted_mid_epoch_is_still_read_to_the_end() {
    // Linux keeps an unlinked file's data for as long as a descriptor to it is open: the loader
    // opened every shard in `Dataset::open` (and io_uring registered those descriptors), so
    // deleting the files mid-epoch changes nothing for this run. A later open would fail.
    for io in backends() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dataset(tmp.path());
        let config = LoaderConfig {
            ring_slots: 2,
            ..test_config(io, BATCH, 2)
        };
        let reference = load_all(&dir, DirectMode::Auto, &config);
        assert_eq!(reference.error, None);

        let d = dir.clone();
        let removed = Arc::new(AtomicBool::new(false));
        let r = removed.clone();
        let batches = with_timeout("shard deleted mid-epoch", HANG_TIMEOUT, move || {
            let dataset = Dataset::open(&d, DirectMode::Auto).expect("open");
            let mut loader = Loader::start(&dataset, &config).expect("start");
            let mut batches = Vec::new();
            loop {
                match loader.next_batch() {
                    Ok(Some(b)) => batches.push(b.records().to_vec()),
                    Ok(None) => return Ok(batches),
                    Err(e) => return Err(e.to_string()),
                }
                if batches.len() == 1 {
                    for s in 0..(COUNT / PER_SHARD as u64) as u32 {
                        std::fs::remove_file(shard_path(&d, s)).expect("remove shard");
                    }
                    r.store(true, Ordering::Relaxed);
                }
            }
        })
        .unwrap_or_else(|e| panic!("{io:?}: reading deleted (still open) shards failed: {e}"));
        assert!(removed.load(Ordering::Relaxed));
        assert!(!shard_path(&dir, 0).exists());
        assert_eq!(
            batches.len(),
            2 * COUNT as usize / BATCH,
            "{io:?}: epoch incomplete"
        );
        assert!(batches == reference.batches, "{io:?}: data changed");
        // A fresh open now fails, naming the missing file.
        let msg = open_error(&dir, DirectMode::Auto).to_string();
        assert!(msg.contains("shard-00000.fsh"), "{msg}");
    }
}

#[test]
fn uring_kind_is_refused_cleanly_where_unavailable() {
    // Where io_uring exists this only checks that `--io uring` starts; where it does not,
    // asking for it explicitly must be an error that names io_uring, not a panic.
    let tmp = tempfile::tempdir().unwrap();
    let dir = dataset(tmp.path());
    let dataset = Dataset::open(&dir, DirectMode::Auto).unwrap();
    let available = io::probe_uring().is_ok();
    match Loader::start(&dataset, &test_config(IoKind::Uring, BATCH, 1)) {
        Ok(loader) => {
            assert!(available);
            assert_eq!(loader.backend().name(), "io_uring");
        }
        Err(e) => {
            assert!(
                !available,
                "io_uring probed fine but the loader refused it: {e}"
            );
            assert!(e.to_string().contains("io_uring"), "{e}");
        }
    }
    let loader = Loader::start(&dataset, &test_config(IoKind::Auto, BATCH, 1)).unwrap();
    let want = if available { "io_uring" } else { "pread" };
    assert_eq!(loader.backend().name(), want);
    assert_eq!(loader.fallback_note().is_some(), !available);
}
