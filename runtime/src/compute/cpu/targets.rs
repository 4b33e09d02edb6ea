//! CenterNet training targets from the boxes inside records ([`Targets`]): Gaussian heat
//! maps, centre offsets, log sizes and the regression mask (1 at centres, the neighbour
//! weight around them).

use crate::compute::ops::Targets;
use crate::format::{le_f32, le_u32};

/// CenterNet's radius (in the units of `height`, `width`) within which a box's corners may move
/// and still overlap the original by at least `min_overlap` IoU: the smallest root of the three
/// cases of the original implementation (both corners moving, one inside, one outside).
pub fn gaussian_radius(height: f32, width: f32, min_overlap: f32) -> f32 {
    let (h, w, o) = (height, width, min_overlap);
    let b1 = h + w;
    let c1 = w * h * (1.0 - o) / (1.0 + o);
    let r1 = (b1 + (b1 * b1 - 4.0 * c1).max(0.0).sqrt()) / 2.0;
    let b2 = 2.0 * (h + w);
    let c2 = (1.0 - o) * w * h;
    let r2 = (b2 + (b2 * b2 - 16.0 * c2).max(0.0).sqrt()) / 2.0;
    let a3 = 4.0 * o;
    let b3 = -2.0 * o * (h + w);
    let c3 = (o - 1.0) * w * h;
    let r3 = (b3 + (b3 * b3 - 4.0 * a3 * c3).max(0.0).sqrt()) / 2.0;
    r1.min(r2).min(r3)
}

/// Renders the targets of `op.n` records into `out` (overwritten). Boxes with a class outside
/// `0..classes`, or without a positive finite width and height, are skipped.
pub fn render_targets(op: &Targets, records: &[u8], out: &mut [f32]) {
    assert!(
        records.len() >= op.input_bytes() && out.len() >= op.output_len(),
        "targets: short tensors"
    );
    let levels = &op.levels;
    let plane = levels.total_cells();
    let classes = op.classes as usize;
    let image_w = levels.input_w as f32;
    out[..op.output_len()].fill(0.0);
    for b in 0..op.n as usize {
        let meta = &records[b * op.record_stride as usize + op.meta_offset as usize..];
        let count = (le_u32(meta, 4) & 0xffff).min(op.max_boxes) as usize;
        let t = &mut out[b * (classes + 5) * plane..(b + 1) * (classes + 5) * plane];
        for i in 0..count {
            let at = 40 + 20 * i;
            let class = le_u32(meta, at) as usize;
            let (mut x0, y0, mut x1, y1) = (
                le_f32(meta, at + 4),
                le_f32(meta, at + 8),
                le_f32(meta, at + 12),
                le_f32(meta, at + 16),
            );
            if op.flip {
                (x0, x1) = (image_w - x1, image_w - x0);
            }
            // `!(v > 0)` also refuses NaN.
            let (pw, ph) = (x1 - x0, y1 - y0);
            if class >= classes || !(pw > 0.0 && ph > 0.0 && pw.is_finite() && ph.is_finite()) {
                continue;
            }
            let level = levels.level_of(pw.max(ph));
            let (gh, gw) = levels.grid(level);
            let (gh, gw) = (gh as usize, gw as usize);
            let offset = levels.offset(level);
            let stride = levels.stride(level) as f32;
            let cells = CellBox {
                cx: (x0 + x1) / (2.0 * stride),
                cy: (y0 + y1) / (2.0 * stride),
                w: pw / stride,
                h: ph / stride,
            };
            let ix = (cells.cx.floor().max(0.0) as usize).min(gw - 1);
            let iy = (cells.cy.floor().max(0.0) as usize).min(gh - 1);
            let r = gaussian_radius(cells.h, cells.w, op.min_overlap)
                .max(0.0)
                .floor() as i64;
            let sigma = (2 * r + 1) as f32 / 6.0;
            let heat = &mut t[class * plane + offset..class * plane + offset + gh * gw];
            for dy in -r..=r {
                let y = iy as i64 + dy;
                if y < 0 || y >= gh as i64 {
                    continue;
                }
                for dx in -r..=r {
                    let x = ix as i64 + dx;
                    if x < 0 || x >= gw as i64 {
                        continue;
                    }
                    let v = (-((dx * dx + dy * dy) as f32) / (2.0 * sigma * sigma)).exp();
                    let cell = &mut heat[y as usize * gw + x as usize];
                    *cell = cell.max(v);
                }
            }
            // Plane `p` of the regression channels at cell (x, y): offset x, offset y, log
            // width, log height, mask.
            let at = |p: usize, x: usize, y: usize| (classes + p) * plane + offset + y * gw + x;
            let size = [cells.w.ln(), cells.h.ln()];
            let regress = |t: &mut [f32], x: usize, y: usize, mask: f32| {
                t[at(0, x, y)] = cells.cx - x as f32;
                t[at(1, x, y)] = cells.cy - y as f32;
                t[at(2, x, y)] = size[0];
                t[at(3, x, y)] = size[1];
                t[at(4, x, y)] = mask;
            };
            regress(t, ix, iy, 1.0);
            if op.neighbour_weight > 0.0 {
                let reach = op.neighbour_radius as usize;
                let weight = neighbour_mask(
                    op,
                    cells.neighbours_inside((ix, iy), reach, (gw, gh)).count(),
                );
                for (x, y) in cells.neighbours_inside((ix, iy), reach, (gw, gh)) {
                    // A centre (mask 1) or an earlier box's neighbour of at least this
                    // weight keeps its cell.
                    if t[at(4, x, y)] < weight {
                        regress(t, x, y, weight);
                    }
                }
            }
        }
    }
}

