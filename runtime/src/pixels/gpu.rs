//! The frame pass as one GPU dispatch (`shaders/frame_pass.comp`, which the Vulkan engine runs
//! ahead of the forward pass): the CPU pass's own windows (`window.rs`) and colour matrix
//! (`colour.rs`), planned here on the host and handed over as a table and push constants, so
//! that both passes compute the same sums. The kernel reads the frame's bytes as they came
//! (planes, strides and all) from a host-visible buffer, and writes the letterboxed record.

use fulcrum_board::protocol::PixelFormat;

use super::colour::YuvToRgb;
use super::pass::{plan_windows, FramePass};
use super::source::{Pixels, PixelsError, Rect};
use super::window::Axis;
use super::{Letterbox, PAD_COLOUR};

/// Push-constant bytes of the kernel: eleven words of layout, six of colour matrix.
pub const GPU_PUSH_BYTES: usize = crate::compute::vulkan::kernels::FRAME_PUSH_BYTES as usize;
const _: () = assert!(GPU_PUSH_BYTES == 17 * 4);
/// Output pixels of a workgroup across (16 invocations of four) and down (4 rows).
const GROUP_PIXELS: [u32; 2] = [64, 4];
/// Words of the window table's header: three per axis, four axes.
const HEADER_WORDS: usize = 12;

/// One frame planned for the kernel.
#[derive(Debug, Clone, Copy)]
pub struct GpuFrame<'p> {
    /// Where the content landed (as [`FramePass::run`] returns it).
    pub placed: Letterbox,
    /// The windows of the four axes (the kernel's `Windows` binding).
    pub windows: &'p [u32],
    pub push: &'p [u8; GPU_PUSH_BYTES],
    pub groups: [u32; 3],
}

/// Plans frames for the GPU kernel into `size × size` outputs; its table grows to the largest
/// frame seen or reserved.
#[derive(Debug)]
pub struct GpuFramePlan {
    size: u32,
    x: [Axis; 2],
    y: [Axis; 2],
    windows: Vec<u32>,
    push: [u8; GPU_PUSH_BYTES],
}

impl GpuFramePlan {
    /// A plan into `size × size` outputs, or `None` where the kernel cannot write them (its
    /// invocations write four pixels, whole words: `size` must be a multiple of four, as every
    /// model input is).
    pub fn new(size: u32) -> Option<Self> {
        (size > 0 && size.is_multiple_of(4)).then(|| GpuFramePlan {
            size,
            x: Default::default(),
            y: Default::default(),
            windows: Vec::new(),
            push: [0; GPU_PUSH_BYTES],
        })
    }

    /// The output side, pixels.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Words of the window table for sources up to `max_side` pixels a side.
    pub fn planned_words(size: u32, max_side: u32) -> usize {
        let (dst, taps) = (size as usize, FramePass::max_taps(max_side, size));
        HEADER_WORDS + 4 * dst * (1 + taps)
    }

    /// Bytes of host memory the plan holds for sources up to `max_side` (its table and the
    /// axes it is built from), for memory plans.
    pub fn planned_bytes(size: u32, max_side: u32) -> usize {
        let (dst, taps) = (size as usize, FramePass::max_taps(max_side, size));
        4 * Self::planned_words(size, max_side) + 4 * Axis::planned_bytes(dst, taps)
    }

    /// Bytes of the frame buffer for sources up to `max_side` pixels a side, rows without
    /// padding, in the format with the most bytes a pixel (frames with padded rows grow it).
    pub fn planned_frame_bytes(max_side: u32) -> usize {
        let side = max_side as usize;
        side * side * 4
    }

    /// Grows the table for sources up to `max_side` pixels a side.
    pub fn reserve(&mut self, max_side: u32) {
        let (dst, taps) = (self.size as usize, FramePass::max_taps(max_side, self.size));
        for a in self.x.iter_mut().chain(self.y.iter_mut()) {
            a.reserve(dst, taps);
        }
        let words = Self::planned_words(self.size, max_side);
        if self.windows.capacity() < words {
            self.windows.reserve_exact(words - self.windows.len());
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.x.iter().chain(&self.y).map(Axis::bytes).sum::<usize>() + self.windows.capacity() * 4
    }

    /// Plans `crop` of `src` (all of it for `None`): its windows and push constants. `None`
    /// where the kernel cannot address the frame (over 4 GiB of bytes): the CPU pass takes
    /// those.
    pub fn plan(
        &mut self,
        src: &Pixels<'_>,
        crop: Option<Rect>,
    ) -> Result<Option<GpuFrame<'_>>, PixelsError> {
        let region = src.region(crop)?;
        if u32::try_from(src.picture_bytes().len()).is_err() {
            return Ok(None);
        }
        let placed = Letterbox::place(self.size, region.width, region.height);
        plan_windows(&mut self.x, &mut self.y, src, region, &placed);
        let (halved_x, halved_y) = src.format().chroma_halves();
        // The header's order: pixels across, chroma across, pixel rows, chroma rows; an axis
        // the format has no use for keeps a header of zeros.
        let axes = [&self.x[0], &self.x[1], &self.y[0], &self.y[1]];
        let planned = [true, halved_x, true, halved_y];
        self.windows.clear();
        self.windows.resize(HEADER_WORDS, 0);
        for (a, (axis, planned)) in axes.iter().zip(planned).enumerate() {
            if !planned {
                continue;
            }
            let starts = self.windows.len() as u32;
            self.windows.extend_from_slice(axis.starts());
            let weights = self.windows.len() as u32;
            self.windows
                .extend(axis.weights().iter().map(|w| w.to_bits()));
            self.windows[3 * a..3 * a + 3].copy_from_slice(&[starts, weights, axis.taps() as u32]);
        }

        let (kind, step, blue_first) = match src.format() {
            PixelFormat::Rgb8 => (0, 3, 0),
            PixelFormat::Bgr8 => (0, 3, 1),
            PixelFormat::Rgba8 => (0, 4, 0),
            PixelFormat::Bgra8 => (0, 4, 1),
            PixelFormat::Gray8 => (1, 1, 0),
            PixelFormat::Yuyv => (2, 2, 0),
            PixelFormat::Nv12 => (3, 1, 0),
        };
        let chroma = if src.format() == PixelFormat::Nv12 {
            src.height() as usize * src.stride()
        } else {
            0
        };
        let pad = u32::from_le_bytes([PAD_COLOUR[0], PAD_COLOUR[1], PAD_COLOUR[2], 0]);
        let words: [u32; 11] = [
            kind,
            step,
            blue_first,
            src.stride() as u32,
            chroma as u32,
            self.size,
            placed.pad_x as u32,
            placed.pad_y as u32,
            placed.width,
            placed.height,
            pad,
        ];
        let matrix = YuvToRgb::new(src.colour()).coefficients();
        let all = words
            .iter()
            .copied()
            .chain(matrix.iter().map(|v| v.to_bits()));
        for (out, w) in self.push.chunks_exact_mut(4).zip(all) {
            out.copy_from_slice(&w.to_le_bytes());
        }
        let [gx, gy] = GROUP_PIXELS;
        Ok(Some(GpuFrame {
            placed,
            windows: &self.windows,
            push: &self.push,
            groups: [self.size.div_ceil(gx), self.size.div_ceil(gy), 1],
        }))
    }
}
