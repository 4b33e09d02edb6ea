//! Mosaic: a record replaced by four records of its batch, tiled around a random centre.
//!
//! A small dataset shows each object in few contexts and at few sizes. A mosaic (YOLOv4's, and
//! its successors') shows four photos at once, cut at a random centre and scaled, so objects
//! appear smaller, cut by borders and next to things they never stood next to.
//!
//! **Groups.** The four come from the record's *group*: batch positions `4g .. 4g + 4` (the last
//! group of a batch that is not a multiple of [`GROUP`] is shorter, and its mosaics show a
//! member more than once). A loader's unit of work holds whole groups
//! ([`super::LoaderConfig::part_records`] is a multiple of [`GROUP`] when mosaics are on), so
//! what a record becomes does not depend on the number of loaders: a run resumed or retuned
//! mid-way trains on the same bytes. The group is copied to scratch first, so every member's
//! mosaic sees the others as they came off disk, whatever order they are changed in.
//!
//! **Geometry**, with `W × H` the record size. Picture a `2W × 2H` canvas with centre
//! `C = (W + jx, H + jy)`, `jx`, `jy` uniform in `±W/4`, `±H/4`; quadrant `q` (0 top left,
//! 1 top right, 2 bottom left, 3 bottom right) holds one whole record with a corner at `C`.
//! The output is the canvas scaled by `s` (uniform in `mosaic_scale`) about the canvas centre
//! `(W, H)`, which lands on the output's centre: canvas `u` goes to `x = (u − W)·s + W/2`.
//! Which member fills which quadrant is a random permutation. Pixels are resampled by nearest
//! neighbour through separable row and column maps, as in [`super::augment`]; canvas outside
//! the four records is the pad colour.
//!
//! **Boxes** move with their quadrant and are clipped and dropped by the rules of
//! [`super::augment`] (its `MIN_BOX_SIDE` and `MIN_VISIBLE_FRACTION`). When more boxes survive
//! than a record holds (`max_boxes`), the record gets its plain augmentation instead of a
//! mosaic: dropping the labels of visible objects would teach the model they are background.
//!
//! After a mosaic, the flip and colour changes of [`super::augment`] apply, drawn from the
//! record's seed as usual; its scale/translate crop does not (the mosaic has its own). The
//! mosaic's draws come from a separate stream of the same seed. Nothing is allocated after
//! [`Mosaic::new`].

use super::augment::{
    clip_to_image, gather_row, AugmentConfig, AugmentParams, Augmenter, PAD_VALUE,
};
use crate::base::{derive_seed, SplitMix64};
use crate::format::{RecordBox, RecordLayout};

/// Batch positions per group: the records one mosaic is made of.
pub const GROUP: usize = 4;

/// Salt of the mosaic's random stream (distinct from the plain augmentation's).
const STREAM: u64 = 0x6d6f_7361_6963;

/// Row-map entry for an output row whose source is outside every record.
const OUTSIDE: u32 = u32::MAX;
/// Row-map flag: the row comes from the bottom records (quadrants 2 and 3).
const BOTTOM: u32 = 1 << 31;

/// The random choices of one mosaic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MosaicParams {
    /// The canvas centre's offset from `(W, H)`, in pixels.
    pub jx: f32,
    pub jy: f32,
    /// Scale of the canvas.
    pub scale: f32,
    /// Which member (counted from this record, modulo the group's size) fills each quadrant.
    pub members: [u8; GROUP],
}

/// What [`Mosaic::apply_group`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupApplied {
    /// Records that became mosaics.
    pub mosaics: u32,
    /// Records drawn for a mosaic that got their plain augmentation instead (too many boxes).
    pub too_many_boxes: u32,
}

/// Makes mosaics for one loader thread; all memory is allocated in [`Mosaic::new`].
#[derive(Debug, Clone)]
pub struct Mosaic {
    layout: RecordLayout,
    prob: f32,
    scale: (f32, f32),
    /// The group's records as they came off disk: image then metadata, one after another.
    originals: Vec<u8>,
    /// Output row → source row (with [`BOTTOM`]), or [`OUTSIDE`].
    row_map: Vec<u32>,
    /// Output column → byte offset of the source pixel in its row (valid columns only).
    col_map: Vec<u32>,
}

impl Mosaic {
    /// Heap bytes [`Mosaic::new`] allocates for `layout`: what the memory budget counts.
    pub fn scratch_bytes(layout: &RecordLayout) -> usize {
        GROUP * (layout.image_bytes + layout.meta_bytes)
            + std::mem::size_of::<u32>() * (layout.width + layout.height) as usize
    }

