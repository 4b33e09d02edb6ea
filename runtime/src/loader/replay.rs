//! Replay: records of a second dataset (the base model's own data) mixed into every batch, so
//! that a fine-tune learns the new data without forgetting what the base model knew.
//!
//! The last [`Replay::per_batch`] positions of every batch hold replay records, the rest the
//! training data's; an epoch is a pass over the training data. The replay data has an epoch
//! order of its own (seeded apart from the training data's) that runs on across the training
//! data's epochs: the run's replay record `k` (`k = batch × per_batch + position`) is position
//! `k mod R` of replay epoch `k div R`. Both are functions of the seed and the batch number, so
//! a resumed or autotuned run sees the same records as an uninterrupted one.
//!
//! The two datasets may name their classes differently: the run trains the union (the training
//! data's classes, then those only the replay data has), and each replay box's class id is
//! rewritten to its union id as the record comes off disk.

use super::order::EpochOrder;
use super::{Dataset, Error, Result};
use crate::base::derive_seed;
use crate::format::RecordLayout;

/// Keeps the replay data's epoch order apart from the training data's for the same seed.
const REPLAY_SEED: u64 = 0x7265_706c_6179; // "replay"

/// The replay data and how much of each batch it fills.
pub struct Replay {
    pub dataset: Dataset,
    /// Share of each batch (0 < fraction < 1); rounded to whole records per batch.
    pub fraction: f32,
    /// The training class id of each of the replay data's classes.
    pub classes: Vec<u32>,
}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("dir", &self.dataset.dir)
            .field("records", &self.dataset.records())
            .field("fraction", &self.fraction)
            .field("classes", &self.classes)
            .finish()
    }
}

/// Whether `fraction` is a share of a batch replay can take: above 0 and below 1.
pub fn fraction_fits(fraction: f32) -> bool {
    fraction > 0.0 && fraction < 1.0
}

impl Replay {
    /// Replay from `dataset` at `fraction` of each batch, into a run that trains the classes
    /// `training_classes` (which must name every class of `dataset`: see [`union_classes`]),
    /// on records laid out as `layout`.
    pub fn new(
        dataset: Dataset,
        fraction: f32,
        layout: &RecordLayout,
        training_classes: &[String],
    ) -> Result<Self> {
        if !fraction_fits(fraction) {
            return Err(Error::Config(format!(
                "--replay-fraction {fraction}: give a share of each batch above 0 and below 1"
            )));
        }
        if dataset.records() == 0 {
            return Err(Error::Config(format!(
                "the replay data {} has no records",
                dataset.dir.display()
            )));
        }
        let theirs = &dataset.layout;
        if theirs != layout {
            return Err(Error::Config(format!(
                "the replay data {} holds {}×{} records with up to {} boxes; the training data \
                 {}×{} with up to {}: pack the replay data again with --size {} --max-boxes {}",
                dataset.dir.display(),
                theirs.width,
                theirs.height,
                theirs.max_boxes,
                layout.width,
                layout.height,
                layout.max_boxes,
                layout.width,
                layout.max_boxes
            )));
        }
        let classes = dataset
            .manifest
            .classes
            .iter()
            .map(|name| {
                training_classes
                    .iter()
                    .position(|c| c == name)
                    .map(|i| i as u32)
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "the replay data's class {name:?} is not among the run's classes"
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Replay {
            dataset,
            fraction,
            classes,
        })
    }

    /// Replay records in a batch of `batch`: the fraction of it, rounded, and at least one
    /// record of each kind (a batch of 1 has no room for replay: refused by [`check_batch`]).
    ///
    /// [`check_batch`]: Replay::check_batch
    pub fn per_batch(&self, batch: usize) -> usize {
        let share = (self.fraction as f64 * batch as f64).round() as usize;
        share.clamp(1, batch.saturating_sub(1).max(1))
    }

    /// Refuses a batch too small to hold both kinds of record.
    pub fn check_batch(&self, batch: usize) -> Result<()> {
        if batch < 2 {
            return Err(Error::Config(format!(
                "--batch {batch} has no room for replay: a batch mixes at least one record of \
                 each dataset, so use --batch 2 or more"
            )));
        }
        Ok(())
    }

    /// The replay record the run's `k`-th replay position holds.
    pub fn record(&self, seed: u64, shuffle: bool, k: u64) -> u64 {
        let n = self.dataset.records();
        EpochOrder::new(n, derive_seed(&[seed, REPLAY_SEED]), k / n, shuffle).get(k % n)
    }
}

/// The classes a run with replay trains: the training data's, in their order, then the replay
/// data's that the training data lacks.
pub fn union_classes(training: &[String], replay: &[String]) -> Vec<String> {
    let mut all = training.to_vec();
    all.extend(replay.iter().filter(|c| !training.contains(c)).cloned());
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_union_keeps_the_training_order_and_adds_what_only_the_replay_has() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            union_classes(&names(&["raccoon", "cat"]), &names(&["dog", "cat", "car"])),
            names(&["raccoon", "cat", "dog", "car"])
        );
        assert_eq!(union_classes(&names(&["a"]), &names(&["a"])), names(&["a"]));
    }

    #[test]
    fn box_classes_are_rewritten_and_the_rest_of_the_record_is_not() {
        let layout = RecordLayout::new(32, 32, 3, 4).unwrap();
        let mut record = vec![0u8; layout.record_size];
        let boxes = [
            crate::format::RecordBox {
                class: 0,
                x0: 1.0,
                y0: 2.0,
                x1: 10.0,
                y1: 12.0,
            },
            crate::format::RecordBox {
                class: 1,
                x0: 3.0,
                y0: 4.0,
                x1: 20.0,
                y1: 22.0,
            },
        ];
        layout.write_meta(&mut record, &Default::default(), &boxes);
        let before = record.clone();
        layout.map_classes(&mut record, &[2, 0]);
        assert_eq!(layout.read_box(&record, 0).class, 2);
        assert_eq!(layout.read_box(&record, 1).class, 0);
        assert_eq!(layout.read_box(&record, 1).x1, 20.0);
        assert_eq!(layout.box_count(&record), 2);
        let changed = before.iter().zip(&record).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 2, "only the two class ids' low bytes change");
    }
}
