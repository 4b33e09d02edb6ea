//! A picture of records as the model will see them: a grid of images with their boxes drawn,
//! so that a person can check letterboxing, labels and augmentation at a glance.

use image::{Rgb, RgbImage};

use crate::format::{RecordLayout, FLAG_SUBSTITUTE};

/// Distinct outline colours, cycled by class id.
const PALETTE: [[u8; 3]; 8] = [
    [255, 56, 56],
    [56, 255, 56],
    [56, 120, 255],
    [255, 210, 30],
    [255, 56, 255],
    [30, 230, 230],
    [255, 140, 20],
    [160, 90, 255],
];

/// Lays `records` out `columns` wide, 2 px apart, with each record's boxes outlined in its
/// class colour; substitutes for corrupt records get a red cross.
pub fn grid<'a>(
    layout: &RecordLayout,
    records: impl ExactSizeIterator<Item = &'a [u8]>,
    columns: usize,
) -> RgbImage {
    const GAP: u32 = 2;
    let (w, h) = (layout.width, layout.height);
    let n = records.len().max(1);
    let columns = columns.clamp(1, n) as u32;
    let rows = (n as u32).div_ceil(columns);
    let mut out = RgbImage::from_pixel(
        columns * (w + GAP) - GAP,
        rows * (h + GAP) - GAP,
        Rgb([32, 32, 32]),
    );
    for (k, record) in records.enumerate() {
        let (x0, y0) = (
            (k as u32 % columns) * (w + GAP),
            (k as u32 / columns) * (h + GAP),
        );
        for (i, px) in layout.image(record).chunks_exact(3).enumerate() {
            out.put_pixel(
                x0 + i as u32 % w,
                y0 + i as u32 / w,
                Rgb([px[0], px[1], px[2]]),
            );
        }
        for b in 0..layout.box_count(record) as usize {
            let bx = layout.read_box(record, b);
            let colour = Rgb(class_colour(bx.class));
            outline(
                &mut out,
                (x0, y0, w, h),
                [bx.x0, bx.y0, bx.x1, bx.y1],
                colour,
                1,
            );
        }
        if layout.read_meta(record).flags & FLAG_SUBSTITUTE != 0 {
            for d in 0..w.min(h) {
                out.put_pixel(x0 + d, y0 + d, Rgb([255, 0, 0]));
                out.put_pixel(x0 + w - 1 - d, y0 + d, Rgb([255, 0, 0]));
            }
        }
    }
    out
}

/// The drawing colour of class `class`.
pub fn class_colour(class: u32) -> [u8; 3] {
    PALETTE[class as usize % PALETTE.len()]
}

/// Outlines box `[x0, y0, x1, y1]` (pixels of a `w × h` picture placed at `(left, top)` in
/// `out`), clamped to the picture, `thickness` pixels wide (inwards).
pub fn outline(
    out: &mut RgbImage,
    (left, top, w, h): (u32, u32, u32, u32),
    [x0, y0, x1, y1]: [f32; 4],
    colour: Rgb<u8>,
    thickness: u32,
) {
    if w == 0 || h == 0 || !(x0.is_finite() && y0.is_finite() && x1.is_finite() && y1.is_finite()) {
        return;
    }
    let clamp = |v: f32, max: u32| (v.max(0.0) as u32).min(max - 1);
    let (l, t) = (clamp(x0, w), clamp(y0, h));
    let (r, b) = (clamp(x1 - 1.0, w), clamp(y1 - 1.0, h));
    for k in 0..thickness {
        let (l, t) = ((l + k).min(r), (t + k).min(b));
        let (r, b) = (r.saturating_sub(k).max(l), b.saturating_sub(k).max(t));
        for x in l..=r {
            out.put_pixel(left + x, top + t, colour);
            out.put_pixel(left + x, top + b, colour);
        }
        for y in t..=b {
            out.put_pixel(left + l, top + y, colour);
            out.put_pixel(left + r, top + y, colour);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{RecordBox, RecordMeta};

    #[test]
    fn draws_images_and_box_outlines_in_a_grid() {
        let layout = RecordLayout::new(16, 16, 3, 4).unwrap();
        let mut rec = vec![0u8; layout.record_size];
        let image = vec![100u8; layout.image_bytes];
        let boxes = [RecordBox {
            class: 1,
            x0: 2.0,
            y0: 3.0,
            x1: 10.0,
            y1: 12.0,
        }];
        layout.encode(&mut rec, &image, &RecordMeta::default(), &boxes);
        let recs = [rec.as_slice(), rec.as_slice(), rec.as_slice()];
        let img = grid(&layout, recs.iter().copied(), 2);
        assert_eq!(img.dimensions(), (34, 34));
        assert_eq!(
            img.get_pixel(5, 5).0,
            [100, 100, 100],
            "inside the box: the image"
        );
        assert_eq!(img.get_pixel(2, 5).0, PALETTE[1], "left edge of the box");
        assert_eq!(img.get_pixel(9, 11).0, PALETTE[1], "bottom-right corner");
        assert_eq!(img.get_pixel(16, 0).0, [32, 32, 32], "the gap");
        assert_eq!(
            img.get_pixel(18 + 2, 5).0,
            PALETTE[1],
            "second image, same box"
        );
        assert_eq!(img.get_pixel(20, 25).0, [32, 32, 32], "empty fourth cell");
    }
}
