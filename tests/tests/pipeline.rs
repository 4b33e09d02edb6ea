//! Pack → io → ring → loaders, end to end: determinism, exactly-once delivery, backend
//! equivalence, the `O_DIRECT` fallback, reproducible packing, and the real test datasets.

use std::collections::BTreeSet;
use std::path::Path;

use fulcrum::format::{Manifest, RecordLayout};
use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::order::EpochOrder;
use fulcrum::loader::{AugmentConfig, Dataset, LoaderConfig};
use fulcrum::pack::{self, PackOptions, Source};
use fulcrum_tests::*;

/// Global record index of every record of every batch, in delivery order.
fn indices(layout: &RecordLayout, batches: &[Vec<u8>]) -> Vec<u64> {
    batches
        .iter()
        .flat_map(|b| b.chunks_exact(layout.record_size))
        .map(|r| layout.read_meta(r).index)
        .collect()
}

fn augmented(io: IoKind, batch: usize, epochs: u64) -> LoaderConfig {
    LoaderConfig {
        augment: AugmentConfig::default(),
        ..test_config(io, batch, epochs)
    }
}

#[test]
fn same_seed_gives_identical_batches_whatever_the_threads_and_ring_depth() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic_sharded(tmp.path(), 100, 32, 40);
    let layout = layout_of(&dir);
    for io in backends() {
        let base = augmented(io, 8, 2);
        let reference = load_all(&dir, DirectMode::Auto, &base);
        assert_eq!(reference.error, None, "{io:?}");
        assert_eq!(reference.batches.len(), 2 * (100 / 8));
        let variants = [
            (1, 1, 0),
            (3, 5, 0),
            (3, 1, 1),
            (2, 5, 3),
            (2, 3, 0), // the reference configuration again
        ];
        for (loaders, ring_slots, part_records) in variants {
            let config = LoaderConfig {
                loaders,
                ring_slots,
                part_records,
                ..base.clone()
            };
            let run = load_all(&dir, DirectMode::Auto, &config);
            assert_eq!(run.error, None);
            assert!(
                run.batches == reference.batches,
                "{io:?}: loaders {loaders}, ring {ring_slots}, part {part_records}: batches differ"
            );
        }

        let other_seed = load_all(
            &dir,
            DirectMode::Auto,
            &LoaderConfig {
                seed: base.seed + 1,
                ..base.clone()
            },
        );
        assert_eq!(other_seed.error, None);
        assert_ne!(
            indices(&layout, &other_seed.batches),
            indices(&layout, &reference.batches),
            "{io:?}: another seed gives the same order"
        );
    }
}

