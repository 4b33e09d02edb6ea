//! Duplicate suppression (greedy non-maximum suppression, per class) on the decoded detections.
//!
//! Decoding keeps the 3×3 peaks of every level's heat map, so one object can be found twice: a
//! large raccoon peaks at stride 16 and at stride 32, and a large object's heat map can hold two
//! peaks a few cells apart. Every copy after the first is a false positive that costs precision.
//! Each detection, best first, is kept unless a kept detection of its class overlaps it by more
//! than the limit (FCOS's 0.6 is [`DEFAULT_NMS_IOU`]). It runs on the host on at most `top_k`
//! detections, in place: no allocation, the same on both engines.

use super::map::{iou, Scored};

/// The IoU above which a lower-scored detection of the same class is dropped, unless asked
/// otherwise (`eval --nms`, `infer --nms`, fulcrumd's `nms`).
pub const DEFAULT_NMS_IOU: f32 = 0.6;

/// Checks a suppression limit from the command line or a configuration file: an IoU in (0, 1],
/// where 1 keeps every detection (no two boxes overlap by more than 1).
pub fn check_limit(limit: f32) -> Result<(), BadLimit> {
    if limit > 0.0 && limit <= 1.0 {
        Ok(())
    } else {
        Err(BadLimit(limit))
    }
}

/// A suppression limit outside (0, 1].
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "an NMS IoU limit of {0} is not in (0, 1]: give 1 to keep every detection, or a limit such \
     as {DEFAULT_NMS_IOU}"
)]
pub struct BadLimit(pub f32);

/// Drops from `dets` (best first, as decoding gives them) every detection that overlaps a
/// better one of the same class by an IoU above `limit`; the survivors keep their order.
pub fn suppress_duplicates(dets: &mut Vec<Scored>, limit: f32) {
    debug_assert!(
        dets.windows(2).all(|w| w[0].score >= w[1].score),
        "suppress_duplicates needs detections best first"
    );
    let mut kept = 0;
    for i in 0..dets.len() {
        let candidate = dets[i];
        let duplicate = dets[..kept]
            .iter()
            .any(|k| k.class == candidate.class && iou(k, &candidate) > limit);
        if !duplicate {
            dets[kept] = candidate;
            kept += 1;
        }
    }
    dets.truncate(kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn det(class: u32, score: f32, x0: f32, x1: f32) -> Scored {
        Scored {
            class,
            score,
            x0,
            y0: 0.0,
            x1,
            y1: 10.0,
        }
    }

    #[test]
    fn drops_only_lower_scored_overlaps_of_the_same_class() {
        let mut dets = vec![
            det(0, 0.9, 0.0, 10.0),
            // IoU 8/12 = 0.67 with the first: a duplicate.
            det(0, 0.8, 2.0, 12.0),
            // Same place, another class: kept.
            det(1, 0.7, 2.0, 12.0),
            // IoU 5/15 = 0.33 with the first: another object, kept.
            det(0, 0.6, 5.0, 15.0),
            // IoU 9/11 with the kept class-1 box: dropped; with the first 0.82 too.
            det(1, 0.5, 1.0, 11.0),
        ];
        suppress_duplicates(&mut dets, 0.6);
        let scores: Vec<f32> = dets.iter().map(|d| d.score).collect();
        assert_eq!(scores, [0.9, 0.7, 0.6]);
    }

    #[test]
    fn compares_with_kept_detections_only() {
        // B duplicates A and is dropped; C overlaps B (IoU 0.67) but not A (0.33): kept, as B is
        // gone.
        let mut dets = vec![
            det(0, 0.9, 0.0, 10.0),
            det(0, 0.8, 2.0, 12.0),
            det(0, 0.7, 5.0, 15.0),
        ];
        suppress_duplicates(&mut dets, 0.6);
        assert_eq!(dets.len(), 2);
        assert_eq!(dets[1].score, 0.7);
    }

    #[test]
    fn a_limit_of_one_keeps_even_identical_boxes() {
        let mut dets = vec![det(0, 0.9, 0.0, 10.0), det(0, 0.8, 0.0, 10.0)];
        suppress_duplicates(&mut dets, 1.0);
        assert_eq!(dets.len(), 2);
        suppress_duplicates(&mut dets, 0.99);
        assert_eq!(dets.len(), 1);
    }

    #[test]
    fn limits_outside_zero_to_one_are_refused() {
        assert!(check_limit(0.6).is_ok());
        assert!(check_limit(1.0).is_ok());
        for bad in [0.0, -0.5, 1.5, f32::NAN] {
            let e = check_limit(bad).unwrap_err().to_string();
            assert!(e.contains("not in (0, 1]"), "{e}");
        }
    }
}
