//! How large a pack's boxes are at its input size ([`BoxSides`]), kept in the manifest so that
//! training can say, before it starts, when the boxes are too small for the model's grid.

use serde::{Deserialize, Serialize};

/// Upper edges of [`BoxSides::counts`]' bins, in pixels at the packed size: bin `k` holds
/// the boxes whose longer side is in `[EDGES[k − 1], EDGES[k])`, the last bin those of
/// 512 px and more. Powers of two, so that "under two cells of a level" (twice its stride)
/// is a bin edge for every stride of the family.
pub const EDGES: [f32; 7] = [8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// The distribution of the boxes' longer sides (the side the detector assigns a box's output
/// level by), in pixels at the packed size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoxSides {
    /// Boxes per bin of [`EDGES`] (one more bin than edges).
    pub counts: Vec<u64>,
    /// The 25th, 50th and 75th percentiles of the longer side, in pixels.
    pub quartiles: [f32; 3],
}

impl BoxSides {
    /// The distribution of `sides` (each box's longer side in pixels; any order).
    pub fn of(sides: &mut [f32]) -> Self {
        let mut counts = vec![0u64; EDGES.len() + 1];
        for &s in sides.iter() {
            counts[EDGES.iter().take_while(|&&e| s >= e).count()] += 1;
        }
        sides.sort_by(f32::total_cmp);
        let at = |q: f64| match sides.len() {
            0 => 0.0,
            n => sides[((n - 1) as f64 * q).round() as usize],
        };
        BoxSides {
            counts,
            quartiles: [at(0.25), at(0.5), at(0.75)],
        }
    }

    pub fn boxes(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The share of the boxes whose longer side is under `px`, which must be one of
    /// [`EDGES`] (`None` otherwise, or without boxes).
    pub fn share_under(&self, px: f32) -> Option<f64> {
        let bins = EDGES.iter().position(|&e| e == px)? + 1;
        let under: u64 = self.counts.iter().take(bins).sum();
        (self.boxes() > 0).then(|| under as f64 / self.boxes() as f64)
    }

    /// One line for people: the quartiles and the share under each edge that has boxes
    /// below it.
    pub fn describe(&self) -> String {
        let [q1, median, q3] = self.quartiles;
        let shares: Vec<String> = EDGES
            .iter()
            .filter_map(|&e| {
                let s = self.share_under(e)?;
                (s > 0.0 && s < 1.0).then(|| format!("{:.0} % under {e} px", 100.0 * s))
            })
            .collect();
        format!(
            "longer side {q1:.0} / {median:.0} / {q3:.0} px (quartiles){}{}",
            if shares.is_empty() { "" } else { "; " },
            shares.join(", ")
        )
    }
}

/// What `train` tells a person whose boxes are small for the model's finest level: most boxes
/// (their longer side) under two cells of it, where the centre heat map and the box
/// regression have one cell or less to learn from. `None` where they are not, or the pack
/// does not record its boxes' sizes (packs from before it did). `max_input` is the largest
/// size a pack can have.
pub fn size_advice(
    sides: &BoxSides,
    input: u32,
    finest_stride: u32,
    max_input: u32,
) -> Option<String> {
    let two_cells = 2.0 * finest_stride as f32;
    let share = sides.share_under(two_cells)?;
    if share <= 0.5 {
        return None;
    }
    let median = sides.quartiles[1].max(1.0);
    // The input size that brings the median box to two cells, in the family's steps of 32.
    let wanted = (input as f32 * two_cells / median / 32.0).ceil() as u32 * 32;
    let advice = if wanted <= max_input {
        format!(
            "pack at --size {wanted} instead (the median box, {median:.0} px here, becomes two \
             cells; compute grows by about {:.1}×)",
            (wanted as f32 / input as f32).powi(2)
        )
    } else {
        format!(
            "even --size {max_input} leaves the median box ({median:.0} px here) under two \
             cells: crop the photos around the objects, or label them closer up"
        )
    };
    Some(format!(
        "{:.0} % of the boxes are under {two_cells:.0} px on their longer side at {input} px: \
         fewer than two cells of the model's finest level (stride {finest_stride}), too few \
         for it to find and size them well; {advice}",
        100.0 * share
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_quartiles_and_shares() {
        let mut sides = [4.0, 8.0, 12.0, 15.9, 16.0, 40.0, 300.0, 600.0];
        let s = BoxSides::of(&mut sides);
        assert_eq!(s.counts, vec![1, 3, 1, 1, 0, 0, 1, 1]);
        assert_eq!(s.quartiles, [12.0, 16.0, 40.0]);
        assert_eq!(s.share_under(16.0), Some(0.5));
        assert_eq!(s.share_under(8.0), Some(0.125));
        assert_eq!(s.share_under(20.0), None, "not an edge");
        assert_eq!(BoxSides::of(&mut []).share_under(16.0), None);
        let d = s.describe();
        assert!(
            d.contains("12 / 16 / 40 px") && d.contains("50 % under 16 px"),
            "{d}"
        );
    }

    #[test]
    fn advice_names_the_size_that_gives_the_median_box_two_cells() {
        // Three quarters of the boxes under 16 px at 256, median 10 px: 256 · 16/10 = 409.6,
        // up to 416.
        let mut sides = [6.0, 9.0, 10.0, 12.0, 40.0];
        let small = BoxSides::of(&mut sides);
        let a = size_advice(&small, 256, 8, 640).expect("advice");
        assert!(a.starts_with("80 % of the boxes are under 16 px"), "{a}");
        assert!(a.contains("--size 416"), "{a}");
        // At stride 4 two cells are 8 px: one box in five under it, no advice.
        assert_eq!(size_advice(&small, 256, 4, 640), None);
        // A median of 2 px would need 2048 px: more than any pack size.
        let mut tiny = [1.0, 2.0, 2.0, 30.0];
        let a = size_advice(&BoxSides::of(&mut tiny), 256, 8, 640).expect("advice");
        assert!(a.contains("even --size 640"), "{a}");
        // Large boxes: none.
        let mut large = [60.0, 90.0, 200.0];
        assert_eq!(size_advice(&BoxSides::of(&mut large), 256, 8, 640), None);
    }
}