/// The mask of each of a box's `count` neighbour cells: the weight, shared out above
/// [`Targets::neighbour_cells`] of them (the shader's arithmetic: `w · (K / C)`).
fn neighbour_mask(op: &Targets, count: usize) -> f32 {
    let limit = op.neighbour_cells as usize;
    if limit == 0 || count <= limit {
        op.neighbour_weight
    } else {
        op.neighbour_weight * (limit as f32 / count as f32)
    }
}

/// A box in the cells of its level: centre and size.
#[derive(Debug, Clone, Copy)]
struct CellBox {
    cx: f32,
    cy: f32,
    w: f32,
    h: f32,
}

impl CellBox {
    /// The cells within `reach` of the centre cell (`|dx|, |dy| ≤ reach`), other than it,
    /// inside a grid of `(width, height)` cells, whose own centres lie inside the box. Tested
    /// through the offsets, `|cx − x − ½| < w/2`, as the shader does.
    fn neighbours_inside(
        self,
        (ix, iy): (usize, usize),
        reach: usize,
        (gw, gh): (usize, usize),
    ) -> impl Iterator<Item = (usize, usize)> {
        let near = move |i: usize, n: usize| i.saturating_sub(reach)..(i + reach + 1).min(n);
        near(iy, gh)
            .flat_map(move |y| near(ix, gw).map(move |x| (x, y)))
            .filter(move |&(x, y)| {
                (x, y) != (ix, iy)
                    && (self.cx - x as f32 - 0.5).abs() < self.w / 2.0
                    && (self.cy - y as f32 - 0.5).abs() < self.h / 2.0
            })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::compute::ops::Levels;

    /// A record buffer of `boxes.len()` records `stride` bytes apart, metadata at `meta`.
    pub(crate) fn records(meta: usize, stride: usize, boxes: &[&[(u32, [f32; 4])]]) -> Vec<u8> {
        let mut out = vec![0u8; stride * boxes.len()];
        for (r, list) in boxes.iter().enumerate() {
            let m = &mut out[r * stride + meta..];
            m[4..6].copy_from_slice(&(list.len() as u16).to_le_bytes());
            for (i, (class, b)) in list.iter().enumerate() {
                let at = 40 + 20 * i;
                m[at..at + 4].copy_from_slice(&class.to_le_bytes());
                for (k, v) in b.iter().enumerate() {
                    m[at + 4 + 4 * k..at + 8 + 4 * k].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        out
    }

    fn op(n: u32, max_boxes: u32, stride_bytes: u32, flip: bool) -> Targets {
        Targets {
            n,
            classes: 2,
            levels: Levels::single(8, 8, 8),
            max_boxes,
            record_stride: stride_bytes,
            meta_offset: 16,
            min_overlap: 0.7,
            flip,
            neighbour_weight: 0.0,
            neighbour_radius: 1,
            neighbour_cells: 0,
        }
    }

    #[test]
    fn radius_matches_centernet_for_known_boxes() {
        // By hand from CenterNet's formula (the third case is the smallest for both):
        // (10, 10): (−28 + √1120)/2 = 2.7332…; (4, 2): (−8.4 + √97.44)/2 = 0.7356…
        assert!((gaussian_radius(10.0, 10.0, 0.7) - 2.733_2).abs() < 1e-3);
        assert!((gaussian_radius(4.0, 2.0, 0.7) - 0.735_6).abs() < 1e-3);
    }

    #[test]
    fn one_box_gives_peak_offset_size_and_mask() {
        // Box 4..68 × 0..48 px: centre (36, 24) px = (4.5, 3.0) cells, size 8 × 6 cells.
        let recs = records(16, 256, &[&[(1, [4.0, 0.0, 68.0, 48.0])]]);
        let o = op(1, 4, 256, false);
        let mut t = vec![f32::NAN; o.output_len()];
        render_targets(&o, &recs, &mut t);
        let (plane, at) = (64, 3 * 8 + 4);
        assert!(t[..plane].iter().all(|&v| v == 0.0), "class 0 untouched");
        assert_eq!(t[plane + at], 1.0, "centre cell of class 1 is exactly 1");
        let r = gaussian_radius(6.0, 8.0, 0.7).floor();
        assert_eq!(r, 1.0);
        let sigma = 3.0f32 / 6.0;
        let side = (-1.0 / (2.0 * sigma * sigma)).exp();
        assert!((t[plane + at + 1] - side).abs() < 1e-7);
        assert_eq!(t[plane + at + 2], 0.0, "outside the radius");
        assert!((t[2 * plane + at] - 0.5).abs() < 1e-7);
        assert_eq!(t[3 * plane + at], 0.0);
        assert!((t[4 * plane + at] - 8.0f32.ln()).abs() < 1e-7);
        assert!((t[5 * plane + at] - 6.0f32.ln()).abs() < 1e-7);
        assert_eq!(t[6 * plane + at], 1.0);
        assert_eq!(t[6 * plane..].iter().filter(|&&v| v != 0.0).count(), 1);
    }

    #[test]
    fn neighbours_inside_the_box_get_its_regression_at_their_weight() {
        // A: 4..68 × 0..48 px, centre (4.5, 3.0) cells in cell (4, 3), 8 × 6 cells: all eight
        // neighbours lie inside it. B: centre (5.5, 2.5) in cell (5, 2), one of A's
        // neighbours, 2 × 1 cells: its centre takes the cell, and no neighbour is inside it.
        // C: centre (6.5, 4.5) in cell (6, 4), 4 × 4 cells: its neighbour (5, 4) is A's, and
        // A keeps it. D: 0..8 px, one cell: no neighbours.
        let boxes: &[(u32, [f32; 4])] = &[
            (0, [4.0, 0.0, 68.0, 48.0]),
            (0, [36.0, 16.0, 52.0, 24.0]),
            (1, [36.0, 20.0, 68.0, 52.0]),
            (1, [0.0, 56.0, 8.0, 64.0]),
        ];
        let recs = records(16, 256, &[boxes]);
        let o = Targets {
            neighbour_weight: 0.25,
            ..op(1, 4, 256, false)
        };
        let mut t = vec![f32::NAN; o.output_len()];
        render_targets(&o, &recs, &mut t);
        let plane = 64;
        let cell = |x: usize, y: usize| y * 8 + x;
        let mask = |x, y| t[6 * plane + cell(x, y)];
        let offset = |x, y| (t[2 * plane + cell(x, y)], t[3 * plane + cell(x, y)]);
        for (x, y) in [(3, 2), (4, 2), (3, 3), (5, 3), (3, 4), (4, 4), (5, 4)] {
            assert_eq!(mask(x, y), 0.25, "A's neighbour ({x}, {y})");
            assert_eq!(offset(x, y), (4.5 - x as f32, 3.0 - y as f32), "({x}, {y})");
            assert!((t[4 * plane + cell(x, y)] - 8.0f32.ln()).abs() < 1e-7);
            assert!((t[5 * plane + cell(x, y)] - 6.0f32.ln()).abs() < 1e-7);
        }
        assert_eq!(
            (mask(4, 3), mask(5, 2), mask(6, 4), mask(0, 7)),
            (1.0, 1.0, 1.0, 1.0)
        );
        assert_eq!(offset(5, 2), (0.5, 0.5), "B's centre over A's neighbour");
        let around_c = [(6, 3), (7, 3), (7, 4), (5, 5), (6, 5), (7, 5)];
        assert!(around_c.iter().all(|&(x, y)| mask(x, y) == 0.25), "C's own");
        assert_eq!(offset(6, 5), (0.5, -0.5));
        assert_eq!(offset(5, 3), (-0.5, 0.0), "A's neighbour before C's");
        // A's 8 − 1 (B's centre), C's 8 − 2 (A's), none for B and D; four centres.
        assert_eq!(t[6 * plane..].iter().filter(|&&m| m == 0.25).count(), 13);
        assert_eq!(t[6 * plane..].iter().filter(|&&m| m == 1.0).count(), 4);
    }

    #[test]
    fn a_wider_reach_trains_more_cells_of_a_large_box_only() {
        // A: 8 × 6 cells around cell (4, 3): every cell within 2 lies inside it (24). B: 3 × 3
        // cells, centre (1.5, 6.5) in cell (1, 6): the cells two away lie outside it, so it
        // trains its 3×3 block only: eight cells, less (2, 5) when A's reach takes it first.
        let boxes: &[(u32, [f32; 4])] =
            &[(0, [4.0, 0.0, 68.0, 48.0]), (1, [0.0, 40.0, 24.0, 64.0])];
        let recs = records(16, 256, &[boxes]);
        let masks = |radius| {
            let o = Targets {
                neighbour_weight: 0.5,
                neighbour_radius: radius,
                ..op(1, 4, 256, false)
            };
            let mut t = vec![f32::NAN; o.output_len()];
            render_targets(&o, &recs, &mut t);
            let m: Vec<f32> = t[6 * 64..7 * 64].to_vec();
            let offsets = (t[2 * 64..3 * 64].to_vec(), t[3 * 64..4 * 64].to_vec());
            (m, offsets)
        };
        let count = |m: &[f32], w| m.iter().filter(|&&v| v == w).count();
        let (near, _) = masks(1);
        assert_eq!((count(&near, 0.5), count(&near, 1.0)), (8 + 8, 2));
        let (far, (ox, oy)) = masks(2);
        assert_eq!((count(&far, 0.5), count(&far, 1.0)), (24 + 7, 2));
        for y in 1..=5usize {
            for x in 2..=6usize {
                assert_eq!(far[y * 8 + x], if (x, y) == (4, 3) { 1.0 } else { 0.5 });
                assert_eq!(
                    (ox[y * 8 + x], oy[y * 8 + x]),
                    (4.5 - x as f32, 3.0 - y as f32)
                );
            }
        }
        assert_eq!(far[6 * 8 + 3], 0.0, "two from B's centre, outside B");
    }

    #[test]
    fn a_cap_on_neighbour_cells_shares_a_large_box_weight_out() {
        // As above at reach 2, at most 8 cells in full: A's 24 neighbours weigh 0.5 · 8/24
        // each (4 together, as its 3×3 block did), B's 8 weigh 0.5 and so take (2, 5) from
        // A, whose neighbours they are too.
        let boxes: &[(u32, [f32; 4])] =
            &[(0, [4.0, 0.0, 68.0, 48.0]), (1, [0.0, 40.0, 24.0, 64.0])];
        let o = Targets {
            neighbour_weight: 0.5,
            neighbour_radius: 2,
            neighbour_cells: 8,
            ..op(1, 4, 256, false)
        };
        let mut t = vec![f32::NAN; o.output_len()];
        render_targets(&o, &records(16, 256, &[boxes]), &mut t);
        let m = &t[6 * 64..7 * 64];
        let shared = 0.5 * (8.0 / 24.0);
        assert_eq!(m.iter().filter(|&&v| v == shared).count(), 23);
        assert_eq!(m.iter().filter(|&&v| v == 0.5).count(), 8);
        assert_eq!(
            m[5 * 8 + 2],
            0.5,
            "the smaller box's neighbour wins the shared cell"
        );
        assert_eq!(t[2 * 64 + 5 * 8 + 2], 1.5 - 2.0, "with B's offset");
        // At most 8 cells changes nothing where no box has more.
        let mut near = vec![f32::NAN; o.output_len()];
        let limited = Targets {
            neighbour_radius: 1,
            ..o
        };
        render_targets(&limited, &records(16, 256, &[boxes]), &mut near);
        let mut plain = vec![f32::NAN; o.output_len()];
        let unlimited = Targets {
            neighbour_cells: 0,
            ..limited
        };
        render_targets(&unlimited, &records(16, 256, &[boxes]), &mut plain);
        assert_eq!(near, plain);
    }

    #[test]
    fn flip_mirrors_and_bad_boxes_are_skipped() {
        let boxes: &[(u32, [f32; 4])] = &[
            (0, [0.0, 0.0, 16.0, 16.0]),
            (5, [0.0, 0.0, 16.0, 16.0]),    // class out of range
            (1, [30.0, 0.0, 30.0, 16.0]),   // zero width
            (1, [f32::NAN, 0.0, 9.0, 9.0]), // not finite
        ];
        let recs = records(16, 256, &[boxes, &[]]);
        let o = op(2, 4, 256, true);
        let mut t = vec![0.0; o.output_len()];
        render_targets(&o, &recs, &mut t);
        // Mirrored: 48..64 px → centre 7.0 cells, clamped to column 7, offset 0.
        let plane = 64;
        assert_eq!(t[8 + 7], 1.0);
        assert_eq!(t[6 * plane + 8 + 7], 1.0);
        assert_eq!(
            t[6 * plane..7 * plane].iter().sum::<f32>(),
            1.0,
            "one centre only"
        );
        assert!(
            t[7 * plane..].iter().all(|&v| v == 0.0),
            "second record has no boxes"
        );
    }

    #[test]
    fn box_count_is_capped_by_max_boxes() {
        let boxes: &[(u32, [f32; 4])] = &[(0, [0.0, 0.0, 8.0, 8.0]), (1, [0.0, 0.0, 8.0, 8.0])];
        let recs = records(16, 256, &[boxes]);
        let o = op(1, 1, 256, false);
        let mut t = vec![0.0; o.output_len()];
        render_targets(&o, &recs, &mut t);
        assert_eq!(t[0], 1.0);
        assert!(t[64..128].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn each_box_lands_on_the_level_its_size_picks() {
        // 128 × 128 input, strides 8/16/32: grids 16×16, 8×8, 4×4 (336 cells a plane). A
        // 40 px box goes to stride 8 (under 6 × 8 px), a 60 px one to stride 16 (under
        // 6 × 16 px), a 100 px one to stride 32.
        let levels = Levels::new(&[8, 16, 32], 128, 128);
        assert_eq!(
            (levels.total_cells(), levels.offset(1), levels.offset(2)),
            (336, 256, 320)
        );
        assert_eq!(
            [47.9, 48.0, 95.9, 96.0].map(|side| levels.level_of(side)),
            [0, 1, 1, 2]
        );
        let boxes = [
            (0, [0.0, 0.0, 40.0, 40.0]),
            (1, [16.0, 16.0, 76.0, 76.0]),
            (0, [14.0, 14.0, 114.0, 114.0]),
        ];
        let recs = records(16, 256, &[&boxes]);
        let o = Targets {
            levels,
            ..op(1, 4, 256, false)
        };
        let mut t = vec![f32::NAN; o.output_len()];
        render_targets(&o, &recs, &mut t);
        let plane = 336;
        let mask = &t[6 * plane..7 * plane];
        let centres: Vec<usize> = (0..plane).filter(|&i| mask[i] == 1.0).collect();
        // Centres: (20, 20) px → cell (2, 2) of level 0; (46, 46) → (2, 2) of level 1;
        // (64, 64) → (2, 2) of level 2.
        assert_eq!(centres, vec![2 * 16 + 2, 256 + 2 * 8 + 2, 320 + 2 * 4 + 2]);
        assert_eq!(t[34], 1.0, "class 0 peak at level 0");
        assert_eq!(t[plane + 274], 1.0, "class 1 peak at level 1");
        assert_eq!(t[330], 1.0, "class 0 peak at level 2");
        // Sizes are in the level's cells: 40 px at stride 8 is 5 cells, 60 px at stride 16
        // 3.75, 100 px at stride 32 3.125.
        assert!((t[4 * plane + 34] - 5.0f32.ln()).abs() < 1e-6);
        assert!((t[4 * plane + 274] - 3.75f32.ln()).abs() < 1e-6);
        assert!((t[5 * plane + 330] - 3.125f32.ln()).abs() < 1e-6);
        // Class 1's heat is at level 1 alone: the others' boxes are class 0.
        let class1 = &t[plane..2 * plane];
        assert!(class1[..256]
            .iter()
            .chain(&class1[320..])
            .all(|&v| v == 0.0));
    }
}
