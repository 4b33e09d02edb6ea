//! Decoding a source image and letterboxing it (and its boxes) to the square model input.
//!
//! The letterbox itself is the frame pass's ([`crate::pixels`]): the same code for photos
//! here, for `infer` and for camera frames in the daemon. Its geometry is [`Letterbox`]; a
//! source point `(x, y)` maps to `(x · scale + pad_x, y · scale + pad_y)`, exactly as the
//! record format documents.

use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageReader, RgbImage};

use super::source::{BoxUnits, SourceBox};
use super::{Error, Result};
use crate::format::RecordBox;
use crate::pixels::{FramePass, Pixels};

pub use crate::pixels::{Letterbox, PAD_COLOUR};

/// Largest image decoded, in megapixels (a 100 MP photo is 300 MB as RGB: more than a small
/// board should spend on one image that is then shrunk to the model's input).
pub const MAX_DECODE_MEGAPIXELS: u64 = 100;

/// Boxes smaller than this (in packed pixels, either side) after clipping are dropped: nothing
/// that small can be learnt at the model's resolution.
pub const MIN_BOX_SIDE: f32 = 1.0;

/// Letterboxes `src` into `out` (`size × size × 3` bytes, HWC RGB) with `pass` (whose output
/// side is `size`). An image with no pixels gives an all-padding image and scale 0.
pub fn letterbox_with(pass: &mut FramePass, src: &RgbImage, out: &mut [u8]) -> Letterbox {
    match Pixels::rgb8(src) {
        Ok(pixels) => pass
            .run(&pixels, None, out)
            .expect("the whole of a decoded image is a valid region"),
        Err(_) => {
            for px in out.chunks_exact_mut(3) {
                px.copy_from_slice(&PAD_COLOUR);
            }
            Letterbox::place(pass.size(), 0, 0)
        }
    }
}

/// [`letterbox_with`] a pass made for this call: loops should keep a [`FramePass`].
pub fn letterbox_into(src: &RgbImage, size: u32, out: &mut [u8]) -> Letterbox {
    letterbox_with(&mut FramePass::new(size), src, out)
}

/// What happened to one image's boxes in [`map_boxes`]. Every input box is counted in exactly
/// one of `kept`, `dropped` and `over_max`; `clipped` counts kept boxes that were cut at the
/// image border.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BoxStats {
    pub kept: usize,
    /// Kept boxes that reached outside the source image and were cut to it.
    pub clipped: usize,
    /// Boxes under [`MIN_BOX_SIDE`] packed pixels wide or high after clipping (or non-finite).
    pub dropped: usize,
    /// Valid boxes beyond `max_boxes`: the smallest ones (by packed area) go.
    pub over_max: usize,
}

impl std::ops::AddAssign for BoxStats {
    fn add_assign(&mut self, o: Self) {
        self.kept += o.kept;
        self.clipped += o.clipped;
        self.dropped += o.dropped;
        self.over_max += o.over_max;
    }
}

