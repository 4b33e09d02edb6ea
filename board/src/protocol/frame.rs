//! Camera frames as the firmware sends them: pixel formats, the frame's description in an
//! `Infer` message, and the checks that make its sizes trustworthy before a byte is read.

use super::le::{Reader, Writer};
use super::{WireError, MAX_FRAME_SIDE};

/// How a frame's bytes encode its pixels: the formats cameras and ISPs produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum PixelFormat {
    /// 3 bytes a pixel, R G B.
    Rgb8 = 1,
    /// 3 bytes a pixel, B G R (OpenCV's order).
    Bgr8 = 2,
    /// 1 byte a pixel, luma.
    Gray8 = 3,
    /// 4:2:2 packed, Y0 U Y1 V for each pair of pixels (USB webcams); even width.
    Yuyv = 4,
    /// 4:2:0: a Y plane, then an interleaved U V plane at half height (phone and Pi ISPs);
    /// even width and height; both planes use the same stride.
    Nv12 = 5,
    /// 4 bytes a pixel, R G B and alpha (ignored): what GPUs and browsers hand over.
    Rgba8 = 6,
    /// 4 bytes a pixel, B G R and alpha (ignored): Windows and many capture APIs.
    Bgra8 = 7,
}

impl PixelFormat {
    pub const ALL: [PixelFormat; 7] = [
        PixelFormat::Rgb8,
        PixelFormat::Bgr8,
        PixelFormat::Gray8,
        PixelFormat::Yuyv,
        PixelFormat::Nv12,
        PixelFormat::Rgba8,
        PixelFormat::Bgra8,
    ];

    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        PixelFormat::ALL
            .into_iter()
            .find(|f| *f as u8 == v)
            .ok_or(WireError::BadPixelFormat)
    }

    pub const fn name(self) -> &'static str {
        match self {
            PixelFormat::Rgb8 => "RGB8",
            PixelFormat::Bgr8 => "BGR8",
            PixelFormat::Gray8 => "GRAY8",
            PixelFormat::Yuyv => "YUYV",
            PixelFormat::Nv12 => "NV12",
            PixelFormat::Rgba8 => "RGBA8",
            PixelFormat::Bgra8 => "BGRA8",
        }
    }

    /// Bytes of one row of `width` pixels with no padding (of the Y plane for NV12).
    pub const fn row_bytes(self, width: u16) -> u32 {
        self.bytes_per_pixel() * width as u32
    }

    /// Bytes of one pixel in a row (of the luma plane for NV12; a YUYV pair is 4 bytes for 2).
    pub const fn bytes_per_pixel(self) -> u32 {
        match self {
            PixelFormat::Rgb8 | PixelFormat::Bgr8 => 3,
            PixelFormat::Gray8 | PixelFormat::Nv12 => 1,
            PixelFormat::Yuyv => 2,
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => 4,
        }
    }

    /// Whether a chroma sample covers two pixels across and two rows down: the sides that
    /// must be even.
    pub const fn chroma_halves(self) -> (bool, bool) {
        match self {
            PixelFormat::Yuyv => (true, false),
            PixelFormat::Nv12 => (true, true),
            _ => (false, false),
        }
    }

    /// Rows of bytes in a frame `height` pixels high (NV12's chroma plane adds half as many).
    pub const fn byte_rows(self, height: u64) -> u64 {
        match self {
            PixelFormat::Nv12 => height * 3 / 2,
            _ => height,
        }
    }

    /// Checks that a `width`×`height` frame with rows `stride` bytes apart is well formed and
    /// returns how many bytes it occupies. `stride` 0 means rows without padding.
    pub fn frame_len(self, width: u16, height: u16, stride: u32) -> Result<u32, WireError> {
        if width == 0 || height == 0 || width > MAX_FRAME_SIDE || height > MAX_FRAME_SIDE {
            return Err(WireError::BadFrameSize);
        }
        let (halved_x, halved_y) = self.chroma_halves();
        if (halved_x && !width.is_multiple_of(2)) || (halved_y && !height.is_multiple_of(2)) {
            return Err(WireError::BadFrameSize);
        }
        let row = self.row_bytes(width);
        let stride = if stride == 0 { row } else { stride };
        if stride < row {
            return Err(WireError::BadFrameSize);
        }
        let rows = self.byte_rows(u64::from(height));
        // The last row needs only its pixels, not its padding.
        let len = (rows - 1) * u64::from(stride) + u64::from(row);
        u32::try_from(len).map_err(|_| WireError::BadFrameSize)
    }
}