    /// Takes its probability and scale range from `config` (validate it first).
    pub fn new(layout: RecordLayout, config: &AugmentConfig) -> Self {
        Mosaic {
            layout,
            prob: config.mosaic_prob,
            scale: config.mosaic_scale,
            originals: vec![0; GROUP * (layout.image_bytes + layout.meta_bytes)],
            row_map: vec![OUTSIDE; layout.height as usize],
            col_map: vec![0; layout.width as usize],
        }
    }

    /// Whether the record with augmentation seed `seed` becomes a mosaic, and how: a pure
    /// function of the config and the seed.
    pub fn params(&self, seed: u64) -> Option<MosaicParams> {
        let mut rng = SplitMix64::new(derive_seed(&[seed, STREAM]));
        // A fixed number of draws, so every choice has a fixed place in the stream.
        let u: [f32; 7] = std::array::from_fn(|_| rng.next_f32());
        if u[0] >= self.prob {
            return None;
        }
        let signed = |u: f32| 2.0 * u - 1.0;
        let mut members = [0, 1, 2, 3];
        for (i, &ui) in u[4..7].iter().enumerate() {
            // Fisher–Yates: swap position i with a uniform one of i..4.
            let k = i + ((ui * (GROUP - i) as f32) as usize).min(GROUP - 1 - i);
            members.swap(i, k);
        }
        Some(MosaicParams {
            jx: signed(u[1]) * self.layout.width as f32 / 4.0,
            jy: signed(u[2]) * self.layout.height as f32 / 4.0,
            scale: self.scale.0 + (self.scale.1 - self.scale.0) * u[3],
            members,
        })
    }

    /// Augments the `records.len() / record_size` (at most [`GROUP`]) records of one group in
    /// place: each becomes a mosaic of the group or gets its plain augmentation, as its seed
    /// (`seed_of(member)`) draws. Allocates nothing.
    pub fn apply_group(
        &mut self,
        augmenter: &mut Augmenter,
        records: &mut [u8],
        seed_of: impl Fn(usize) -> u64,
    ) -> GroupApplied {
        let l = self.layout;
        let n = records.len() / l.record_size;
        assert!(
            (1..=GROUP).contains(&n),
            "a group holds 1 to {GROUP} records, not {n}"
        );
        let mut applied = GroupApplied::default();
        let draws: [Option<MosaicParams>; GROUP] =
            std::array::from_fn(|j| if j < n { self.params(seed_of(j)) } else { None });
        if draws.iter().any(Option::is_some) {
            let prefix = l.image_bytes + l.meta_bytes;
            for j in 0..n {
                let record = &records[j * l.record_size..][..prefix];
                self.originals[j * prefix..][..prefix].copy_from_slice(record);
            }
        }
        for (j, draw) in draws.iter().enumerate().take(n) {
            let record = &mut records[j * l.record_size..][..l.record_size];
            let seed = seed_of(j);
            let made = draw.is_some_and(|p| self.compose(record, j, n, &p));
            if made {
                applied.mosaics += 1;
                let p = AugmentParams {
                    geometric: false,
                    scale: 1.0,
                    tx: 0.0,
                    ty: 0.0,
                    ..augmenter.params(seed)
                };
                augmenter.apply_params(record, &p);
            } else {
                applied.too_many_boxes += u32::from(draw.is_some());
                augmenter.apply(record, seed);
            }
        }
        applied
    }

    /// The original record of the member in quadrant `q` of member `j`'s mosaic.
    fn original(&self, p: &MosaicParams, j: usize, n: usize, q: usize) -> &[u8] {
        let prefix = self.layout.image_bytes + self.layout.meta_bytes;
        let m = (j + p.members[q] as usize) % n;
        &self.originals[m * prefix..][..prefix]
    }

    /// Writes member `j`'s mosaic into `record`; false (and `record` untouched) when its
    /// boxes would not fit.
    fn compose(&mut self, record: &mut [u8], j: usize, n: usize, p: &MosaicParams) -> bool {
        let l = self.layout;
        let mut kept = 0usize;
        for q in 0..GROUP {
            let src = self.original(p, j, n, q);
            kept += (0..l.box_count(src) as usize)
                .filter(|&i| self.place_box(&l.read_box(src, i), q, p).is_some())
                .count();
        }
        if kept > l.max_boxes as usize {
            return false;
        }
        let before = l.box_count(record) as usize;
        let mut k = 0;
        for q in 0..GROUP {
            let src = self.original(p, j, n, q);
            for i in 0..l.box_count(src) as usize {
                if let Some(b) = self.place_box(&l.read_box(src, i), q, p) {
                    l.write_box(record, k, &b);
                    k += 1;
                }
            }
        }
        for i in k..before.max(k) {
            l.write_box(record, i, &RecordBox::default());
        }
        l.set_box_count(record, k as u16);
        self.compose_pixels(l.image_mut(record), j, n, p);
        true
    }