/// Maps source boxes into the letterboxed image of size `size`, replacing `out`'s contents.
///
/// Boxes are first clipped to the source image (`[0, src_w] × [0, src_h]`; a box reaching out
/// of it by more than 1e-3 px counts as clipped), then scaled and shifted by `lb`, and kept
/// inside the content area (so always inside `[0, size]`). When more than `max_boxes` remain,
/// the largest by area are kept — small boxes are the least learnable at this resolution —
/// with ties going to the earlier box; the kept boxes stay in source order. The result passes
/// `RecordLayout::check_boxes` for classes the caller has validated.
#[allow(clippy::too_many_arguments)]
pub fn map_boxes(
    item_boxes: &[SourceBox],
    units: BoxUnits,
    src_w: u32,
    src_h: u32,
    lb: &Letterbox,
    size: u32,
    max_boxes: usize,
    out: &mut Vec<RecordBox>,
) -> BoxStats {
    const SLACK: f32 = 1e-3;
    out.clear();
    let mut stats = BoxStats::default();
    let (sw, sh) = (src_w as f32, src_h as f32);
    let (ux, uy) = match units {
        BoxUnits::Normalized => (sw, sh),
        BoxUnits::Pixels => (1.0, 1.0),
    };
    let (cx0, cy0) = (lb.pad_x, lb.pad_y);
    let cx1 = (lb.pad_x + lb.width as f32).min(size as f32);
    let cy1 = (lb.pad_y + lb.height as f32).min(size as f32);
    let mut clipped = Vec::with_capacity(item_boxes.len());
    for b in item_boxes {
        let (x0, y0, x1, y1) = (b.x0 * ux, b.y0 * uy, b.x1 * ux, b.y1 * uy);
        if ![x0, y0, x1, y1].iter().all(|v| v.is_finite()) {
            stats.dropped += 1;
            continue;
        }
        let was_clipped = x0 < -SLACK || y0 < -SLACK || x1 > sw + SLACK || y1 > sh + SLACK;
        let m = |v: f32, lo: f32, hi: f32, s: f32, pad: f32| v.clamp(lo, hi) * s + pad;
        let r = RecordBox {
            class: b.class,
            x0: m(x0, 0.0, sw, lb.scale, lb.pad_x).clamp(cx0, cx1),
            y0: m(y0, 0.0, sh, lb.scale, lb.pad_y).clamp(cy0, cy1),
            x1: m(x1, 0.0, sw, lb.scale, lb.pad_x).clamp(cx0, cx1),
            y1: m(y1, 0.0, sh, lb.scale, lb.pad_y).clamp(cy0, cy1),
        };
        // `!(a >= b)` also drops NaN (a zero-pixel source gives scale 0).
        if !(r.x1 - r.x0 >= MIN_BOX_SIDE && r.y1 - r.y0 >= MIN_BOX_SIDE) {
            stats.dropped += 1;
            continue;
        }
        clipped.push(was_clipped);
        out.push(r);
    }
    if out.len() > max_boxes {
        let area = |b: &RecordBox| (b.x1 - b.x0) * (b.y1 - b.y0);
        let mut order: Vec<usize> = (0..out.len()).collect();
        order.sort_by(|&a, &b| area(&out[b]).total_cmp(&area(&out[a])).then(a.cmp(&b)));
        let mut keep = vec![false; out.len()];
        for &i in &order[..max_boxes] {
            keep[i] = true;
        }
        stats.over_max = out.len() - max_boxes;
        let mut k = keep.iter();
        out.retain(|_| *k.next().unwrap());
        let mut k = keep.iter();
        clipped.retain(|_| *k.next().unwrap());
    }
    stats.kept = out.len();
    stats.clipped = clipped.iter().filter(|&&c| c).count();
    stats
}

/// Reads and decodes a JPEG or PNG (told apart by content, not extension), applies its EXIF
/// orientation so that boxes drawn on the upright photo match, and converts it to 8-bit RGB
/// (alpha is dropped, grey is expanded). Errors name the file.
pub fn decode_image(path: &Path) -> Result<RgbImage> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    decode_image_bytes(&bytes, path)
}

/// [`decode_image`] of bytes already read (`path` names the image in errors).
pub fn decode_image_bytes(bytes: &[u8], path: &Path) -> Result<RgbImage> {
    decode_image_bytes_within(bytes, path, MAX_DECODE_MEGAPIXELS * 1_000_000)
}