/// How a YUV frame's values map to RGB: the matrix (BT.601 for SD cameras and JPEG, BT.709
/// for HD) and the range (limited: luma 16–235 and chroma 16–240, what V4L2 and the
/// Raspberry Pi ISP produce by default; full: 0–255, JPEG's). Ignored for RGB and grey.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum ColourSpace {
    #[default]
    Bt601Limited = 0,
    Bt601Full = 1,
    Bt709Limited = 2,
    Bt709Full = 3,
}

impl ColourSpace {
    pub const ALL: [ColourSpace; 4] = [
        ColourSpace::Bt601Limited,
        ColourSpace::Bt601Full,
        ColourSpace::Bt709Limited,
        ColourSpace::Bt709Full,
    ];

    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        ColourSpace::ALL
            .into_iter()
            .find(|c| *c as u8 == v)
            .ok_or(WireError::BadValue)
    }

    /// The name `fulcrum client --colour` takes.
    pub const fn name(self) -> &'static str {
        match self {
            ColourSpace::Bt601Limited => "bt601",
            ColourSpace::Bt601Full => "bt601-full",
            ColourSpace::Bt709Limited => "bt709",
            ColourSpace::Bt709Full => "bt709-full",
        }
    }

    /// The luma weights of red and blue (`Kr`, `Kb`) and whether the range is full.
    pub const fn matrix(self) -> (f32, f32, bool) {
        match self {
            ColourSpace::Bt601Limited => (0.299, 0.114, false),
            ColourSpace::Bt601Full => (0.299, 0.114, true),
            ColourSpace::Bt709Limited => (0.2126, 0.0722, false),
            ColourSpace::Bt709Full => (0.2126, 0.0722, true),
        }
    }
}

/// The part of a frame to look at, in frame pixels; all zero: the whole frame. Boxes come
/// back in frame pixels either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Crop {
    pub x: u16,
    pub y: u16,
    pub width: u16,
    pub height: u16,
}

impl Crop {
    /// The whole frame.
    pub const WHOLE: Crop = Crop {
        x: 0,
        y: 0,
        width: 0,
        height: 0,
    };

    pub fn is_whole(&self) -> bool {
        *self == Crop::WHOLE
    }

    /// Checks the crop against a `width × height` frame: the whole frame, or a rectangle of
    /// positive area inside it.
    pub fn check(&self, width: u16, height: u16) -> Result<(), WireError> {
        if self.is_whole() {
            return Ok(());
        }
        let inside = |at: u16, len: u16, side: u16| {
            len > 0 && u32::from(at) + u32::from(len) <= u32::from(side)
        };
        if inside(self.x, self.width, width) && inside(self.y, self.height, height) {
            Ok(())
        } else {
            Err(WireError::BadCrop)
        }
    }
}

/// Where an `Infer` message's pixels are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum FrameSource {
    /// In the message itself, after the description (at most [`super::MAX_INLINE_BYTES`]).
    Inline = 0,
    /// In the memfd ring the client attached, at `offset`.
    Ring = 1,
}

impl FrameSource {
    pub fn from_u8(v: u8) -> Result<Self, WireError> {
        match v {
            0 => Ok(FrameSource::Inline),
            1 => Ok(FrameSource::Ring),
            _ => Err(WireError::BadValue),
        }
    }
}

