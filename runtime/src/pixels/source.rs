//! A picture's bytes and the description that says how to read them, checked once so that
//! the pass reads inside them; and the rectangle of it to look at.

use super::{ColourSpace, PixelFormat};

/// Why a picture or a crop cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PixelsError {
    #[error("a {width}×{height} picture has no pixels")]
    Empty { width: u32, height: u32 },
    #[error("{format} needs an even {side} ({value} px): its chroma covers two pixels")]
    OddSide {
        format: &'static str,
        side: &'static str,
        value: u32,
    },
    #[error("a row stride of {stride} bytes is shorter than a {format} row of {row} bytes")]
    ShortStride {
        format: &'static str,
        stride: usize,
        row: usize,
    },
    #[error("{have} bytes are fewer than the {need} a {width}×{height} {format} picture needs")]
    Short {
        format: &'static str,
        width: u32,
        height: u32,
        need: usize,
        have: usize,
    },
    #[error(
        "crop {x},{y} {width}×{height} is empty or reaches outside the {frame_w}×{frame_h} frame"
    )]
    BadCrop {
        x: u32,
        y: u32,
        width: u32,
        height: u32,
        frame_w: u32,
        frame_h: u32,
    },
}

/// A rectangle of a picture, in its pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

impl Rect {
    /// The whole of a `width × height` picture.
    pub fn whole(width: u32, height: u32) -> Self {
        Rect {
            x: 0,
            y: 0,
            width,
            height,
        }
    }
}

impl From<fulcrum_board::protocol::Crop> for Rect {
    fn from(c: fulcrum_board::protocol::Crop) -> Self {
        Rect {
            x: c.x.into(),
            y: c.y.into(),
            width: c.width.into(),
            height: c.height.into(),
        }
    }
}

/// A picture's pixels with their format, size, row stride and colour space.
#[derive(Debug, Clone, Copy)]
pub struct Pixels<'a> {
    format: PixelFormat,
    width: u32,
    height: u32,
    stride: usize,
    colour: ColourSpace,
    bytes: &'a [u8],
}

impl<'a> Pixels<'a> {
    /// `bytes` as a `width × height` picture of `format`, rows `stride` bytes apart (0: rows
    /// without padding; NV12's chroma plane follows its `height` luma rows at the same
    /// stride). Bytes beyond the picture are allowed and ignored.
    pub fn new(
        format: PixelFormat,
        width: u32,
        height: u32,
        stride: usize,
        colour: ColourSpace,
        bytes: &'a [u8],
    ) -> Result<Self, PixelsError> {
        let name = format.name();
        if width == 0 || height == 0 {
            return Err(PixelsError::Empty { width, height });
        }
        let (halved_x, halved_y) = format.chroma_halves();
        if halved_x && width % 2 == 1 {
            return Err(PixelsError::OddSide {
                format: name,
                side: "width",
                value: width,
            });
        }
        if halved_y && height % 2 == 1 {
            return Err(PixelsError::OddSide {
                format: name,
                side: "height",
                value: height,
            });
        }
        let row = row_bytes(format, width);
        let stride = if stride == 0 { row } else { stride };
        if stride < row {
            return Err(PixelsError::ShortStride {
                format: name,
                stride,
                row,
            });
        }
        let need = picture_len(format, width, height, stride).unwrap_or(usize::MAX);
        if bytes.len() < need {
            return Err(PixelsError::Short {
                format: name,
                width,
                height,
                need,
                have: bytes.len(),
            });
        }
        Ok(Pixels {
            format,
            width,
            height,
            stride,
            colour,
            bytes,
        })
    }

    /// A decoded 8-bit RGB image.
    pub fn rgb8(image: &'a image::RgbImage) -> Result<Self, PixelsError> {
        let (w, h) = image.dimensions();
        Pixels::new(
            PixelFormat::Rgb8,
            w,
            h,
            0,
            ColourSpace::default(),
            image.as_raw(),
        )
    }

    pub fn format(&self) -> PixelFormat {
        self.format
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    pub fn colour(&self) -> ColourSpace {
        self.colour
    }

    /// Bytes from one row to the next.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// All the bytes, from the first row.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The bytes of the picture itself: from the first row to the end of the last (without
    /// what the buffer holds beyond it).
    pub fn picture_bytes(&self) -> &'a [u8] {
        // Checked in `new` to be inside the bytes.
        let len = picture_len(self.format, self.width, self.height, self.stride);
        &self.bytes[..len.expect("checked in Pixels::new")]
    }

    /// `crop`, or the whole picture for `None`, checked to be a non-empty rectangle inside.
    pub fn region(&self, crop: Option<Rect>) -> Result<Rect, PixelsError> {
        let Some(c) = crop else {
            return Ok(Rect::whole(self.width, self.height));
        };
        let inside = |at: u32, len: u32, side: u32| {
            len > 0 && u64::from(at) + u64::from(len) <= u64::from(side)
        };
        if inside(c.x, c.width, self.width) && inside(c.y, c.height, self.height) {
            Ok(c)
        } else {
            Err(PixelsError::BadCrop {
                x: c.x,
                y: c.y,
                width: c.width,
                height: c.height,
                frame_w: self.width,
                frame_h: self.height,
            })
        }
    }
}

/// Bytes of one row of `width` pixels of `format`.
fn row_bytes(format: PixelFormat, width: u32) -> usize {
    width as usize * format.bytes_per_pixel() as usize
}

/// Bytes from a picture's first row to the end of its last (all planes), rows `stride` apart;
/// `None` where that overflows.
fn picture_len(format: PixelFormat, width: u32, height: u32, stride: usize) -> Option<usize> {
    let rows = format.byte_rows(u64::from(height)) as usize;
    (rows - 1)
        .checked_mul(stride)?
        .checked_add(row_bytes(format, width))
}