/// [`decode_image_bytes`] under a size limit of `max_pixels` instead of
/// [`MAX_DECODE_MEGAPIXELS`] (the fuzz target's, so that an input declaring a large image costs
/// microseconds, not seconds, of the campaign).
pub(crate) fn decode_image_bytes_within(
    bytes: &[u8],
    path: &Path,
    max_pixels: u64,
) -> Result<RgbImage> {
    let bad = |what: String| Error::UnreadableImage {
        path: path.to_owned(),
        what,
    };
    let reader = ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| bad(e.to_string()))?;
    match reader.format() {
        None => return Err(bad("not a JPEG or PNG file (unrecognised content)".into())),
        Some(image::ImageFormat::Jpeg | image::ImageFormat::Png) => {}
        Some(other) => {
            return Err(bad(format!(
                "a {other:?} image; only JPEG and PNG are read: convert it to PNG"
            )))
        }
    }
    let mut decoder = reader.into_decoder().map_err(|e| bad(e.to_string()))?;
    // The declared size, checked before any pixel is decoded: a header can claim gigapixels.
    let (w, h) = decoder.dimensions();
    let pixels = u64::from(w) * u64::from(h);
    if pixels > max_pixels {
        return Err(bad(format!(
            "{w}×{h} px ({} megapixels) is over the decoding limit of {} megapixels; \
             downscale it",
            pixels / 1_000_000,
            max_pixels as f64 / 1e6
        )));
    }
    let orientation = decoder.orientation().ok();
    let mut img = contain_decoder_panic(|| DynamicImage::from_decoder(decoder))
        .map_err(|panic| {
            bad(format!(
                "the image decoder failed on it ({panic}: a bug in the decoder, set off by \
                 damaged data)"
            ))
        })?
        .map_err(|e| bad(e.to_string()))?;
    if let Some(o) = orientation {
        img.apply_orientation(o);
    }
    Ok(img.into_rgb8())
}