#[test]
fn mosaics_are_identical_whatever_the_threads_and_units_of_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic_sharded(tmp.path(), 60, 32, 40);
    let layout = layout_of(&dir);
    let io = backends()[0];
    // A batch of 10: two whole groups of four and a group of two.
    let mosaics = LoaderConfig {
        augment: AugmentConfig {
            mosaic_prob: 0.75,
            ..AugmentConfig::default()
        },
        ..test_config(io, 10, 2)
    };
    let reference = load_all(&dir, DirectMode::Auto, &mosaics);
    assert_eq!(reference.error, None);
    for (loaders, part_records) in [(1, 0), (3, 1), (2, 3), (4, 5), (2, 10)] {
        let config = LoaderConfig {
            loaders,
            part_records,
            ..mosaics.clone()
        };
        let part = config.part_records();
        assert!(
            part.is_multiple_of(4) || part == 10,
            "part {part_records} became {part}"
        );
        let run = load_all(&dir, DirectMode::Auto, &config);
        assert_eq!(run.error, None);
        assert!(
            run.batches == reference.batches,
            "loaders {loaders}, part {part_records}: batches differ"
        );
    }
    // The mosaics changed records (same order, other bytes), and their boxes are valid.
    let plain = load_all(&dir, DirectMode::Auto, &augmented(io, 10, 2));
    assert_eq!(
        indices(&layout, &plain.batches),
        indices(&layout, &reference.batches)
    );
    let records = |batches: &[Vec<u8>]| -> Vec<Vec<u8>> {
        batches
            .iter()
            .flat_map(|b| {
                b.chunks_exact(layout.record_size)
                    .map(<[u8]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (with, without) = (records(&reference.batches), records(&plain.batches));
    let changed = with.iter().zip(&without).filter(|(a, b)| a != b).count();
    assert!(
        changed > with.len() / 2,
        "{changed} of {} records differ",
        with.len()
    );
    let classes = Dataset::open(&dir, DirectMode::Auto)
        .unwrap()
        .manifest
        .num_classes();
    for r in &with {
        layout
            .check_boxes(r, classes)
            .expect("a mosaic's boxes are valid");
    }
}

#[test]
fn a_resumed_run_delivers_exactly_the_rest_of_the_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic_sharded(tmp.path(), 100, 32, 40);
    for io in backends() {
        let base = augmented(io, 8, 3);
        let full = load_all(&dir, DirectMode::Auto, &base);
        assert_eq!(full.error, None, "{io:?}");
        // Mid-epoch (12 batches an epoch) and at an epoch boundary.
        for start in [17u64, 12] {
            let resumed = load_all(
                &dir,
                DirectMode::Auto,
                &LoaderConfig {
                    start_batch: start,
                    ..base.clone()
                },
            );
            assert_eq!(resumed.error, None);
            assert!(
                resumed.batches == full.batches[start as usize..],
                "{io:?}: resuming at batch {start} delivers other batches"
            );
        }
        let dataset = Dataset::open(&dir, DirectMode::Auto).unwrap();
        let past = LoaderConfig {
            start_batch: 36,
            ..base.clone()
        };
        let e = fulcrum::loader::Loader::start(&dataset, &past)
            .err()
            .expect("a start past the end is refused")
            .to_string();
        assert!(e.contains("past the end"), "{e}");
    }
}

#[test]
fn every_record_is_delivered_exactly_once_per_epoch() {
    let tmp = tempfile::tempdir().unwrap();
    // 100 records in shards of 30 (30 + 30 + 30 + 10); batch 8: 12 batches, 4 records dropped.
    let (records, batch, epochs) = (100u64, 8usize, 3u64);
    let dir = pack_synthetic_sharded(tmp.path(), records, 32, 30);
    let layout = layout_of(&dir);
    let per_epoch = (records / batch as u64) * batch as u64;
    let on_disk: Vec<Vec<u8>> = (0..records)
        .map(|g| read_record(&dir, (g / 30) as u32, g % 30))
        .collect();

    for io in backends() {
        for shuffle in [true, false] {
            let config = LoaderConfig {
                shuffle,
                ..test_config(io, batch, epochs)
            };
            let out = load_all(&dir, DirectMode::Auto, &config);
            assert_eq!(out.error, None);
            let got = indices(&layout, &out.batches);
            assert_eq!(got.len() as u64, epochs * per_epoch, "{io:?}");
            let mut dropped_differ = BTreeSet::new();
            for (epoch, delivered) in got.chunks(per_epoch as usize).enumerate() {
                let set: BTreeSet<u64> = delivered.iter().copied().collect();
                assert_eq!(
                    set.len() as u64,
                    per_epoch,
                    "{io:?} epoch {epoch}: a duplicate"
                );
                assert!(set.iter().all(|&i| i < records));
                let order = EpochOrder::new(records, config.seed, epoch as u64, shuffle);
                let dropped: BTreeSet<u64> = (per_epoch..records).map(|i| order.get(i)).collect();
                let missing: BTreeSet<u64> = (0..records).filter(|i| !set.contains(i)).collect();
                assert_eq!(missing, dropped, "{io:?} epoch {epoch}: missing records");
                let expected: Vec<u64> = (0..per_epoch).map(|i| order.get(i)).collect();
                assert_eq!(delivered, &expected[..], "{io:?} epoch {epoch}: order");
                dropped_differ.insert(dropped.into_iter().collect::<Vec<_>>());
            }
            if shuffle {
                assert!(
                    dropped_differ.len() > 1,
                    "the dropped remainder varies by epoch"
                );
            } else {
                assert_eq!(
                    got[..per_epoch as usize],
                    (0..per_epoch).collect::<Vec<_>>()
                );
            }
            // Augmentation is off: every delivered record is the record on disk, byte for byte.
            for (k, rec) in out
                .batches
                .iter()
                .flat_map(|b| b.chunks_exact(layout.record_size))
                .enumerate()
            {
                assert!(
                    rec == &on_disk[got[k] as usize][..],
                    "{io:?}: record {} changed",
                    got[k]
                );
            }
        }
    }
}

#[test]
fn io_uring_and_pread_deliver_identical_batches() {
    if !require_uring() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic_sharded(tmp.path(), 120, 32, 50);
    let uring = load_all(&dir, DirectMode::Auto, &augmented(IoKind::Uring, 8, 2));
    let pread = load_all(&dir, DirectMode::Auto, &augmented(IoKind::Pread, 8, 2));
    assert_eq!((uring.backend, pread.backend), ("io_uring", "pread"));
    assert_eq!((&uring.error, &pread.error), (&None, &None));
    assert_eq!(uring.batches.len(), 2 * (120 / 8));
    assert!(
        uring.batches == pread.batches,
        "io_uring and pread batches differ"
    );
    // Buffered reads give the same bytes as O_DIRECT ones.
    let buffered = load_all(&dir, DirectMode::Off, &augmented(IoKind::Uring, 8, 2));
    assert!(buffered.batches == uring.batches);
}

/// Whether `path` is a mount point of type tmpfs, from /proc/mounts.
fn is_tmpfs_mount(path: &str) -> bool {
    std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[1] == path && f[2] == "tmpfs"
        })
    })
}

