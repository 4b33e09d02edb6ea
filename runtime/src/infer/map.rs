//! Mean average precision at IoU 0.5, COCO's way: per class, detections of every image sorted
//! by score, each matched greedily to the unmatched ground-truth box of the same class and
//! image with the highest IoU ≥ 0.5 (a detection that matches none, or only matched boxes, is
//! a false positive); precision made monotone from the right and sampled at the 101 recall
//! points 0, 0.01, …, 1 (precision 0 past the largest recall reached); AP is their mean and
//! mAP the mean over classes that have ground truth.

/// An axis-aligned box `(x0, y0, x1, y1)` with a class, and a score for detections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub class: u32,
    pub score: f32,
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

impl From<crate::compute::ops::Detection> for Scored {
    fn from(d: crate::compute::ops::Detection) -> Self {
        Scored {
            class: d.class,
            score: d.score,
            x0: d.x0,
            y0: d.y0,
            x1: d.x1,
            y1: d.y1,
        }
    }
}

/// A ground-truth box (score 1).
impl From<crate::format::RecordBox> for Scored {
    fn from(b: crate::format::RecordBox) -> Self {
        Scored {
            class: b.class,
            score: 1.0,
            x0: b.x0,
            y0: b.y0,
            x1: b.x1,
            y1: b.y1,
        }
    }
}

/// Intersection over union of two boxes (0 for empty ones).
pub fn iou(a: &Scored, b: &Scored) -> f32 {
    let iw = (a.x1.min(b.x1) - a.x0.max(b.x0)).max(0.0);
    let ih = (a.y1.min(b.y1) - a.y0.max(b.y0)).max(0.0);
    let inter = iw * ih;
    let area = |r: &Scored| (r.x1 - r.x0).max(0.0) * (r.y1 - r.y0).max(0.0);
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// Accumulates images; [`MapAccumulator::finish`] computes the figures.
#[derive(Debug, Clone)]
pub struct MapAccumulator {
    classes: usize,
    iou_threshold: f32,
    /// Per class: `(score, true positive)` of every detection.
    hits: Vec<Vec<(f32, bool)>>,
    /// Per class: ground-truth boxes seen.
    truth: Vec<u64>,
}

/// The result: mAP and each class's AP (`None` for a class without ground truth).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MapReport {
    pub map: f64,
    pub per_class: Vec<Option<f64>>,
    pub truth: Vec<u64>,
    pub detections: Vec<u64>,
}

impl MapAccumulator {
    pub fn new(classes: usize, iou_threshold: f32) -> Self {
        MapAccumulator {
            classes,
            iou_threshold,
            hits: vec![Vec::new(); classes],
            truth: vec![0; classes],
        }
    }

    /// Adds one image: its detections (any order) and its ground truth (scores ignored).
    pub fn add_image(&mut self, detections: &[Scored], truth: &[Scored]) {
        for t in truth {
            if (t.class as usize) < self.classes {
                self.truth[t.class as usize] += 1;
            }
        }
        let mut order: Vec<usize> = (0..detections.len()).collect();
        order.sort_by(|&a, &b| detections[b].score.total_cmp(&detections[a].score));
        let mut used = vec![false; truth.len()];
        for i in order {
            let d = &detections[i];
            if d.class as usize >= self.classes {
                continue;
            }
            let best = truth
                .iter()
                .enumerate()
                .filter(|(j, t)| t.class == d.class && !used[*j])
                .map(|(j, t)| (j, iou(d, t)))
                .filter(|&(_, o)| o >= self.iou_threshold)
                .max_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((j, _)) = best {
                used[j] = true;
            }
            self.hits[d.class as usize].push((d.score, best.is_some()));
        }
    }

    pub fn finish(&self) -> MapReport {
        let per_class: Vec<Option<f64>> = (0..self.classes)
            .map(|c| ap_101(&self.hits[c], self.truth[c]))
            .collect();
        let present: Vec<f64> = per_class.iter().flatten().copied().collect();
        MapReport {
            map: if present.is_empty() {
                0.0
            } else {
                present.iter().sum::<f64>() / present.len() as f64
            },
            per_class,
            truth: self.truth.clone(),
            detections: self.hits.iter().map(|h| h.len() as u64).collect(),
        }
    }
}

