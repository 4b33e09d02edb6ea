//! Replay: the loaders mix a second dataset's records into every batch at the asked share,
//! each dataset in an order of its own, deterministically (a resumed run sees what an
//! uninterrupted one does), with the replay data's classes numbered as the run's.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::{Dataset, Loader, LoaderConfig, Replay};
use fulcrum_tests::*;

/// Which dataset (0: training, 1: replay) and record a delivered record is, found by its image.
struct Sources {
    by_image: HashMap<Vec<u8>, (usize, u64)>,
    layout: fulcrum::format::RecordLayout,
}

impl Sources {
    fn new(dirs: &[&Path]) -> Self {
        let mut by_image = HashMap::new();
        let mut layout = None;
        for (source, dir) in dirs.iter().enumerate() {
            let d = Dataset::open(dir, DirectMode::Off).unwrap();
            let mut record = vec![0u8; d.layout.record_size];
            for i in 0..d.records() {
                d.read_records(i, &mut record).unwrap();
                let old = by_image.insert(d.layout.image(&record).to_vec(), (source, i));
                assert!(old.is_none(), "two records with one image");
            }
            layout = Some(d.layout);
        }
        Sources {
            by_image,
            layout: layout.unwrap(),
        }
    }

    /// `(dataset, record)` of every record of every batch.
    fn of(&self, batches: &[Vec<u8>]) -> Vec<Vec<(usize, u64)>> {
        let rs = self.layout.record_size;
        batches
            .iter()
            .map(|b| {
                b.chunks_exact(rs)
                    .map(|r| {
                        let found = self.by_image[self.layout.image(r)];
                        assert_eq!(
                            self.layout.read_meta(r).index,
                            found.1,
                            "the record's stored index"
                        );
                        found
                    })
                    .collect()
            })
            .collect()
    }
}

fn with_replay(io: IoKind, replay: &Path, fraction: f32, train: &Dataset) -> LoaderConfig {
    let replay = Dataset::open(replay, DirectMode::Auto).unwrap();
    let classes = train.manifest.classes.clone();
    LoaderConfig {
        replay: Some(Arc::new(
            Replay::new(replay, fraction, &train.layout, &classes).unwrap(),
        )),
        ..test_config(io, 8, 3)
    }
}

fn load(train: &Path, config: &LoaderConfig) -> Vec<Vec<u8>> {
    let dataset = Dataset::open(train, DirectMode::Auto).unwrap();
    let mut loader = Loader::start(&dataset, config).unwrap();
    let mut batches = Vec::new();
    while let Some(b) = loader.next_batch().unwrap() {
        batches.push(b.records().to_vec());
    }
    batches
}

#[test]
fn every_batch_holds_the_asked_share_of_replay_records_each_dataset_in_its_own_order() {
    let tmp = tempfile::tempdir().unwrap();
    let train = pack_synthetic(tmp.path(), 60, 32);
    let replay = SyntheticSpec {
        seed: 2,
        ..SyntheticSpec::new(23, 32)
    }
    .pack(tmp.path());
    let sources = Sources::new(&[&train, &replay]);
    let train_set = Dataset::open(&train, DirectMode::Auto).unwrap();
    for io in backends() {
        // 0.25 of 8: two replay records per batch, six of the training data's; 60 records
        // make 10 batches an epoch, 3 epochs 30 batches and 60 replay records (the 23 replay
        // records go round 2.6 times).
        let config = with_replay(io, &replay, 0.25, &train_set);
        let batches = load(&train, &config);
        assert_eq!(batches.len(), 30, "{io:?}");
        let seen = sources.of(&batches);
        for (b, batch) in seen.iter().enumerate() {
            let kinds: Vec<usize> = batch.iter().map(|s| s.0).collect();
            assert_eq!(kinds, [0, 0, 0, 0, 0, 0, 1, 1], "{io:?}: batch {b}");
        }
        // Each epoch, every training record once.
        for epoch in seen.chunks(10) {
            let mut records: Vec<u64> = epoch
                .iter()
                .flatten()
                .filter(|s| s.0 == 0)
                .map(|s| s.1)
                .collect();
            records.sort();
            assert_eq!(records, (0..60).collect::<Vec<u64>>(), "{io:?}");
        }
        // The replay stream: each pass of 23 holds every replay record once, in an order that
        // differs between passes.
        let stream: Vec<u64> = seen
            .iter()
            .flatten()
            .filter(|s| s.0 == 1)
            .map(|s| s.1)
            .collect();
        assert_eq!(stream.len(), 60);
        for pass in stream.chunks(23).take(2) {
            let mut p = pass.to_vec();
            p.sort();
            assert_eq!(p, (0..23).collect::<Vec<u64>>(), "{io:?}");
        }
        assert_ne!(
            stream[..23],
            stream[23..46],
            "{io:?}: each pass shuffled anew"
        );

        // A run started at batch 13 (a resume, an autotuner's restart) sees what the
        // uninterrupted run saw from there.
        let resumed = load(
            &train,
            &LoaderConfig {
                start_batch: 13,
                ..config.clone()
            },
        );
        assert_eq!(resumed, batches[13..], "{io:?}");

        // Other shares: rounded to whole records, at least one of each kind.
        for (fraction, replayed) in [(0.1, 1), (0.5, 4), (0.9, 7), (0.99, 7)] {
            let c = with_replay(io, &replay, fraction, &train_set);
            let first = &sources.of(&load(&train, &c))[0];
            let n = first.iter().filter(|s| s.0 == 1).count();
            assert_eq!(n, replayed, "{io:?}: fraction {fraction}");
        }
    }
}

