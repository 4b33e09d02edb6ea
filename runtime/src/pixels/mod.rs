//! The frame pass: a camera frame or a decoded photo, in any of the pixel formats cameras,
//! ISPs and GPUs hand over, to the model's letterboxed input in one pass, with no full-size
//! intermediate.
//!
//! For each output row, the source rows its window covers are summed with their weights
//! straight from the frame's bytes (the vertical pass, a kernel of the CPU kernel table:
//! `u8` rows in, one `f32` row out, whatever the format, since it works on bytes), then the
//! horizontal windows pick each channel out of that row by its byte position (see
//! `window.rs` for the filter: area when shrinking, linear when enlarging). YUV formats are
//! resampled as YUV, luma and chroma each at their own resolution, and only the small result
//! is converted to RGB (`colour.rs`): the conversion is affine, so this is the same as
//! converting first except where a source pixel's RGB would have been clipped. The output is
//! the engine's input record (8-bit RGB, pixels interleaved; the engines normalise as they
//! read it). `pack`, `infer`, `eval` and `fulcrumd` all letterbox through here, so a frame
//! sent to the daemon and the same picture given to `fulcrum infer` reach the model alike.
//!
//! Where the model runs on a GPU, the same pass can run there instead (`gpu.rs` plans it for
//! the Vulkan engine's `frame_pass` kernel): the frame goes to the GPU as it came from the
//! camera, and only the detections come back.

mod colour;
mod gpu;
mod pass;
mod source;
mod window;

pub use fulcrum_board::protocol::{ColourSpace, PixelFormat};
pub use gpu::{GpuFrame, GpuFramePlan, GPU_PUSH_BYTES};
pub use pass::{FramePass, Letterbox};
pub use source::{Pixels, PixelsError, Rect};

/// Colour of the padding around the letterboxed content (the YOLO family's).
pub const PAD_COLOUR: [u8; 3] = [114, 114, 114];

#[cfg(test)]
mod tests;
