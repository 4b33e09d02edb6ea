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
}

impl PixelFormat {
    pub const ALL: [PixelFormat; 5] = [
        PixelFormat::Rgb8,
        PixelFormat::Bgr8,
        PixelFormat::Gray8,
        PixelFormat::Yuyv,
        PixelFormat::Nv12,
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
        }
    }

    /// Bytes of one row of `width` pixels with no padding (of the Y plane for NV12).
    pub const fn row_bytes(self, width: u16) -> u32 {
        let w = width as u32;
        match self {
            PixelFormat::Rgb8 | PixelFormat::Bgr8 => 3 * w,
            PixelFormat::Gray8 | PixelFormat::Nv12 => w,
            PixelFormat::Yuyv => 2 * w,
        }
    }

    /// Checks that a `width`×`height` frame with rows `stride` bytes apart is well formed and
    /// returns how many bytes it occupies. `stride` 0 means rows without padding.
    pub fn frame_len(self, width: u16, height: u16, stride: u32) -> Result<u32, WireError> {
        if width == 0 || height == 0 || width > MAX_FRAME_SIDE || height > MAX_FRAME_SIDE {
            return Err(WireError::BadFrameSize);
        }
        let subsampled_x = matches!(self, PixelFormat::Yuyv | PixelFormat::Nv12);
        if (subsampled_x && !width.is_multiple_of(2))
            || (self == PixelFormat::Nv12 && !height.is_multiple_of(2))
        {
            return Err(WireError::BadFrameSize);
        }
        let row = self.row_bytes(width);
        let stride = if stride == 0 { row } else { stride };
        if stride < row {
            return Err(WireError::BadFrameSize);
        }
        let rows = match self {
            PixelFormat::Nv12 => u64::from(height) * 3 / 2,
            _ => u64::from(height),
        };
        // The last row needs only its pixels, not its padding.
        let len = (rows - 1) * u64::from(stride) + u64::from(row);
        u32::try_from(len).map_err(|_| WireError::BadFrameSize)
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
}

impl FrameDesc {
    pub const LEN: usize = 32;

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
    /// inline frame has no offset and that `min_score` is in 0..=1.
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
        Ok(())
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
        w.reserved(4)
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
        };
        r.reserved(4)?;
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
        assert_eq!(PixelFormat::from_u8(6), Err(WireError::BadPixelFormat));
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