#[test]
fn replay_data_must_match_the_records_and_the_run_must_know_its_classes() {
    let tmp = tempfile::tempdir().unwrap();
    let train = pack_synthetic(tmp.path(), 16, 32);
    let bigger = pack_synthetic(tmp.path(), 16, 64);
    let train_set = Dataset::open(&train, DirectMode::Auto).unwrap();
    let classes = train_set.manifest.classes.clone();
    let e = Replay::new(open(&bigger), 0.25, &train_set.layout, &classes).unwrap_err();
    assert!(
        e.to_string()
            .contains("pack the replay data again with --size 32"),
        "{e}"
    );
    let e = Replay::new(open(&train), 0.25, &train_set.layout, &classes[..1]).unwrap_err();
    assert!(e.to_string().contains("not among the run's classes"), "{e}");
    for bad in [0.0, 1.0, -0.5, f32::NAN] {
        let e = Replay::new(open(&train), bad, &train_set.layout, &classes).unwrap_err();
        assert!(e.to_string().contains("--replay-fraction"), "{e}");
    }
    // A batch of one has no room for both.
    let config = LoaderConfig {
        batch: 1,
        ..with_replay(IoKind::Pread, &train, 0.25, &train_set)
    };
    let e = Loader::start(&train_set, &config).err().unwrap();
    assert!(e.to_string().contains("--batch 2 or more"), "{e}");
}

#[test]
fn replay_boxes_are_renumbered_to_the_runs_classes() {
    let tmp = tempfile::tempdir().unwrap();
    let train = pack_synthetic(tmp.path(), 16, 32);
    let train_set = Dataset::open(&train, DirectMode::Auto).unwrap();
    let data = &train_set.manifest.classes;
    // The run's classes: the data's, reversed, after a class neither has.
    let mut classes = vec!["new".to_owned()];
    classes.extend(data.iter().rev().cloned());
    let replay = Replay::new(open(&train), 0.5, &train_set.layout, &classes).unwrap();
    let n = data.len() as u32;
    assert_eq!(replay.classes, (1..=n).rev().collect::<Vec<u32>>());
    let config = LoaderConfig {
        replay: Some(Arc::new(replay)),
        ..test_config(IoKind::Pread, 8, 1)
    };
    let batches = load(&train, &config);
    let layout = train_set.layout;
    // Plain reads into a plain buffer (O_DIRECT would need an aligned one).
    let stored_set = Dataset::open(&train, DirectMode::Off).unwrap();
    let mut boxes = 0;
    for batch in &batches {
        for (i, r) in batch.chunks_exact(layout.record_size).enumerate() {
            let index = layout.read_meta(r).index;
            let mut stored = vec![0u8; layout.record_size];
            stored_set.read_records(index, &mut stored).unwrap();
            for b in 0..layout.box_count(r) as usize {
                let (got, was) = (layout.read_box(r, b), layout.read_box(&stored, b));
                let expected = if i < 4 { was.class } else { n - was.class };
                assert_eq!(got.class, expected, "record {i} box {b}");
                assert_eq!((got.x0, got.y1), (was.x0, was.y1));
                boxes += (i >= 4) as usize;
            }
        }
    }
    assert!(boxes > 0, "some replay record has boxes");
}

fn open(dir: &Path) -> Dataset {
    Dataset::open(dir, DirectMode::Auto).unwrap()
}
