//! Mean average precision, COCO's way (pycocotools' `COCOeval` for boxes, reimplemented).
//!
//! Per image and class, detections sorted by score are matched greedily to the unmatched
//! ground-truth box with the highest IoU at or above the threshold (a detection that matches
//! none is a false positive). Per class, over all images, precision is made monotone from the
//! right and sampled at the 101 recall points 0, 0.01, …, 1 (precision 0 past the largest recall
//! reached); AP is their mean and mAP the mean over classes that have ground truth.
//!
//! Besides AP at one IoU threshold (0.5 unless asked otherwise), [`MapAccumulator::finish`]
//! gives COCO's headline AP@[0.5:0.95] (the mean over the thresholds 0.50, 0.55, …, 0.95) and
//! both per object size. Sizes are COCO's areas in *source* pixels (the photo before
//! letterboxing): small below 32², medium to 96², large above. For one size, boxes of other
//! sizes are ignored, as are the detections matched to them and unmatched detections of other
//! sizes, so a size's AP is what the detector does on objects of that size.

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

impl Scored {
    /// Whether the box covers any area. A detection predicted wholly outside the photo is
    /// clipped to a line; it can match nothing and shows a robot nothing, so it is dropped.
    pub fn has_area(&self) -> bool {
        self.x1 > self.x0 && self.y1 > self.y0
    }
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
    images: Vec<ImageBoxes>,
}

/// One image's boxes, with the factor that turns their areas into source pixels.
#[derive(Debug, Clone)]
struct ImageBoxes {
    detections: Vec<Scored>,
    truth: Vec<Scored>,
    source_area_per_area: f32,
}

/// COCO's object sizes, by area in source pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectSize {
    /// Below 32 × 32 px.
    Small,
    /// 32 × 32 to 96 × 96 px.
    Medium,
    /// Above 96 × 96 px.
    Large,
}

impl ObjectSize {
    pub const ALL: [ObjectSize; 3] = [ObjectSize::Small, ObjectSize::Medium, ObjectSize::Large];

    /// The inclusive area range (COCO's `areaRng`).
    fn area_range(self) -> (f32, f32) {
        match self {
            ObjectSize::Small => (0.0, 32.0 * 32.0),
            ObjectSize::Medium => (32.0 * 32.0, 96.0 * 96.0),
            ObjectSize::Large => (96.0 * 96.0, f32::INFINITY),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ObjectSize::Small => "small",
            ObjectSize::Medium => "medium",
            ObjectSize::Large => "large",
        }
    }

    /// The range in words, for tables.
    pub fn describe(self) -> &'static str {
        match self {
            ObjectSize::Small => "< 32² px",
            ObjectSize::Medium => "32²–96² px",
            ObjectSize::Large => "> 96² px",
        }
    }
}

/// The IoU thresholds of AP@[0.5:0.95].
pub const COCO_THRESHOLDS: [f32; 10] = [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95];

/// The result. APs are `None` for a class (or size) without ground truth; means are over the
/// classes that have some (0 when none has).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MapReport {
    /// The IoU threshold of `map` and `per_class`.
    pub iou: f32,
    /// mAP at `iou`.
    pub map: f64,
    /// mAP averaged over [`COCO_THRESHOLDS`] (COCO's headline AP).
    pub map_50_95: f64,
    pub per_class: Vec<Option<f64>>,
    pub per_class_50_95: Vec<Option<f64>>,
    /// Ground-truth boxes per class.
    pub truth: Vec<u64>,
    /// Detections per class.
    pub detections: Vec<u64>,
    /// The same figures per object size, in [`ObjectSize::ALL`]'s order.
    pub per_size: Vec<SizeReport>,
}

/// mAP over the objects of one size.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SizeReport {
    pub size: ObjectSize,
    /// Ground-truth boxes of this size.
    pub truth: u64,
    /// mAP at the report's `iou` (`None` without boxes of this size).
    pub map: Option<f64>,
    pub map_50_95: Option<f64>,
}

/// A detection's outcome at one threshold and size.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    score: f32,
    matched: bool,
    ignored: bool,
}

impl MapAccumulator {
    pub fn new(classes: usize, iou_threshold: f32) -> Self {
        MapAccumulator {
            classes,
            iou_threshold,
            images: Vec::new(),
        }
    }

    /// Adds one image: its detections (any order) and its ground truth (scores ignored), both
    /// in the same (packed) pixels; `scale` is packed pixels per source pixel (the record's
    /// letterbox scale), so that sizes are judged on the source photo as COCO judges them.
    pub fn add_image(&mut self, detections: &[Scored], truth: &[Scored], scale: f32) {
        let in_range = |b: &&Scored| (b.class as usize) < self.classes;
        let scale = if scale.is_finite() && scale > 0.0 {
            scale
        } else {
            1.0
        };
        self.images.push(ImageBoxes {
            detections: detections.iter().filter(in_range).copied().collect(),
            truth: truth.iter().filter(in_range).copied().collect(),
            source_area_per_area: 1.0 / (scale * scale),
        });
    }

