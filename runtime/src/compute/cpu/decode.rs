//! Detections from the model's output ([`Decode`]): 3×3 peaks on the heat maps above a score
//! threshold, the top K per image, boxes from the offset and size channels.

use super::loss::sigmoid;
use crate::compute::ops::{Decode, Detection};
use crate::compute::recording::DETECTION_BYTES;
use crate::format::{le_f32, le_u32};

/// A peak before box decoding; sorted by score, then class, level, row, column.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Candidate {
    pub score: f32,
    pub class: u32,
    pub level: u32,
    pub y: u32,
    pub x: u32,
}

/// Candidates one image can have at most (every cell of every class): the capacity the
/// scratch passed to [`decode`] must have.
pub fn scratch_len(op: &Decode) -> usize {
    op.classes as usize * op.levels.total_cells()
}

/// Best first: higher score, then lower (class, level, y, x).
fn order(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.score
        .total_cmp(&a.score)
        .then((a.class, a.level, a.y, a.x).cmp(&(b.class, b.level, b.y, b.x)))
}

/// Ranks the peaks of one image (`pred` holds its `classes + 4` planes): afterwards the best
/// `min(top_k, peaks)` candidates, best first, are the start of `scratch`; returns how many.
fn rank(op: &Decode, pred: &[f32], scratch: &mut Vec<Candidate>) -> usize {
    let plane = op.levels.total_cells();
    assert!(
        scratch.capacity() >= scratch_len(op),
        "decode scratch has room for {} candidates, {} needed (decode::scratch_len)",
        scratch.capacity(),
        scratch_len(op)
    );
    scratch.clear();
    for class in 0..op.classes as usize {
        for level in 0..op.levels.len() {
            let (gh, gw) = op.levels.grid(level);
            let (gh, gw) = (gh as usize, gw as usize);
            let start = class * plane + op.levels.offset(level);
            let heat = &pred[start..start + gh * gw];
            for y in 0..gh {
                for x in 0..gw {
                    let z = heat[y * gw + x];
                    let peak = (y.saturating_sub(1)..(y + 2).min(gh)).all(|ny| {
                        (x.saturating_sub(1)..(x + 2).min(gw)).all(|nx| heat[ny * gw + nx] <= z)
                    });
                    if !peak {
                        // Most cells: no sigmoid (an `exp`) for them.
                        continue;
                    }
                    let score = sigmoid(z);
                    if score >= op.threshold {
                        scratch.push(Candidate {
                            score,
                            class: class as u32,
                            level: level as u32,
                            y: y as u32,
                            x: x as u32,
                        });
                    }
                }
            }
        }
    }
    let k = op.top_k as usize;
    let kept = scratch.len().min(k);
    if scratch.len() > k {
        scratch.select_nth_unstable_by(k - 1, order);
    }
    scratch[..kept].sort_unstable_by(order);
    kept
}

/// The box of candidate `cand` from the offset and size planes of one image's `pred`.
fn detection(op: &Decode, pred: &[f32], cand: &Candidate) -> Detection {
    let c = op.classes as usize;
    let plane = op.levels.total_cells();
    let level = cand.level as usize;
    let (_, gw) = op.levels.grid(level);
    let cell = op.levels.offset(level) + cand.y as usize * gw as usize + cand.x as usize;
    let stride = op.levels.stride(level) as f32;
    let cx = (cand.x as f32 + pred[c * plane + cell]) * stride;
    let cy = (cand.y as f32 + pred[(c + 1) * plane + cell]) * stride;
    let w = pred[(c + 2) * plane + cell].exp() * stride;
    let h = pred[(c + 3) * plane + cell].exp() * stride;
    Detection {
        class: cand.class,
        score: cand.score,
        x0: cx - w / 2.0,
        y0: cy - h / 2.0,
        x1: cx + w / 2.0,
        y1: cy + h / 2.0,
    }
}

/// Decodes every image of `pred`: image `i`'s detections go to `dets[i·top_k..]` (the unused
/// slots zeroed), their number to `counts[i]`. `scratch` must have a capacity of
/// [`scratch_len`] (it is cleared and refilled, never grown).
pub fn decode(
    op: &Decode,
    pred: &[f32],
    scratch: &mut Vec<Candidate>,
    dets: &mut [Detection],
    counts: &mut [u32],
) {
    assert!(pred.len() >= op.input_len(), "decode: short prediction");
    assert!(
        dets.len() >= op.output_len() && counts.len() >= op.n as usize,
        "decode: short output"
    );
    let image_len = Decode { n: 1, ..*op }.input_len();
    let k = op.top_k as usize;
    for b in 0..op.n as usize {
        let image = &pred[b * image_len..(b + 1) * image_len];
        let kept = rank(op, image, scratch);
        for (slot, cand) in dets[b * k..(b + 1) * k].iter_mut().zip(&scratch[..kept]) {
            *slot = detection(op, image, cand);
        }
        dets[b * k + kept..(b + 1) * k].fill(Detection::default());
        counts[b] = kept as u32;
    }
}

/// [`decode`] into the byte layout of the detection tensors: `counts` one little-endian `u32`
/// per image, `dets` [`DETECTION_BYTES`] per slot (the words of [`Detection`], little endian).
pub fn decode_into_bytes(
    op: &Decode,
    pred: &[f32],
    scratch: &mut Vec<Candidate>,
    dets: &mut [u8],
    counts: &mut [u8],
) {
    assert!(pred.len() >= op.input_len(), "decode: short prediction");
    assert!(
        dets.len() >= op.output_len() * DETECTION_BYTES && counts.len() >= 4 * op.n as usize,
        "decode: short output"
    );
    let image_len = Decode { n: 1, ..*op }.input_len();
    let k = op.top_k as usize;
    for b in 0..op.n as usize {
        let image = &pred[b * image_len..(b + 1) * image_len];
        let kept = rank(op, image, scratch);
        let slots = &mut dets[b * k * DETECTION_BYTES..(b + 1) * k * DETECTION_BYTES];
        for (i, out) in slots.chunks_exact_mut(DETECTION_BYTES).enumerate() {
            let d = match scratch[..kept].get(i) {
                Some(cand) => detection(op, image, cand),
                None => Detection::default(),
            };
            encode(&d, out);
        }
        counts[4 * b..4 * b + 4].copy_from_slice(&(kept as u32).to_le_bytes());
    }
}