/// COCO's 101-point interpolated AP of one class (`None` without ground truth).
fn ap_101(hits: &[(f32, bool)], truth: u64) -> Option<f64> {
    if truth == 0 {
        return None;
    }
    let mut sorted = hits.to_vec();
    // Stable: among equal scores the earlier detection ranks first.
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut tp = 0u64;
    let mut recall = Vec::with_capacity(sorted.len());
    let mut precision = Vec::with_capacity(sorted.len());
    for (k, &(_, hit)) in sorted.iter().enumerate() {
        tp += hit as u64;
        recall.push(tp as f64 / truth as f64);
        precision.push(tp as f64 / (k + 1) as f64);
    }
    for i in (0..precision.len().saturating_sub(1)).rev() {
        precision[i] = precision[i].max(precision[i + 1]);
    }
    let mut sum = 0.0;
    for r in 0..=100 {
        let r = r as f64 / 100.0;
        let i = recall.partition_point(|&x| x < r - 1e-12);
        sum += precision.get(i).copied().unwrap_or(0.0);
    }
    Some(sum / 101.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(class: u32, score: f32, x0: f32, y0: f32, x1: f32, y1: f32) -> Scored {
        Scored {
            class,
            score,
            x0,
            y0,
            x1,
            y1,
        }
    }

    #[test]
    fn iou_of_known_boxes() {
        let a = b(0, 1.0, 0.0, 0.0, 10.0, 10.0);
        assert_eq!(iou(&a, &a), 1.0);
        assert_eq!(iou(&a, &b(0, 1.0, 5.0, 0.0, 15.0, 10.0)), 50.0 / 150.0);
        assert_eq!(iou(&a, &b(0, 1.0, 20.0, 20.0, 30.0, 30.0)), 0.0);
    }

    #[test]
    fn perfect_detections_give_one_and_misses_lower_it() {
        let truth = [
            b(0, 0.0, 0.0, 0.0, 10.0, 10.0),
            b(1, 0.0, 20.0, 20.0, 40.0, 40.0),
        ];
        let mut acc = MapAccumulator::new(2, 0.5);
        acc.add_image(&truth.map(|t| Scored { score: 0.9, ..t }), &truth);
        assert_eq!(acc.finish().map, 1.0);

        // Class 1 found only at a lower score than a false positive: precision 1/2 at recall 1.
        let mut acc = MapAccumulator::new(2, 0.5);
        let dets = [
            b(0, 0.9, 0.0, 0.0, 10.0, 10.0),
            b(1, 0.8, 60.0, 60.0, 70.0, 70.0),
            b(1, 0.7, 21.0, 21.0, 40.0, 40.0),
        ];
        acc.add_image(&dets, &truth);
        let r = acc.finish();
        assert_eq!(r.per_class[0], Some(1.0));
        assert!(
            (r.per_class[1].unwrap() - 0.5).abs() < 1e-12,
            "{:?}",
            r.per_class
        );
        assert!((r.map - 0.75).abs() < 1e-12);
    }

    #[test]
    fn duplicates_are_false_positives_and_half_recall_halves_ap() {
        let truth = [
            b(0, 0.0, 0.0, 0.0, 10.0, 10.0),
            b(0, 0.0, 50.0, 50.0, 60.0, 60.0),
        ];
        let mut acc = MapAccumulator::new(1, 0.5);
        // Two detections of the first box, none of the second.
        acc.add_image(
            &[
                b(0, 0.9, 0.0, 0.0, 10.0, 10.0),
                b(0, 0.8, 0.5, 0.0, 10.0, 10.0),
            ],
            &truth,
        );
        let r = acc.finish();
        // Recall 0.5 at precision 1: the points 0 … 0.5 (51 of 101) score 1.
        assert!((r.map - 51.0 / 101.0).abs() < 1e-12, "{}", r.map);
        assert_eq!(r.detections, vec![2]);
    }

    #[test]
    fn classes_without_truth_do_not_count() {
        let mut acc = MapAccumulator::new(3, 0.5);
        acc.add_image(
            &[b(2, 0.9, 0.0, 0.0, 5.0, 5.0)],
            &[b(0, 0.0, 0.0, 0.0, 5.0, 5.0)],
        );
        let r = acc.finish();
        assert_eq!(r.per_class, vec![Some(0.0), None, None]);
        assert_eq!(r.map, 0.0);
    }
}