#[test]
fn o_direct_refused_by_the_filesystem_falls_back_to_buffered_reads() {
    if !is_tmpfs_mount("/dev/shm") {
        // CI has one (FULCRUM_REQUIRE_TMPFS=1): there a missing tmpfs is a failure.
        assert!(
            std::env::var("FULCRUM_REQUIRE_TMPFS").map_or(true, |v| v != "1"),
            "FULCRUM_REQUIRE_TMPFS=1 but /dev/shm is not a tmpfs mount"
        );
        eprintln!("SKIP: /dev/shm is not a tmpfs mount here; no filesystem to refuse O_DIRECT");
        return;
    }
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let dir = pack_synthetic(tmp.path(), 40, 32);
    match Dataset::open(&dir, DirectMode::On) {
        Err(e) => {
            // tmpfs before Linux 6.6: O_DIRECT refused. `on` is an error naming the shard,
            // `auto` falls back to buffered reads and says why.
            let msg = e.to_string();
            assert!(
                msg.contains("O_DIRECT") && msg.contains("shard-00000.fsh"),
                "{msg}"
            );
            let ds = Dataset::open(&dir, DirectMode::Auto).expect("auto falls back");
            assert!(!ds.files.is_direct());
            let note = ds.files.direct_note().expect("the fallback is explained");
            assert!(
                note.contains("O_DIRECT") && note.contains("buffered"),
                "{note}"
            );
        }
        Ok(ds) => {
            // tmpfs since Linux 6.6 accepts O_DIRECT: nothing to fall back from.
            eprintln!(
                "SKIP: the fallback case: tmpfs on this kernel accepts O_DIRECT; checked only that \
                 `on` and `auto` both read with it"
            );
            assert!(ds.files.is_direct() && ds.files.direct_note().is_none());
            let auto = Dataset::open(&dir, DirectMode::Auto).unwrap();
            assert!(auto.files.is_direct() && auto.files.direct_note().is_none());
        }
    }
    let off = Dataset::open(&dir, DirectMode::Off).unwrap();
    assert!(!off.files.is_direct() && off.files.direct_note().is_none());
    // Whatever the mode, the data reads the same.
    let config = test_config(IoKind::Pread, 8, 1);
    let auto = load_all(&dir, DirectMode::Auto, &config);
    let off = load_all(&dir, DirectMode::Off, &config);
    assert_eq!((&auto.error, auto.batches.len()), (&None, 5));
    assert!(auto.batches == off.batches);
}

#[test]
fn packing_is_byte_identical_at_any_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SyntheticSpec::new(150, 32).per_shard(64);
    let one = spec.threads(1).pack(tmp.path());
    let three = spec.threads(3).pack(tmp.path());
    let names: Vec<String> = read_dir_files(&one).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "manifest.json",
            "shard-00000.fsh",
            "shard-00001.fsh",
            "shard-00002.fsh",
            "sources.txt"
        ]
    );
    assert_same_files(&one, &three);
    // Another seed is another dataset.
    let other = SyntheticSpec { seed: 9, ..spec }.pack(tmp.path());
    assert_ne!(
        Manifest::load(&one).unwrap().dataset_id,
        Manifest::load(&other).unwrap().dataset_id
    );
}

/// Packs a real dataset at 64×64 with `threads` threads into `out`.
fn pack_real(source: &Path, out: &Path, threads: usize) -> pack::PackReport {
    let options = PackOptions {
        size: 64,
        threads,
        ..PackOptions::new(Source::Auto(source.to_owned()), out)
    };
    pack::pack(&options, &|_, _| {}).unwrap_or_else(|e| panic!("packing {}: {e}", source.display()))
}

/// Whether the shared test data is there; prints a SKIP line if not.
fn have_data(dir: &Path) -> bool {
    let there = dir.is_dir();
    if !there {
        eprintln!(
            "SKIP: test data {} not found (expected ../shared/data beside the checkout)",
            dir.display()
        );
    }
    there
}

/// What `verify` found: boxes, background images, boxes per class.
struct Verified {
    boxes: u64,
    background: u64,
    boxes_per_class: Vec<u64>,
}

/// Opens a packed dataset and checks every record (no problem, `records` of them).
fn verify(dir: &Path, records: u64) -> Verified {
    let ds = Dataset::open(dir, DirectMode::Auto).expect("open packed dataset");
    assert_eq!(ds.records(), records);
    let report = ds.verify_all(&|_, _| {}).expect("verify");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.records, records);
    Verified {
        boxes: report.boxes,
        background: report.background,
        boxes_per_class: report.boxes_per_class,
    }
}