    /// Box `b` of the record in quadrant `q`, moved onto the output and clipped; `None` when
    /// too little of it is left.
    fn place_box(&self, b: &RecordBox, q: usize, p: &MosaicParams) -> Option<RecordBox> {
        let (w, h) = (self.layout.width as f32, self.layout.height as f32);
        // Source v sits at canvas v + j + side·S; canvas u at output (u − S)·s + S/2.
        let place = |v: f32, size: f32, j: f32, side: usize| {
            (v + j + side as f32 * size - size) * p.scale + size / 2.0
        };
        let (sx, sy) = (q & 1, q >> 1);
        let moved = RecordBox {
            x0: place(b.x0, w, p.jx, sx),
            y0: place(b.y0, h, p.jy, sy),
            x1: place(b.x1, w, p.jx, sx),
            y1: place(b.y1, h, p.jy, sy),
            ..*b
        };
        let (clipped, visible) = clip_to_image(&moved, w, h);
        visible.then_some(clipped)
    }

    fn compose_pixels(&mut self, image: &mut [u8], j: usize, n: usize, p: &MosaicParams) {
        let (w, h) = (self.layout.width as usize, self.layout.height as usize);
        let w3 = w * 3;
        let scale = p.scale as f64;
        // Output centre `o + 0.5` is canvas `u = (o + 0.5 − S/2)/s + S`: in the first record
        // of its axis at `u − j` while `u < S + j`, else in the second at `u − S − j`.
        let source = |o: usize, size: usize, jitter: f32| -> (bool, Option<u32>) {
            let s = size as f64;
            let u = (o as f64 + 0.5 - s / 2.0) / scale + s - jitter as f64;
            if u < s {
                (false, (u >= 0.0).then_some(u.floor() as u32))
            } else {
                let v = (u - s).floor();
                (true, (v < s).then_some(v as u32))
            }
        };
        for (y, r) in self.row_map.iter_mut().enumerate() {
            *r = match source(y, h, p.jy) {
                (bottom, Some(sy)) => sy | if bottom { BOTTOM } else { 0 },
                (_, None) => OUTSIDE,
            };
        }
        // Columns are monotone in the canvas: outside, left record, right record, outside.
        let (mut x_lo, mut x_mid, mut x_hi) = (0, 0, 0);
        for (x, m) in self.col_map.iter_mut().enumerate() {
            let (right, sx) = source(x, w, p.jx);
            if !right {
                x_mid = x + 1;
            }
            match sx {
                Some(sx) => {
                    *m = sx * 3;
                    if right {
                        x_hi = x + 1;
                    }
                }
                None if !right => x_lo = x + 1,
                None => {}
            }
        }
        let x_hi = x_hi.max(x_mid);
        for y in 0..h {
            let dst = &mut image[y * w3..(y + 1) * w3];
            let r = self.row_map[y];
            if r == OUTSIDE {
                dst.fill(PAD_VALUE);
                continue;
            }
            let (sy, top) = ((r & !BOTTOM) as usize, 2 * usize::from(r & BOTTOM != 0));
            let row = |q: usize| &self.original(p, j, n, top + q)[sy * w3..(sy + 1) * w3];
            let (pad_left, rest) = dst.split_at_mut(x_lo * 3);
            let (left, rest) = rest.split_at_mut((x_mid - x_lo) * 3);
            let (right, pad_right) = rest.split_at_mut((x_hi - x_mid) * 3);
            pad_left.fill(PAD_VALUE);
            pad_right.fill(PAD_VALUE);
            let identity = &IDENTITY_LUT;
            gather_row::<false>(left, row(0), &self.col_map[x_lo..x_mid], identity);
            gather_row::<false>(right, row(1), &self.col_map[x_mid..x_hi], identity);
        }
    }
}