thread_local! {
    /// Set while this thread runs a decoder under [`contain_decoder_panic`].
    static IN_DECODER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A panic inside an image decoder, with its message.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
struct DecoderPanic(String);

/// Runs `decode`, turning a panic inside it into `Err(its message)`.
///
/// Decoders are third-party code fed hostile bytes: fuzzing found zune-jpeg 0.5.15 asserting
/// in its AVX2 upsampler on a 423-byte JPEG (`testdata/images/zune-upsampler-panic.jpg`). One
/// damaged photo must cost its file, not the pack, the daemon or the training run. The panic
/// hook is wrapped once so that a panic contained here prints nothing (other panics print as
/// before); unwinding out of the decoder is ordinary Rust unwinding through safe code.
fn contain_decoder_panic<T>(decode: impl FnOnce() -> T) -> std::result::Result<T, DecoderPanic> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_DECODER.with(|d| d.get()) {
                previous(info);
            }
        }));
    });
    IN_DECODER.with(|d| d.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode));
    IN_DECODER.with(|d| d.set(false));
    result.map_err(|payload| {
        DecoderPanic(
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{RecordLayout, RecordMeta};

    #[test]
    fn wide_image_geometry_and_box_mapping() {
        let src = RgbImage::from_pixel(200, 100, image::Rgb([200, 10, 20]));
        let mut out = vec![0u8; 128 * 128 * 3];
        let lb = letterbox_into(&src, 128, &mut out);
        assert_eq!(
            lb,
            Letterbox {
                scale: 0.64,
                pad_x: 0.0,
                pad_y: 32.0,
                width: 128,
                height: 64
            }
        );
        let px = |x: usize, y: usize| &out[(y * 128 + x) * 3..(y * 128 + x) * 3 + 3];
        assert_eq!(px(0, 31), PAD_COLOUR);
        assert_eq!(px(0, 32), [200, 10, 20]);
        assert_eq!(px(127, 95), [200, 10, 20]);
        assert_eq!(px(64, 96), PAD_COLOUR);

        let boxes = [
            SourceBox {
                class: 1,
                x0: 50.0,
                y0: 25.0,
                x1: 150.0,
                y1: 75.0,
            },
            SourceBox {
                class: 0,
                x0: -20.0,
                y0: 90.0,
                x1: 20.0,
                y1: 130.0,
            }, // clipped
            SourceBox {
                class: 0,
                x0: 10.0,
                y0: 10.0,
                x1: 11.0,
                y1: 50.0,
            }, // 0.64 px wide
            SourceBox {
                class: 0,
                x0: 300.0,
                y0: 10.0,
                x1: 400.0,
                y1: 50.0,
            }, // outside
            SourceBox {
                class: 0,
                x0: f32::NAN,
                y0: 10.0,
                x1: 40.0,
                y1: 50.0,
            },
        ];
        let mut mapped = Vec::new();
        let s = map_boxes(
            &boxes,
            BoxUnits::Pixels,
            200,
            100,
            &lb,
            128,
            32,
            &mut mapped,
        );
        assert_eq!(
            s,
            BoxStats {
                kept: 2,
                clipped: 1,
                dropped: 3,
                over_max: 0
            }
        );
        let near = |a: &RecordBox, b: [f32; 4]| {
            [a.x0, a.y0, a.x1, a.y1]
                .iter()
                .zip(b)
                .all(|(v, w)| (v - w).abs() < 1e-4)
        };
        assert!(
            near(&mapped[0], [32.0, 48.0, 96.0, 80.0]),
            "{:?}",
            mapped[0]
        );
        assert!(near(&mapped[1], [0.0, 89.6, 12.8, 96.0]), "{:?}", mapped[1]);
        assert_eq!((mapped[0].class, mapped[1].class), (1, 0));

        // The same in normalised units; then through a real record.
        let norm = [SourceBox {
            class: 1,
            x0: 0.25,
            y0: 0.25,
            x1: 0.75,
            y1: 0.75,
        }];
        let s = map_boxes(
            &norm,
            BoxUnits::Normalized,
            200,
            100,
            &lb,
            128,
            32,
            &mut mapped,
        );
        assert_eq!((s.kept, s.clipped), (1, 0));
        assert!(
            near(&mapped[0], [32.0, 48.0, 96.0, 80.0]),
            "{:?}",
            mapped[0]
        );
        let layout = RecordLayout::new(128, 128, 3, 32).unwrap();
        let mut rec = vec![0; layout.record_size];
        layout.encode(&mut rec, &out, &RecordMeta::default(), &mapped);
        assert_eq!(layout.check_boxes(&rec, 2), Ok(()));
    }

    #[test]
    fn tall_odd_and_identity_sizes() {
        let mut out = vec![0u8; 128 * 128 * 3];
        let lb = letterbox_into(&RgbImage::new(427, 640), 128, &mut out);
        assert_eq!((lb.width, lb.height, lb.pad_y), (85, 128, 0.0));
        assert_eq!(lb.pad_x, 21.0, "(128 - 85) / 2, the odd pixel goes right");
        assert_eq!(lb.scale, 0.2);

        let mut src = RgbImage::new(128, 128);
        src.put_pixel(3, 5, image::Rgb([1, 2, 3]));
        let lb = letterbox_into(&src, 128, &mut out);
        assert_eq!((lb.scale, lb.pad_x, lb.width), (1.0, 0.0, 128));
        assert_eq!(out, src.as_raw()[..], "same size: copied, not resampled");

        let small = RgbImage::from_pixel(10, 5, image::Rgb([50, 60, 70]));
        let mut o2 = vec![0u8; 16 * 16 * 3];
        let lb = letterbox_into(&small, 16, &mut o2);
        assert_eq!(
            lb,
            Letterbox {
                scale: 1.6,
                pad_x: 0.0,
                pad_y: 4.0,
                width: 16,
                height: 8
            }
        );
        assert_eq!(
            &o2[(8 * 16 + 8) * 3..][..3],
            [50, 60, 70],
            "upscaled flat colour"
        );

        let lb = letterbox_into(&RgbImage::new(0, 0), 16, &mut o2);
        assert!(o2.chunks(3).all(|p| p == PAD_COLOUR));
        let mut m = Vec::new();
        let b = [SourceBox {
            class: 0,
            x0: 0.0,
            y0: 0.0,
            x1: 1.0,
            y1: 1.0,
        }];
        assert_eq!(
            map_boxes(&b, BoxUnits::Normalized, 0, 0, &lb, 16, 4, &mut m).dropped,
            1
        );
    }

    #[test]
    fn over_max_keeps_the_largest_in_source_order() {
        let lb = Letterbox {
            scale: 1.0,
            pad_x: 0.0,
            pad_y: 0.0,
            width: 100,
            height: 100,
        };
        let sq = |c, s: f32| SourceBox {
            class: c,
            x0: 0.0,
            y0: 0.0,
            x1: s,
            y1: s,
        };
        let boxes = [
            sq(0, 10.0),
            sq(1, 50.0),
            sq(2, 5.0),
            sq(3, 50.0),
            sq(4, 20.0),
            sq(5, 50.0),
        ];
        let mut out = Vec::new();
        let s = map_boxes(&boxes, BoxUnits::Pixels, 100, 100, &lb, 100, 3, &mut out);
        assert_eq!(
            s,
            BoxStats {
                kept: 3,
                clipped: 0,
                dropped: 0,
                over_max: 3
            }
        );
        assert_eq!(out.iter().map(|b| b.class).collect::<Vec<_>>(), [1, 3, 5]);
        let s = map_boxes(&boxes, BoxUnits::Pixels, 100, 100, &lb, 100, 4, &mut out);
        assert_eq!(s.over_max, 2);
        assert_eq!(
            out.iter().map(|b| b.class).collect::<Vec<_>>(),
            [1, 3, 4, 5]
        );
        let mut total = s;
        total += s;
        assert_eq!(total.kept, 8);
    }

    #[test]
    fn letterbox_is_deterministic_on_real_content() {
        let src = RgbImage::from_fn(333, 500, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 3) as u8, (x ^ y) as u8])
        });
        let (mut a, mut b) = (vec![0u8; 128 * 128 * 3], vec![1u8; 128 * 128 * 3]);
        assert_eq!(
            letterbox_into(&src, 128, &mut a),
            letterbox_into(&src, 128, &mut b)
        );
        assert_eq!(a, b);
    }

    #[test]
    fn shared_datasets_pack_into_valid_records() {
        let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data");
        if !Path::new(data).is_dir() {
            eprintln!("skipped: {data} not found (shared test data is absent)");
            return;
        }
        let coco = super::super::yolo::import(&Path::new(data).join("coco128"), None).unwrap();
        let raccoon = super::super::voc::import(&Path::new(data).join("raccoon")).unwrap();
        let layout = RecordLayout::new(128, 128, 3, 32).unwrap();
        let mut rec = vec![0; layout.record_size];
        let mut img = vec![0; layout.image_bytes];
        let mut boxes = Vec::new();
        for ds in [coco, raccoon] {
            let mut total = BoxStats::default();
            for item in &ds.items {
                let src = decode_image(&item.image).unwrap();
                let lb = letterbox_into(&src, 128, &mut img);
                assert!(lb.width == 128 || lb.height == 128, "{lb:?}");
                let (w, h) = src.dimensions();
                let s = map_boxes(&item.boxes, item.units, w, h, &lb, 128, 32, &mut boxes);
                assert_eq!(s.kept + s.dropped + s.over_max, item.boxes.len());
                let meta = RecordMeta {
                    source_width: w,
                    source_height: h,
                    ..Default::default()
                };
                layout.encode(&mut rec, &img, &meta, &boxes);
                let classes = ds.class_names.len() as u32;
                assert_eq!(
                    layout.check_boxes(&rec, classes),
                    Ok(()),
                    "{}",
                    item.image.display()
                );
                total += s;
            }
            eprintln!("{} images: {total:?}", ds.items.len());
            assert!(
                total.kept * 10 > (total.kept + total.dropped) * 9,
                "{total:?}"
            );
        }
    }

    #[test]
    fn decode_png_jpeg_by_content_and_name_bad_files() {
        let t = tempfile::tempdir().unwrap();
        let img = RgbImage::from_fn(6, 4, |x, y| image::Rgb([x as u8 * 40, y as u8 * 60, 9]));
        // A PNG with a .jpg name decodes by content.
        let png = t.path().join("really-a-png.jpg");
        img.save_with_format(&png, image::ImageFormat::Png).unwrap();
        assert_eq!(decode_image(&png).unwrap(), img);
        let jpg = t.path().join("x.jpeg");
        img.save(&jpg).unwrap();
        assert_eq!(decode_image(&jpg).unwrap().dimensions(), (6, 4));
        let grey = t.path().join("grey.png");
        image::GrayImage::from_pixel(3, 2, image::Luma([77]))
            .save(&grey)
            .unwrap();
        assert_eq!(
            decode_image(&grey).unwrap().get_pixel(2, 1),
            &image::Rgb([77, 77, 77])
        );

        // EXIF orientation 6 (rotate 90° clockwise): the upright photo is 4 wide, 6 high.
        let exif = [
            &b"II*\0"[..],
            &8u32.to_le_bytes(),
            &1u16.to_le_bytes(),
            &[0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0],
            &0u32.to_le_bytes(),
        ]
        .concat();
        let turned = t.path().join("turned.jpg");
        let mut enc =
            image::codecs::jpeg::JpegEncoder::new(std::fs::File::create(&turned).unwrap());
        image::ImageEncoder::set_exif_metadata(&mut enc, exif).unwrap();
        enc.encode_image(&img).unwrap();
        assert_eq!(decode_image(&turned).unwrap().dimensions(), (4, 6));

        let junk = t.path().join("junk.jpg");
        std::fs::write(&junk, b"this is not an image").unwrap();
        let err = decode_image(&junk).unwrap_err();
        assert!(matches!(err, Error::UnreadableImage { .. }), "{err}");
        assert!(err.to_string().contains("junk.jpg"), "{err}");
        let cut = t.path().join("cut.png");
        let bytes = std::fs::read(&png).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = decode_image(&cut).unwrap_err().to_string();
        assert!(err.contains("cut.png"), "{err}");
        let err = decode_image(&t.path().join("gone.png")).unwrap_err();
        assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("gone.png"));
    }

    /// The odd images a user's folder holds: extreme sizes and aspect ratios, 16-bit, grey,
    /// alpha; each decodes and letterboxes with its content inside the output, and formats
    /// that are not read get an error naming the file and what to do.
    #[test]
    fn odd_images_decode_and_letterbox_or_are_named() {
        use image::{ImageBuffer, Luma, LumaA, Rgb, Rgba};
        let t = tempfile::tempdir().unwrap();
        let save = |name: &str, img: DynamicImage| {
            let path = t.path().join(name);
            img.save_with_format(&path, image::ImageFormat::Png)
                .unwrap();
            path
        };
        let cases = [
            (
                "1x1.png",
                DynamicImage::ImageRgb8(RgbImage::from_pixel(1, 1, Rgb([200, 10, 10]))),
            ),
            (
                "wide.png",
                DynamicImage::ImageRgb8(RgbImage::from_pixel(20000, 20, Rgb([10, 200, 10]))),
            ),
            (
                "tall.png",
                DynamicImage::ImageRgb8(RgbImage::from_pixel(20, 20000, Rgb([10, 10, 200]))),
            ),
            (
                "rgb16.png",
                DynamicImage::ImageRgb16(ImageBuffer::from_pixel(
                    33,
                    17,
                    Rgb([65535u16, 0, 32768]),
                )),
            ),
            (
                "grey16.png",
                DynamicImage::ImageLuma16(ImageBuffer::from_pixel(9, 40, Luma([40000u16]))),
            ),
            (
                "grey-alpha.png",
                DynamicImage::ImageLumaA8(ImageBuffer::from_pixel(12, 12, LumaA([90u8, 0]))),
            ),
            (
                "rgba.png",
                DynamicImage::ImageRgba8(ImageBuffer::from_pixel(50, 30, Rgba([1u8, 2, 3, 128]))),
            ),
        ];
        let mut lb = FramePass::new(64);
        let mut out = vec![0u8; 64 * 64 * 3];
        for (name, img) in cases {
            let (w, h) = (img.width(), img.height());
            let path = save(name, img);
            let decoded = decode_image(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(decoded.dimensions(), (w, h), "{name}");
            let placed = letterbox_with(&mut lb, &decoded, &mut out);
            assert!(
                (1..=64).contains(&placed.width) && (1..=64).contains(&placed.height),
                "{name}: {placed:?}"
            );
            assert!(
                placed.scale.is_finite() && placed.scale > 0.0,
                "{name}: {placed:?}"
            );
            // The image's own colour is where it was placed (not grey padding).
            let (cx, cy) = (
                placed.pad_x as usize + placed.width as usize / 2,
                placed.pad_y as usize + placed.height as usize / 2,
            );
            let at = (cy * 64 + cx) * 3;
            let centre = &out[at..at + 3];
            let want = decoded.get_pixel(w / 2, h / 2).0;
            for c in 0..3 {
                assert!(
                    centre[c].abs_diff(want[c]) <= 2,
                    "{name}: centre {centre:?}, image {want:?}"
                );
            }
        }
        // 16-bit values come down to 8 bits, not wrapped.
        let px = decode_image(&t.path().join("rgb16.png")).unwrap();
        assert_eq!(px.get_pixel(0, 0), &Rgb([255, 0, 128]));

        // A GIF (not read): an error naming the file and the formats that are.
        let gif = t.path().join("anim.gif");
        std::fs::write(&gif, b"GIF89a\x01\x00\x01\x00\x00\x00\x00;").unwrap();
        let err = decode_image(&gif).unwrap_err().to_string();
        assert!(err.contains("anim.gif") && err.contains("PNG"), "{err}");
    }

    /// The size check runs on the declared size, at the limit it is given.
    #[test]
    fn the_size_limit_is_checked_before_decoding() {
        let mut png = Vec::new();
        RgbImage::new(2000, 1600) // 3.2 megapixels
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let path = Path::new("big.png");
        match decode_image_bytes_within(&png, path, 2_000_000) {
            Err(Error::UnreadableImage { what, .. }) => {
                assert!(what.contains("2000×1600 px (3 megapixels)"), "{what}");
                assert!(what.contains("limit of 2 megapixels"), "{what}");
            }
            other => panic!("expected the size limit, got {other:?}"),
        }
        let img = decode_image_bytes_within(&png, path, 2000 * 1600).unwrap();
        assert_eq!(img.dimensions(), (2000, 1600));
    }

    /// Files no encoder in the tree writes (made with Pillow; see testdata/images/README.md).
    #[test]
    fn a_panicking_decoder_is_an_error_about_the_file() {
        // A panic inside the decoder comes back as its message, printing nothing.
        assert_eq!(
            contain_decoder_panic(|| -> u8 { panic!("inner") }),
            Err(DecoderPanic("inner".to_owned()))
        );
        assert_eq!(contain_decoder_panic(|| 7), Ok(7));
        // The JPEG that sets off zune-jpeg's AVX2 upsampler assertion (x86-64 with AVX2;
        // elsewhere its scalar path decodes or refuses it, but never panics either).
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/images/zune-upsampler-panic.jpg");
        #[cfg(target_arch = "x86_64")]
        let avx2 = std::arch::is_x86_feature_detected!("avx2");
        #[cfg(not(target_arch = "x86_64"))]
        let avx2 = false;
        match decode_image(&path) {
            Err(Error::UnreadableImage { path: p, what }) => {
                assert_eq!(p, path);
                if avx2 {
                    assert!(what.contains("decoder failed"), "{what}");
                }
            }
            Ok(_) if !avx2 => {}
            other => panic!("expected an unreadable image, got {other:?}"),
        }
    }

    #[test]
    fn cmyk_jpeg_and_animated_images() {
        let fixture = |name: &str| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/images")
                .join(name)
        };
        let near = |got: &image::Rgb<u8>, want: [u8; 3]| {
            got.0.iter().zip(want).all(|(g, w)| g.abs_diff(w) <= 12)
        };

        // CMYK (Adobe, inverted, as Photoshop writes it): converted to RGB, not read as noise.
        let cmyk = decode_image(&fixture("cmyk.jpg")).unwrap();
        assert_eq!(cmyk.dimensions(), (16, 8));
        assert!(
            near(cmyk.get_pixel(2, 4), [255, 0, 0]),
            "{:?}",
            cmyk.get_pixel(2, 4)
        );
        assert!(
            near(cmyk.get_pixel(13, 4), [0, 0, 255]),
            "{:?}",
            cmyk.get_pixel(13, 4)
        );

        // An animated PNG is its first frame (red; the second is green).
        let apng = decode_image(&fixture("animated.png")).unwrap();
        assert_eq!(apng.dimensions(), (10, 6));
        assert!(
            apng.pixels().all(|p| near(p, [220, 20, 20])),
            "{:?}",
            apng.get_pixel(0, 0)
        );

        // An animated GIF: refused by name, with what to do.
        let err = decode_image(&fixture("animated.gif"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("animated.gif") && err.contains("PNG"), "{err}");
    }
}
