//! Camera frames as the firmware sends them (RGB8, BGR8, RGBA8, BGRA8, GRAY8, YUYV 4:2:2 and
//! NV12 4:2:0, any stride, in the colour space the request names), checked and handed to the
//! frame pass ([`crate::pixels`]) as [`Pixels`].

use fulcrum_board::protocol::{ErrorCode, FrameDesc, FrameSource, PixelFormat, WireError};

use crate::pixels::{Pixels, Rect};

/// A frame's pixels with the description that says how to read them. Built only from a
/// description that passed [`FrameDesc::validate`] and bytes of exactly its length, so every
/// row read stays inside `bytes`.
#[derive(Clone, Copy, Debug)]
pub struct FrameView<'a> {
    desc: FrameDesc,
    bytes: &'a [u8],
}

impl<'a> FrameView<'a> {
    /// `None` if the description is inconsistent or `bytes` is not exactly its length.
    pub fn new(desc: FrameDesc, bytes: &'a [u8]) -> Option<Self> {
        desc.validate().ok()?;
        (bytes.len() == desc.length as usize).then_some(FrameView { desc, bytes })
    }

    pub fn desc(&self) -> &FrameDesc {
        &self.desc
    }

    /// The frame's pixels for the frame pass.
    pub fn pixels(&self) -> Pixels<'a> {
        let d = &self.desc;
        Pixels::new(
            d.format,
            u32::from(d.width),
            u32::from(d.height),
            d.row_stride() as usize,
            d.colour,
            self.bytes,
        )
        .expect("a validated description and bytes of its length make a valid picture")
    }

    /// The part of the frame the request asks to look at (`None`: all of it).
    pub fn crop(&self) -> Option<Rect> {
        (!self.desc.crop.is_whole()).then(|| self.desc.crop.into())
    }
}

/// Why a request's frame cannot be read, before any pixel is touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameRefused {
    /// A side over the daemon's `--max-frame-side`.
    TooLarge { max_side: u16 },
    /// A ring frame with no ring attached.
    NoRing,
    /// The frame's bytes do not lie inside the ring.
    OutsideRing { error: WireError, ring_len: usize },
    /// The description is inconsistent, or the bytes are not its length.
    Mismatch,
}

impl FrameRefused {
    /// The error reply's code.
    pub fn code(&self) -> ErrorCode {
        match self {
            FrameRefused::TooLarge { .. } => ErrorCode::TOO_LARGE,
            FrameRefused::NoRing => ErrorCode::NO_RING,
            FrameRefused::OutsideRing { .. } | FrameRefused::Mismatch => ErrorCode::BAD_FRAME,
        }
    }

    /// What the reply says, after `frame N: `.
    pub fn describe(&self, desc: &FrameDesc, out: &mut impl core::fmt::Write) {
        let _ = match self {
            FrameRefused::TooLarge { max_side } => write!(
                out,
                "{}x{} is over this daemon's {max_side} px limit (--max-frame-side)",
                desc.width, desc.height
            ),
            FrameRefused::NoRing => write!(
                out,
                "it is in the ring, but no ring is attached (send AttachRing first)"
            ),
            FrameRefused::OutsideRing { error, ring_len } => write!(
                out,
                "{error}: offset {} + length {} > ring {ring_len} bytes",
                desc.offset, desc.length
            ),
            FrameRefused::Mismatch => write!(out, "pixels do not match the description"),
        };
    }
}

/// The frame a request describes, checked: its size against `max_side`, its bytes inline or
/// at its place in `ring` (the client's attached ring, if any), and the bytes against the
/// description. What the daemon does with every `Infer` before reading a pixel.
pub fn resolve<'a>(
    desc: FrameDesc,
    inline: &'a [u8],
    ring: Option<&'a [u8]>,
    max_side: u16,
) -> Result<FrameView<'a>, FrameRefused> {
    if desc.width > max_side || desc.height > max_side {
        return Err(FrameRefused::TooLarge { max_side });
    }
    let bytes = match desc.source {
        FrameSource::Inline => inline,
        FrameSource::Ring => {
            let ring = ring.ok_or(FrameRefused::NoRing)?;
            let range =
                desc.ring_range(ring.len() as u64)
                    .map_err(|error| FrameRefused::OutsideRing {
                        error,
                        ring_len: ring.len(),
                    })?;
            &ring[range]
        }
    };
    FrameView::new(desc, bytes).ok_or(FrameRefused::Mismatch)
}