    pub fn finish(&self) -> MapReport {
        let all = (0.0, f32::INFINITY);
        let per_class = self.class_aps(self.iou_threshold, all);
        let per_class_50_95 = self.class_aps_50_95(all);
        let mut truth = vec![0u64; self.classes];
        let mut detections = vec![0u64; self.classes];
        for image in &self.images {
            image
                .truth
                .iter()
                .for_each(|t| truth[t.class as usize] += 1);
            (image.detections.iter()).for_each(|d| detections[d.class as usize] += 1);
        }
        let per_size = ObjectSize::ALL
            .iter()
            .map(|&size| {
                let range = size.area_range();
                let truth = (self.images.iter())
                    .flat_map(|i| {
                        i.truth
                            .iter()
                            .map(move |t| area(t) * i.source_area_per_area)
                    })
                    .filter(|&a| within(a, range))
                    .count() as u64;
                SizeReport {
                    size,
                    truth,
                    map: (truth > 0)
                        .then(|| mean_present(&self.class_aps(self.iou_threshold, range))),
                    map_50_95: (truth > 0).then(|| mean_present(&self.class_aps_50_95(range))),
                }
            })
            .collect();
        MapReport {
            iou: self.iou_threshold,
            map: mean_present(&per_class),
            map_50_95: mean_present(&per_class_50_95),
            per_class,
            per_class_50_95,
            truth,
            detections,
            per_size,
        }
    }

    /// Each class's AP averaged over [`COCO_THRESHOLDS`], for boxes with areas in `range`.
    fn class_aps_50_95(&self, range: (f32, f32)) -> Vec<Option<f64>> {
        let at: Vec<Vec<Option<f64>>> = (COCO_THRESHOLDS.iter())
            .map(|&t| self.class_aps(t, range))
            .collect();
        (0..self.classes)
            .map(|c| {
                let aps: Option<Vec<f64>> = at.iter().map(|aps| aps[c]).collect();
                aps.map(|aps| aps.iter().sum::<f64>() / aps.len() as f64)
            })
            .collect()
    }

    /// Each class's AP at IoU `threshold`, for boxes with areas in `range`.
    fn class_aps(&self, threshold: f32, range: (f32, f32)) -> Vec<Option<f64>> {
        let mut outcomes = vec![Vec::new(); self.classes];
        let mut truth = vec![0u64; self.classes];
        for image in &self.images {
            for class in 0..self.classes as u32 {
                truth[class as usize] += match_class(
                    image,
                    class,
                    threshold,
                    range,
                    &mut outcomes[class as usize],
                );
            }
        }
        (0..self.classes)
            .map(|c| {
                let hits: Vec<(f32, bool)> = (outcomes[c].iter())
                    .filter(|o| !o.ignored)
                    .map(|o| (o.score, o.matched))
                    .collect();
                ap_101(&hits, truth[c])
            })
            .collect()
    }
}

fn area(b: &Scored) -> f32 {
    (b.x1 - b.x0).max(0.0) * (b.y1 - b.y0).max(0.0)
}

fn within(area: f32, (lo, hi): (f32, f32)) -> bool {
    lo <= area && area <= hi
}

fn mean_present(aps: &[Option<f64>]) -> f64 {
    let present: Vec<f64> = aps.iter().flatten().copied().collect();
    if present.is_empty() {
        0.0
    } else {
        present.iter().sum::<f64>() / present.len() as f64
    }
}