/// The fixed part of an `Infer` message: one frame to detect objects in.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FrameDesc {
    pub format: PixelFormat,
    pub source: FrameSource,
    pub width: u16,
    pub height: u16,
    /// At most this many detections back; 0: the daemon's default.
    pub max_detections: u16,
    /// Bytes from one row to the next; 0: rows without padding.
    pub stride: u32,
    /// Bytes of the frame: exactly [`PixelFormat::frame_len`] of the other fields.
    pub length: u32,
    /// Start of the frame in the attached ring (0 for inline frames).
    pub offset: u64,
    /// Scores below this are not returned, in 0..=1; 0: the daemon's default.
    pub min_score: f32,
    /// How YUV values map to RGB (ignored for RGB and grey formats).
    pub colour: ColourSpace,
    /// The part of the frame to look at.
    pub crop: Crop,
}

impl FrameDesc {
    pub const LEN: usize = 40;

    /// A packed frame (no row padding) of `format`; `length` computed.
    pub fn packed(
        format: PixelFormat,
        source: FrameSource,
        width: u16,
        height: u16,
    ) -> Result<Self, WireError> {
        Ok(FrameDesc {
            format,
            source,
            width,
            height,
            max_detections: 0,
            stride: 0,
            length: format.frame_len(width, height, 0)?,
            offset: 0,
            min_score: 0.0,
            colour: ColourSpace::Bt601Limited,
            crop: Crop::WHOLE,
        })
    }

    /// Bytes from one row to the next, padding included.
    pub fn row_stride(&self) -> u32 {
        if self.stride == 0 {
            self.format.row_bytes(self.width)
        } else {
            self.stride
        }
    }

    /// Checks that the sizes agree with each other (see [`PixelFormat::frame_len`]), that an
    /// inline frame has no offset, that `min_score` is in 0..=1 and that the crop lies inside
    /// the frame.
    pub fn validate(&self) -> Result<(), WireError> {
        if self
            .format
            .frame_len(self.width, self.height, self.stride)?
            != self.length
        {
            return Err(WireError::BadFrameSize);
        }
        if self.source == FrameSource::Inline && self.offset != 0 {
            return Err(WireError::BadFrameSize);
        }
        if !(0.0..=1.0).contains(&self.min_score) {
            return Err(WireError::BadValue);
        }
        self.crop.check(self.width, self.height)
    }