/// RGB to BT.601 limited-range YUV (8-bit fixed point, the usual integer form): for tests and
/// for clients that make camera-like frames from images.
pub fn rgb_to_yuv(rgb: [u8; 3]) -> [u8; 3] {
    let [r, g, b] = rgb.map(i32::from);
    let y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16;
    let u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128;
    let v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128;
    [y, u, v].map(|c| c.clamp(0, 255) as u8)
}

/// Writes an RGB8 image (`width × height`, packed rows) as a frame of `format` into `out`,
/// rows `stride` bytes apart (0: packed); `out` must be the frame's length. Chroma of
/// subsampled formats is the mean of the pixels it covers. For clients and tests.
pub fn encode_frame(
    rgb: &[u8],
    width: u16,
    height: u16,
    format: PixelFormat,
    stride: u32,
    out: &mut [u8],
) {
    let (w, h) = (width as usize, height as usize);
    let stride = if stride == 0 {
        format.row_bytes(width) as usize
    } else {
        stride as usize
    };
    let px = |x: usize, y: usize| -> [u8; 3] {
        let i = (y * w + x) * 3;
        [rgb[i], rgb[i + 1], rgb[i + 2]]
    };
    for y in 0..h {
        let row = &mut out[y * stride..];
        match format {
            PixelFormat::Rgb8 => row[..w * 3].copy_from_slice(&rgb[y * w * 3..(y + 1) * w * 3]),
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
                for x in 0..w {
                    let [r, g, b] = px(x, y);
                    let px = if format == PixelFormat::Rgba8 {
                        [r, g, b, 255]
                    } else {
                        [b, g, r, 255]
                    };
                    row[x * 4..x * 4 + 4].copy_from_slice(&px);
                }
            }
            PixelFormat::Bgr8 => {
                for x in 0..w {
                    let [r, g, b] = px(x, y);
                    row[x * 3..x * 3 + 3].copy_from_slice(&[b, g, r]);
                }
            }
            PixelFormat::Gray8 | PixelFormat::Nv12 => {
                // Luma; NV12's chroma plane is written below.
                for (x, o) in row[..w].iter_mut().enumerate() {
                    *o = rgb_to_yuv(px(x, y))[0];
                }
            }
            PixelFormat::Yuyv => {
                for x in (0..w).step_by(2) {
                    let (a, b) = (rgb_to_yuv(px(x, y)), rgb_to_yuv(px(x + 1, y)));
                    let mean = |i: usize| (u16::from(a[i]) + u16::from(b[i])).div_ceil(2) as u8;
                    row[x * 2..x * 2 + 4].copy_from_slice(&[a[0], mean(1), b[0], mean(2)]);
                }
            }
        }
    }
    if format == PixelFormat::Nv12 {
        for y in (0..h).step_by(2) {
            let row = &mut out[(h + y / 2) * stride..];
            for x in (0..w).step_by(2) {
                let mut sum = [0u32; 3];
                for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                    let yuv = rgb_to_yuv(px(x + dx, y + dy));
                    sum.iter_mut()
                        .zip(yuv)
                        .for_each(|(s, v)| *s += u32::from(v));
                }
                row[x] = ((sum[1] + 2) / 4) as u8;
                row[x + 1] = ((sum[2] + 2) / 4) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_board::protocol::FrameSource;

    fn frame(format: PixelFormat, w: u16, h: u16, stride: u32, rgb: &[u8]) -> (FrameDesc, Vec<u8>) {
        let mut desc = FrameDesc::packed(format, FrameSource::Inline, w, h).unwrap();
        desc.stride = stride;
        desc.length = format.frame_len(w, h, stride).unwrap();
        let mut bytes = vec![0xEEu8; desc.length as usize];
        encode_frame(rgb, w, h, format, stride, &mut bytes);
        (desc, bytes)
    }

    /// The frame through the frame pass at its own size (a square frame: no padding).
    fn read_all(view: &FrameView<'_>) -> Vec<u8> {
        let side = u32::from(view.desc().width);
        let mut out = vec![0u8; (side * side * 3) as usize];
        let mut pass = crate::pixels::FramePass::new(side);
        pass.run(&view.pixels(), None, &mut out).unwrap();
        out
    }

    #[test]
    fn yuv_round_trip_is_close() {
        for rgb in [
            [0, 0, 0],
            [255, 255, 255],
            [200, 10, 20],
            [10, 200, 30],
            [30, 40, 220],
            [128, 128, 128],
        ] {
            let flat: Vec<u8> = rgb.repeat(4);
            for format in [PixelFormat::Yuyv, PixelFormat::Nv12] {
                let (desc, bytes) = frame(format, 2, 2, 0, &flat);
                let back = read_all(&FrameView::new(desc, &bytes).unwrap());
                for c in 0..3 {
                    assert!(
                        (i32::from(back[c]) - i32::from(rgb[c])).abs() <= 3,
                        "{} {rgb:?} → {back:?}",
                        format.name()
                    );
                }
            }
        }
        // Limited range: black is Y 16, white Y 235, grey has neutral chroma.
        assert_eq!(rgb_to_yuv([0, 0, 0]), [16, 128, 128]);
        assert_eq!(rgb_to_yuv([255, 255, 255]), [235, 128, 128]);
    }

    #[test]
    fn every_format_reads_back_the_picture() {
        // Flat 4×4 blocks: 4:2:2 and 4:2:0 chroma is interpolated between sample centres,
        // so only pixels one away from a block's edge see their block's chroma alone.
        let (w, h) = (8u16, 8u16);
        let colours = [[200, 10, 20], [10, 200, 30], [30, 40, 220], [90, 90, 90]];
        let inner = |i: usize| {
            let (x, y) = (i / 3 % w as usize, i / 3 / w as usize);
            (1..=2).contains(&(x % 4)) && (1..=2).contains(&(y % 4))
        };
        let rgb: Vec<u8> = (0..h as usize)
            .flat_map(|y| (0..w as usize).map(move |x| (x / 4 + 2 * (y / 4)) % 4))
            .flat_map(|i| colours[i])
            .collect();
        for format in PixelFormat::ALL {
            for stride in [0, format.row_bytes(w) + 5] {
                let (desc, bytes) = frame(format, w, h, stride, &rgb);
                let view = FrameView::new(desc, &bytes).unwrap();
                let got = read_all(&view);
                for (i, (a, b)) in got.iter().zip(&rgb).enumerate() {
                    let tol = match format {
                        PixelFormat::Rgb8
                        | PixelFormat::Bgr8
                        | PixelFormat::Rgba8
                        | PixelFormat::Bgra8 => 0,
                        // Grey: luma only, compared with the colour's own luma.
                        PixelFormat::Gray8 => continue,
                        _ if !inner(i) => continue,
                        _ => 3,
                    };
                    assert!(
                        (i32::from(*a) - i32::from(*b)).abs() <= tol,
                        "{} stride {stride}: byte {i}: {a} vs {b}",
                        format.name()
                    );
                }
                if format == PixelFormat::Gray8 {
                    for (p, q) in got.chunks(3).zip(rgb.chunks(3)) {
                        let y = rgb_to_yuv([q[0], q[1], q[2]])[0];
                        assert_eq!(p, [y, y, y]);
                    }
                }
            }
        }
    }

    #[test]
    fn views_refuse_inconsistent_input() {
        let desc = FrameDesc::packed(PixelFormat::Rgb8, FrameSource::Inline, 4, 4).unwrap();
        assert!(FrameView::new(desc, &[0; 48]).is_some());
        assert!(FrameView::new(desc, &[0; 47]).is_none());
        assert!(FrameView::new(desc, &[0; 49]).is_none());
        let bad = FrameDesc { length: 47, ..desc };
        assert!(FrameView::new(bad, &[0; 47]).is_none());
    }
}