#[test]
fn coco128_packs_reproducibly_and_verifies() {
    let src = coco128_dir();
    if !have_data(&src) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    let report = pack_real(&src, &a, 1);
    pack_real(&src, &b, 2);
    assert_same_files(&a, &b);

    let m = &report.manifest;
    assert_eq!(m.records, 128);
    assert_eq!(m.classes.len(), 80);
    assert_eq!(m.summary.images, 128);
    assert_eq!(m.summary.labels_without_image, 2);
    assert!(m.summary.background_images >= 2);
    let v = verify(&a, 128);
    assert_eq!(v.boxes, m.summary.boxes);
    assert_eq!(v.boxes_per_class.iter().sum::<u64>(), v.boxes);
    assert!(
        v.boxes > 500,
        "coco128 has 929 boxes; {} kept at 64×64",
        v.boxes
    );
}

#[test]
fn raccoon_packs_and_verifies() {
    let src = raccoon_dir();
    if !have_data(&src) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("raccoon");
    let report = pack_real(&src, &out, 0);
    let m = &report.manifest;
    assert_eq!((m.records, m.classes.len()), (200, 1));
    let v = verify(&out, 200);
    assert!(v.boxes >= 200, "every raccoon image has a box: {}", v.boxes);
    assert_eq!(v.background, 0);
}

#[test]
fn a_trace_of_a_real_run_holds_every_unit_and_batch_in_causal_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic(tmp.path(), 40, 16);
    for io in backends() {
        let log = std::sync::Arc::new(fulcrum::trace::TraceLog::new(10_000));
        let mut config = test_config(io, 8, 2);
        config.part_records = 3;
        config.trace = Some(log.clone());
        let outcome = load_all(&dir, DirectMode::Auto, &config);
        assert!(outcome.error.is_none(), "{:?}", outcome.error);
        let batches = outcome.batches.len() as u64;
        assert_eq!(batches, 10);

        let doc: serde_json::Value =
            serde_json::from_str(&log.to_chrome_json()).expect("trace JSON parses");
        assert_eq!(doc["otherData"]["dropped_events"], 0);
        let spans: Vec<_> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        let of = |name: &str, batch: u64| -> Vec<(f64, f64, u64)> {
            spans
                .iter()
                .filter(|e| e["name"] == name && e["args"]["batch"] == batch)
                .map(|e| {
                    (
                        e["ts"].as_f64().unwrap(),
                        e["dur"].as_f64().unwrap(),
                        e["tid"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        for b in 0..batches {
            // 8 records in parts of 3: three loader units per batch, on loader rows 0 and 1.
            let loads = of("load", b);
            assert_eq!(loads.len(), 3, "batch {b} ({io:?})");
            assert!(loads.iter().all(|&(_, _, tid)| tid < 2));
            let (waits, steps) = (of("wait for batch", b), of("take batch", b));
            assert_eq!((waits.len(), steps.len()), (1, 1), "batch {b}");
            assert_eq!(steps[0].2, u64::from(fulcrum::trace::CONSUMER_ROW));
            // Causality: every unit of a batch ends before the consumer takes the batch.
            let taken = steps[0].0;
            for (ts, dur, _) in loads {
                assert!(
                    ts + dur <= taken + 1e-3,
                    "batch {b}: load ends at {} after the step starts at {taken}",
                    ts + dur
                );
            }
        }
    }
}

#[test]
fn a_holdout_split_is_disjoint_complete_and_fixed_by_its_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let sources = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_to_string(dir.join("sources.txt"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let split = |name: &str, seed: u64, take_held_out: bool| {
        let out = tmp.path().join(name);
        let options = PackOptions {
            holdout: Some(pack::Holdout {
                fraction: 0.2,
                seed,
                take_held_out,
            }),
            ..PackOptions::new(Source::Voc(raccoon_dir()), &out)
        };
        pack::pack(&options, &|_, _| {}).unwrap();
        sources(&out)
    };
    let train = split("train", 0, false);
    let val = split("val", 0, true);
    assert!(train.is_disjoint(&val));
    assert_eq!(train.len() + val.len(), 200);
    // About a fifth held out (binomial: 40 ± 6 expected).
    assert!((25..=55).contains(&val.len()), "{} held out", val.len());
    assert_eq!(split("val-again", 0, true), val, "same seed, same split");
    assert_ne!(
        split("val-other", 1, true),
        val,
        "another seed, another split"
    );

    let synthetic = PackOptions {
        holdout: Some(pack::Holdout {
            fraction: 0.2,
            seed: 0,
            take_held_out: true,
        }),
        ..PackOptions::new(
            Source::Synthetic { count: 8, seed: 1 },
            tmp.path().join("s"),
        )
    };
    let e = pack::pack(&synthetic, &|_, _| {}).unwrap_err().to_string();
    assert!(e.contains("--seed"), "{e}");
}