    /// The frame's byte range inside a ring of `ring_len` bytes, or [`WireError::BadOffset`]
    /// if any of it lies outside (overflow included).
    pub fn ring_range(&self, ring_len: u64) -> Result<core::ops::Range<usize>, WireError> {
        let end = self
            .offset
            .checked_add(u64::from(self.length))
            .filter(|end| *end <= ring_len)
            .ok_or(WireError::BadOffset)?;
        let start = usize::try_from(self.offset).map_err(|_| WireError::BadOffset)?;
        let end = usize::try_from(end).map_err(|_| WireError::BadOffset)?;
        Ok(start..end)
    }

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(self.format as u8)?;
        w.u8(self.source as u8)?;
        w.u16(self.width)?;
        w.u16(self.height)?;
        w.u16(self.max_detections)?;
        w.u32(self.stride)?;
        w.u32(self.length)?;
        w.u64(self.offset)?;
        w.f32(self.min_score)?;
        w.u8(self.colour as u8)?;
        w.reserved(3)?;
        w.u16(self.crop.x)?;
        w.u16(self.crop.y)?;
        w.u16(self.crop.width)?;
        w.u16(self.crop.height)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let desc = FrameDesc {
            format: PixelFormat::from_u8(r.u8()?)?,
            source: FrameSource::from_u8(r.u8()?)?,
            width: r.u16()?,
            height: r.u16()?,
            max_detections: r.u16()?,
            stride: r.u32()?,
            length: r.u32()?,
            offset: r.u64()?,
            min_score: r.f32()?,
            colour: ColourSpace::from_u8(r.u8()?)?,
            crop: Crop::WHOLE,
        };
        r.reserved(3)?;
        let crop = Crop {
            x: r.u16()?,
            y: r.u16()?,
            width: r.u16()?,
            height: r.u16()?,
        };
        let desc = FrameDesc { crop, ..desc };
        desc.validate()?;
        Ok(desc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_lengths_of_each_format() {
        assert_eq!(PixelFormat::Rgb8.frame_len(4, 3, 0), Ok(36));
        assert_eq!(PixelFormat::Bgr8.frame_len(4, 3, 16), Ok(2 * 16 + 12));
        assert_eq!(PixelFormat::Gray8.frame_len(5, 2, 0), Ok(10));
        assert_eq!(PixelFormat::Yuyv.frame_len(4, 2, 0), Ok(16));
        // NV12 4x4: 16 bytes of Y, then 2 rows of 4 bytes of UV.
        assert_eq!(PixelFormat::Nv12.frame_len(4, 4, 0), Ok(24));
        assert_eq!(PixelFormat::Nv12.frame_len(4, 4, 8), Ok(5 * 8 + 4));
        assert_eq!(
            PixelFormat::Rgb8.frame_len(MAX_FRAME_SIDE, MAX_FRAME_SIDE, 0),
            Ok(3 * 4096 * 4096)
        );
    }

    #[test]
    fn malformed_sizes_are_refused() {
        let bad = Err(WireError::BadFrameSize);
        assert_eq!(PixelFormat::Rgb8.frame_len(0, 3, 0), bad);
        assert_eq!(PixelFormat::Rgb8.frame_len(3, 0, 0), bad);
        assert_eq!(PixelFormat::Rgb8.frame_len(MAX_FRAME_SIDE + 1, 1, 0), bad);
        assert_eq!(PixelFormat::Rgb8.frame_len(4, 1, 11), bad); // stride < row
        assert_eq!(PixelFormat::Yuyv.frame_len(3, 2, 0), bad); // odd width
        assert_eq!(PixelFormat::Nv12.frame_len(4, 3, 0), bad); // odd height
                                                               // A stride that makes the frame longer than u32 bytes.
        assert_eq!(PixelFormat::Gray8.frame_len(4, 4096, u32::MAX), bad);
        assert_eq!(PixelFormat::from_u8(0), Err(WireError::BadPixelFormat));
        assert_eq!(PixelFormat::from_u8(8), Err(WireError::BadPixelFormat));
    }

    #[test]
    fn ring_ranges_are_checked() {
        let mut d = FrameDesc::packed(PixelFormat::Gray8, FrameSource::Ring, 8, 8).unwrap();
        d.offset = 100;
        assert_eq!(d.ring_range(164), Ok(100..164));
        assert_eq!(d.ring_range(163), Err(WireError::BadOffset));
        d.offset = u64::MAX - 10;
        assert_eq!(d.ring_range(u64::MAX), Err(WireError::BadOffset));
    }

    #[test]
    fn crops_lie_inside_the_frame_with_positive_area() {
        let mut d = FrameDesc::packed(PixelFormat::Nv12, FrameSource::Inline, 640, 480).unwrap();
        let crop = |x, y, width, height| Crop {
            x,
            y,
            width,
            height,
        };
        for ok in [
            Crop::WHOLE,
            crop(0, 0, 640, 480),
            crop(639, 479, 1, 1),
            crop(3, 5, 7, 9),
        ] {
            d.crop = ok;
            assert_eq!(d.validate(), Ok(()), "{ok:?}");
        }
        for bad in [
            crop(0, 0, 0, 10),
            crop(0, 0, 10, 0),
            crop(5, 5, 0, 0),
            crop(600, 0, 41, 10),
            crop(0, 470, 10, 11),
            crop(u16::MAX, 0, 2, 2),
        ] {
            d.crop = bad;
            assert_eq!(d.validate(), Err(WireError::BadCrop), "{bad:?}");
        }
    }

    #[test]
    fn validate_ties_length_to_shape() {
        let mut d = FrameDesc::packed(PixelFormat::Rgb8, FrameSource::Inline, 2, 2).unwrap();
        assert_eq!(d.validate(), Ok(()));
        d.length += 1;
        assert_eq!(d.validate(), Err(WireError::BadFrameSize));
        d.length -= 1;
        d.offset = 4;
        assert_eq!(d.validate(), Err(WireError::BadFrameSize));
    }
}