/// `gather_row` without a table reads none; it still takes one.
static IDENTITY_LUT: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::RecordMeta;
    use crate::loader::augment::tests::{allocations_during, boxes, bx, px};

    const CLASSES: u32 = 5;

    fn layout(w: u32, h: u32, max_boxes: u32) -> RecordLayout {
        RecordLayout::new(w, h, 3, max_boxes).unwrap()
    }

    /// `n` records of random pixels, record `m` holding `boxes(m)`, one after another.
    fn group(l: &RecordLayout, n: usize, boxes: impl Fn(usize) -> Vec<RecordBox>) -> Vec<u8> {
        let mut rng = SplitMix64::new(7);
        let mut out = vec![0; n * l.record_size];
        for (m, rec) in out.chunks_exact_mut(l.record_size).enumerate() {
            let image: Vec<u8> = (0..l.image_bytes).map(|_| rng.next_u64() as u8).collect();
            l.encode(rec, &image, &RecordMeta::default(), &boxes(m));
        }
        out
    }

    /// A mosaic maker with every member's originals loaded from `records`.
    fn loaded(l: RecordLayout, records: &[u8]) -> Mosaic {
        let mut m = Mosaic::new(
            l,
            &AugmentConfig {
                mosaic_prob: 1.0,
                ..AugmentConfig::default()
            },
        );
        let prefix = l.image_bytes + l.meta_bytes;
        for (j, rec) in records.chunks_exact(l.record_size).enumerate() {
            m.originals[j * prefix..][..prefix].copy_from_slice(&rec[..prefix]);
        }
        m
    }

    #[test]
    fn at_scale_one_each_quadrant_shows_the_inner_quarter_of_its_record() {
        let l = layout(32, 24, 8);
        // Member m has one box in its inner corner (the one that meets the centre).
        let corner = |m: usize| {
            let (x, y) = (
                if m & 1 == 0 { 20.0 } else { 2.0 },
                if m < 2 { 14.0 } else { 3.0 },
            );
            vec![bx(m as u32, x, y, x + 6.0, y + 5.0)]
        };
        let records = group(&l, 4, corner);
        let mut mosaic = loaded(l, &records);
        let p = MosaicParams {
            jx: 0.0,
            jy: 0.0,
            scale: 1.0,
            members: [0, 1, 2, 3],
        };
        let mut out = records[..l.record_size].to_vec();
        assert!(mosaic.compose(&mut out, 0, 4, &p));
        let src = |m: usize| &records[m * l.record_size..][..l.record_size];
        for y in 0..24 {
            for x in 0..32 {
                let (right, bottom) = (x >= 16, y >= 12);
                let m = usize::from(right) + 2 * usize::from(bottom);
                let (sx, sy) = (
                    if right { x - 16 } else { x + 16 },
                    if bottom { y - 12 } else { y + 12 },
                );
                assert_eq!(px(&l, &out, x, y), px(&l, src(m), sx, sy), "({x}, {y})");
            }
        }
        // Every box moved with its record: by ∓16 across, ∓12 down (− left/top, + right/bottom).
        let expected: Vec<RecordBox> = (0..4)
            .map(|m| {
                let b = corner(m)[0];
                let (dx, dy) = (
                    if m & 1 == 0 { -16.0 } else { 16.0 },
                    if m < 2 { -12.0 } else { 12.0 },
                );
                bx(b.class, b.x0 + dx, b.y0 + dy, b.x1 + dx, b.y1 + dy)
            })
            .collect();
        assert_eq!(boxes(&l, &out), expected);
        l.check_boxes(&out, CLASSES).unwrap();
    }

    #[test]
    fn at_scale_one_half_the_whole_records_are_shrunk_and_shifted_by_the_centre() {
        let l = layout(32, 32, 8);
        let records = group(&l, 4, |m| vec![bx(m as u32, 0.0, 0.0, 32.0, 32.0)]);
        let mut mosaic = loaded(l, &records);
        // Canvas centre 4 px right of the middle: at scale ½ the seam is at x = 16 + 2.
        let p = MosaicParams {
            jx: 4.0,
            jy: 0.0,
            scale: 0.5,
            members: [3, 2, 1, 0],
        };
        let mut out = records[l.record_size..2 * l.record_size].to_vec();
        // Member 1's mosaic: quadrant q shows member (1 + members[q]) % 4.
        assert!(mosaic.compose(&mut out, 1, 4, &p));
        let src = |m: usize| &records[m * l.record_size..][..l.record_size];
        // Output x ↦ canvas u = 2x + 1 (pixel centres), in the left record at u − 4.
        assert_eq!(
            px(&l, &out, 0, 0),
            [PAD_VALUE; 3],
            "left of the left record"
        );
        assert_eq!(
            px(&l, &out, 5, 3),
            px(&l, src(0), 2 * 5 + 1 - 4, 7),
            "top left: member 0"
        );
        assert_eq!(
            px(&l, &out, 20, 3),
            px(&l, src(3), 2 * 20 + 1 - 36, 7),
            "top right: member 3"
        );
        assert_eq!(
            px(&l, &out, 5, 20),
            px(&l, src(2), 7, 2 * 20 + 1 - 32),
            "bottom left: member 2"
        );
        assert_eq!(
            px(&l, &out, 31, 31),
            px(&l, src(1), 63 - 36, 31),
            "bottom right: member 1"
        );
        let classes: Vec<u32> = boxes(&l, &out).iter().map(|b| b.class).collect();
        assert_eq!(classes, [0, 3, 2, 1]);
        assert_eq!(boxes(&l, &out)[0], bx(0, 2.0, 0.0, 18.0, 16.0));
        assert_eq!(
            boxes(&l, &out)[3],
            bx(1, 18.0, 16.0, 32.0, 32.0),
            "clipped at the right"
        );
    }

    #[test]
    fn a_mosaic_whose_boxes_do_not_fit_is_plain_augmentation_instead() {
        let l = layout(32, 32, 4);
        // Two boxes in each member, spread so that most survive any mosaic at scale ½.
        let records = group(&l, 4, |m| {
            let c = m as u32;
            vec![bx(c, 1.0, 1.0, 15.0, 15.0), bx(c, 17.0, 17.0, 31.0, 31.0)]
        });
        let config = AugmentConfig {
            mosaic_prob: 1.0,
            mosaic_scale: (0.5, 0.5),
            ..AugmentConfig::default()
        };
        let mut mosaic = Mosaic::new(l, &config);
        let mut augmenter = Augmenter::new(l, config);
        let mut out = records.clone();
        let applied = mosaic.apply_group(&mut augmenter, &mut out, |m| 100 + m as u64);
        assert_eq!(
            applied,
            GroupApplied {
                mosaics: 0,
                too_many_boxes: 4
            }
        );
        for (m, rec) in out.chunks_exact_mut(l.record_size).enumerate() {
            let mut plain = records[m * l.record_size..][..l.record_size].to_vec();
            augmenter.apply(&mut plain, 100 + m as u64);
            assert!(plain == rec, "member {m} is its plain augmentation");
        }
    }

    #[test]
    fn groups_are_deterministic_valid_and_allocate_nothing() {
        let l = layout(48, 40, 16);
        let records = group(&l, 3, |m| {
            (0..3)
                .map(|k| {
                    bx(
                        m as u32 % CLASSES,
                        2.0 + 9.0 * k as f32,
                        4.0,
                        12.0 + 9.0 * k as f32,
                        30.0,
                    )
                })
                .collect()
        });
        let config = AugmentConfig {
            mosaic_prob: 0.7,
            ..AugmentConfig::default()
        };
        let mut mosaic = Mosaic::new(l, &config);
        let mut augmenter = Augmenter::new(l, config);
        let mut made = 0;
        for round in 0..40u64 {
            let mut a = records.clone();
            let mut b = records.clone();
            let (applied, allocations) = allocations_during(|| {
                mosaic.apply_group(&mut augmenter, &mut a, |m| round * 10 + m as u64)
            });
            assert_eq!(allocations, 0);
            mosaic.apply_group(&mut augmenter, &mut b, |m| round * 10 + m as u64);
            assert!(a == b, "round {round}: same seeds, other bytes");
            for rec in a.chunks_exact(l.record_size) {
                l.check_boxes(rec, CLASSES).unwrap();
            }
            made += applied.mosaics;
        }
        // 120 draws at 0.7: far from none and from all.
        assert!((60..=105).contains(&made), "{made} mosaics");
    }

    #[test]
    fn params_follow_the_config() {
        let l = layout(64, 32, 4);
        let config = AugmentConfig {
            mosaic_prob: 0.5,
            mosaic_scale: (0.6, 0.9),
            ..AugmentConfig::default()
        };
        let mosaic = Mosaic::new(l, &config);
        let draws: Vec<MosaicParams> = (0..400).filter_map(|s| mosaic.params(s)).collect();
        assert!((150..250).contains(&draws.len()), "{}", draws.len());
        for p in &draws {
            assert!((0.6..=0.9).contains(&p.scale), "{p:?}");
            assert!(p.jx.abs() <= 16.0 && p.jy.abs() <= 8.0, "{p:?}");
            let mut sorted = p.members;
            sorted.sort();
            assert_eq!(sorted, [0, 1, 2, 3], "{p:?}");
        }
        let firsts: std::collections::BTreeSet<u8> = draws.iter().map(|p| p.members[0]).collect();
        assert_eq!(firsts.len(), 4, "every member lands top left sometimes");
        assert_eq!(
            Mosaic::new(l, &AugmentConfig::default()).params(3),
            None,
            "off by default"
        );
    }
}