/// Matches one image's detections of `class` to its boxes (COCO's `evaluateImg`), pushing each
/// detection's outcome; returns the number of boxes of `class` that count (not ignored).
fn match_class(
    image: &ImageBoxes,
    class: u32,
    threshold: f32,
    range: (f32, f32),
    out: &mut Vec<Outcome>,
) -> u64 {
    let source_area = |b: &Scored| area(b) * image.source_area_per_area;
    // Boxes that count first, then the ignored ones (a stable partition, as COCO sorts).
    let mut truth: Vec<(&Scored, bool)> = (image.truth.iter())
        .filter(|t| t.class == class)
        .map(|t| (t, !within(source_area(t), range)))
        .collect();
    truth.sort_by_key(|&(_, ignored)| ignored);
    let mut detections: Vec<&Scored> = (image.detections.iter())
        .filter(|d| d.class == class)
        .collect();
    detections.sort_by(|a, b| b.score.total_cmp(&a.score));
    let mut used = vec![false; truth.len()];
    for d in detections {
        let mut best: Option<usize> = None;
        let mut best_iou = threshold.min(1.0 - 1e-10);
        for (g, &(t, ignored)) in truth.iter().enumerate() {
            if used[g] {
                continue;
            }
            // A match that counts is never traded for an ignored box.
            if best.is_some_and(|b| !truth[b].1) && ignored {
                break;
            }
            let overlap = iou(d, t);
            if overlap < best_iou {
                continue;
            }
            best_iou = overlap;
            best = Some(g);
        }
        let ignored = match best {
            Some(g) => {
                used[g] = true;
                truth[g].1
            }
            None => !within(source_area(d), range),
        };
        out.push(Outcome {
            score: d.score,
            matched: best.is_some(),
            ignored,
        });
    }
    truth.iter().filter(|&&(_, ignored)| !ignored).count() as u64
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
        acc.add_image(&truth.map(|t| Scored { score: 0.9, ..t }), &truth, 1.0);
        assert_eq!(acc.finish().map, 1.0);

        // Class 1 found only at a lower score than a false positive: precision 1/2 at recall 1.
        let mut acc = MapAccumulator::new(2, 0.5);
        let dets = [
            b(0, 0.9, 0.0, 0.0, 10.0, 10.0),
            b(1, 0.8, 60.0, 60.0, 70.0, 70.0),
            b(1, 0.7, 21.0, 21.0, 40.0, 40.0),
        ];
        acc.add_image(&dets, &truth, 1.0);
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
            1.0,
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
            1.0,
        );
        let r = acc.finish();
        assert_eq!(r.per_class, vec![Some(0.0), None, None]);
        assert_eq!(r.map, 0.0);
    }

    #[test]
    fn ap_50_95_averages_the_ten_thresholds() {
        let truth = [b(0, 0.0, 0.0, 0.0, 10.0, 10.0)];
        // IoU 70 / 100 = 0.7: a match at 0.50, 0.55, …, 0.70 (5 of 10 thresholds), none above.
        let mut acc = MapAccumulator::new(1, 0.5);
        acc.add_image(&[b(0, 0.9, 0.0, 0.0, 10.0, 7.0)], &truth, 1.0);
        let r = acc.finish();
        assert_eq!(r.map, 1.0);
        assert!((r.map_50_95 - 0.5).abs() < 1e-12, "{}", r.map_50_95);
        assert_eq!(r.per_class_50_95, vec![Some(0.5)]);
        // The primary threshold is the one asked for.
        let mut strict = MapAccumulator::new(1, 0.75);
        strict.add_image(&[b(0, 0.9, 0.0, 0.0, 10.0, 7.0)], &truth, 1.0);
        assert_eq!(strict.finish().map, 0.0);
    }

    #[test]
    fn sizes_are_judged_in_source_pixels_and_ignore_other_sizes() {
        // Packed at scale 0.5: a 10×10 packed box is 20×20 source px (small), 30×30 packed is
        // 60×60 (medium), 60×60 packed is 120×120 (large).
        let small = b(0, 0.0, 0.0, 0.0, 10.0, 10.0);
        let medium = b(0, 0.0, 20.0, 20.0, 50.0, 50.0);
        let large = b(0, 0.0, 60.0, 0.0, 120.0, 60.0);
        let mut acc = MapAccumulator::new(1, 0.5);
        acc.add_image(
            &[
                // The small box, found; the medium one found only by a poor overlap; a false
                // positive of large size (ignored for the small and medium figures); no
                // detection of the large box.
                Scored {
                    score: 0.9,
                    ..small
                },
                b(0, 0.8, 20.0, 20.0, 50.0, 32.0),
                b(0, 0.95, 0.0, 60.0, 100.0, 120.0),
            ],
            &[small, medium, large],
            0.5,
        );
        let r = acc.finish();
        let size = |s: ObjectSize| r.per_size.iter().find(|x| x.size == s).unwrap().clone();
        assert_eq!(size(ObjectSize::Small).truth, 1);
        assert_eq!(size(ObjectSize::Small).map, Some(1.0));
        assert_eq!(size(ObjectSize::Medium).map, Some(0.0));
        assert_eq!(size(ObjectSize::Large).map, Some(0.0));
        // Over all sizes the large false positive ranks first: precision 1/2 at recall 1/3.
        let all = r.map;
        assert!(all > 0.0 && all < 1.0, "{all}");
        // At scale 1 the same boxes are 10², 30² and 60² source px: two small, one medium.
        let mut unscaled = MapAccumulator::new(1, 0.5);
        unscaled.add_image(&[], &[small, medium, large], 1.0);
        let truth: Vec<u64> = unscaled.finish().per_size.iter().map(|s| s.truth).collect();
        assert_eq!(truth, vec![2, 1, 0]);
    }
}