/// Reads the detections of image `image` back from the byte layout.
pub fn detections_from_bytes<'a>(
    op: &Decode,
    image: usize,
    dets: &'a [u8],
    counts: &[u8],
) -> impl Iterator<Item = Detection> + 'a {
    let count = le_u32(counts, 4 * image);
    let k = op.top_k as usize;
    dets[image * k * DETECTION_BYTES..]
        .chunks_exact(DETECTION_BYTES)
        .take(count.min(op.top_k) as usize)
        .map(|b| Detection {
            class: le_u32(b, 0),
            score: le_f32(b, 4),
            x0: le_f32(b, 8),
            y0: le_f32(b, 12),
            x1: le_f32(b, 16),
            y1: le_f32(b, 20),
        })
}

fn encode(d: &Detection, out: &mut [u8]) {
    let words = [
        d.class,
        d.score.to_bits(),
        d.x0.to_bits(),
        d.y0.to_bits(),
        d.x1.to_bits(),
        d.y1.to_bits(),
    ];
    for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(top_k: u32, threshold: f32) -> Decode {
        Decode {
            n: 2,
            classes: 2,
            levels: crate::compute::ops::Levels::single(4, 5, 8),
            threshold,
            top_k,
        }
    }

    /// Two images: image 0 has peaks of class 0 at (1, 1) and class 1 at (3, 2); a lower
    /// neighbour of the first is not a peak. Image 1 is all background.
    fn planes(o: &Decode) -> Vec<f32> {
        let plane = 20;
        let mut p = vec![-10.0; o.input_len()];
        for b in 0..2 {
            p[b * 6 * plane + 4 * plane..b * 6 * plane + 6 * plane].fill(0.0);
        }
        p[5 + 1] = 2.0; // class 0, y 1, x 1: score 0.88
        p[5 + 2] = 1.5; // its neighbour: not a peak
        p[plane + 2 * 5 + 3] = 0.5; // class 1, y 2, x 3: score 0.62
        p[2 * plane + 5 + 1] = 0.25; // offset x at (1, 1)
        p[3 * plane + 5 + 1] = 0.5; // offset y
        p[4 * plane + 5 + 1] = 2f32.ln(); // width 2 cells
        p[5 * plane + 5 + 1] = 1f32.ln(); // height 1 cell
        p
    }

    #[test]
    fn peaks_above_threshold_become_boxes_best_first() {
        let o = op(10, 0.3);
        let pred = planes(&o);
        let mut scratch = Vec::with_capacity(scratch_len(&o));
        let mut dets = vec![Detection::default(); o.output_len()];
        let mut counts = [9; 2];
        decode(&o, &pred, &mut scratch, &mut dets, &mut counts);
        assert_eq!(counts, [2, 0]);
        let d = dets[0];
        assert_eq!((d.class, d.x0, d.y0, d.x1, d.y1), (0, 2.0, 8.0, 18.0, 16.0));
        assert!((d.score - 0.880_797).abs() < 1e-6);
        assert_eq!(dets[1].class, 1);
        assert!(dets[1].score < d.score);
        assert_eq!(dets[2], Detection::default());
    }

    #[test]
    fn threshold_and_top_k_cut_and_ties_order_by_class_then_position() {
        let o = op(1, 0.7);
        let pred = planes(&o);
        let mut scratch = Vec::with_capacity(scratch_len(&o));
        let mut dets = vec![Detection::default(); o.output_len()];
        let mut counts = [0; 2];
        decode(&o, &pred, &mut scratch, &mut dets, &mut counts);
        assert_eq!((counts, dets[0].class), ([1, 0], 0));

        // A flat map: every cell is a peak with the same score; top 3 are the first cells of
        // class 0 in row-major order.
        let flat = Decode { n: 1, ..op(3, 0.0) };
        let pred = vec![0.0; flat.input_len()];
        let mut dets = vec![Detection::default(); 3];
        let mut counts = [0];
        decode(&flat, &pred, &mut scratch, &mut dets, &mut counts);
        let cells: Vec<_> = dets.iter().map(|d| (d.class, d.x0)).collect();
        assert_eq!(counts[0], 3);
        assert_eq!(cells, [(0, -4.0), (0, 4.0), (0, 12.0)]);
    }

    #[test]
    fn bytes_round_trip_the_typed_detections() {
        let o = op(4, 0.3);
        let pred = planes(&o);
        let mut scratch = Vec::with_capacity(scratch_len(&o));
        let mut dets = vec![Detection::default(); o.output_len()];
        let mut counts = [0; 2];
        decode(&o, &pred, &mut scratch, &mut dets, &mut counts);
        let mut bytes = vec![0xaa; o.output_len() * DETECTION_BYTES];
        let mut count_bytes = [0xaa; 8];
        decode_into_bytes(&o, &pred, &mut scratch, &mut bytes, &mut count_bytes);
        for image in 0..2 {
            let back: Vec<_> = detections_from_bytes(&o, image, &bytes, &count_bytes).collect();
            let k = o.top_k as usize;
            assert_eq!(back, dets[image * k..image * k + counts[image] as usize]);
        }
    }
}
