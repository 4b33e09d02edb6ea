//! The on-disk shard format: what a packed dataset looks like, byte for byte.
//!
//! This module only encodes and decodes bytes; where they come from (io_uring, pread) is the
//! business of `io`, and what to do with a bad record is the business of `loader`.
//!
//! # A packed dataset
//!
//! A directory holding:
//!
//! * `manifest.json` — the dataset's options, class names, shard list and pack summary
//!   ([`Manifest`]);
//! * `shard-00000.fsh`, `shard-00001.fsh`, … — the records, [`Manifest::records_per_shard`]
//!   per shard except the last;
//! * `sources.txt` — one line per record: the source image it was packed from;
//! * `hashes.txt` — for real data, one line per record: the picture's content and difference
//!   hashes (`crate::pack::duplicates`), which find copies of a picture.
//!
//! # A shard file
//!
//! All integers and floats are little-endian. Every offset below is a multiple of
//! [`PAGE_SIZE`] (4096) where it says *page*, so that records can be read with `O_DIRECT`.
//!
//! ```text
//! page 0            header, HEADER_SIZE = 4096 bytes
//!   0   [u8; 8]  magic  b"FULCRUM\x1a"
//!   8   u32      format version (FORMAT_VERSION)
//!   12  u32      header size (4096)
//!   16  u32      record size in bytes (a multiple of 4096)
//!   20  u32      records in this shard
//!   24  u32      image width    (the model input size, e.g. 128)
//!   28  u32      image height
//!   32  u32      channels       (3: RGB)
//!   36  u32      max boxes per record
//!   40  u32      number of classes
//!   44  u32      shard index in the dataset
//!   48  u64      global index of this shard's first record
//!   56  u64      dataset id (the same in every shard and in the manifest)
//!   64  ..       zero
//!   4092 u32     CRC32C of bytes 0..4092
//! page 1 ..        record 0, record 1, … each `record size` bytes
//! ```
//!
//! # A record
//!
//! ```text
//!   0                         image: height × width × channels u8, HWC, letterboxed
//!   I = image bytes           metadata:
//!   I+0   u32   CRC32C of the image bytes followed by metadata bytes I+4 .. I+M
//!   I+4   u16   box count (≤ max boxes)
//!   I+6   u16   flags (FLAG_SUBSTITUTE: not packed, a stand-in for a bad record)
//!   I+8   u64   global record index (catches records read from the wrong place)
//!   I+16  u32   source image width in pixels
//!   I+20  u32   source image height
//!   I+24  f32   letterbox scale (packed pixels per source pixel)
//!   I+28  f32   letterbox x padding in packed pixels
//!   I+32  f32   letterbox y padding
//!   I+36  u32   zero
//!   I+40  max boxes × { u32 class, f32 x0, f32 y0, f32 x1, f32 y1 }   (20 bytes each)
//!   I+M   ..    zero up to the record size, M = 40 + 20 × max boxes
//! ```
//!
//! Box corners are in pixels of the packed image (`0 ≤ x0 < x1 ≤ width`); boxes past the count
//! are zero. A source pixel `(x, y)` maps to `(x · scale + pad_x, y · scale + pad_y)`.
//!
//! The format version changes whenever any of the above does; readers refuse other versions.

pub mod box_sides;
mod error;
mod header;
mod manifest;
mod record;
pub(crate) use record::{le_f32, le_u32};

pub use error::{Error, Result};
pub use header::{ShardHeader, FORMAT_VERSION, HEADER_SIZE, MAGIC};
pub use manifest::{Manifest, PackSummary, ShardEntry, MANIFEST_FILE, SOURCES_FILE};
pub use record::{
    LayoutError, RecordBox, RecordLayout, RecordMeta, RecordProblem, BOX_BYTES, FLAG_SUBSTITUTE,
    META_FIXED,
};

/// The alignment unit of `O_DIRECT` reads and of everything in a shard (the memory page).
pub const PAGE_SIZE: usize = crate::base::PAGE_SIZE;

/// Rounds `n` up to a multiple of [`PAGE_SIZE`].
pub const fn page_align(n: usize) -> usize {
    n.div_ceil(PAGE_SIZE) * PAGE_SIZE
}

/// File name of shard `index` inside a dataset directory.
pub fn shard_file_name(index: u32) -> String {
    format!("shard-{index:05}.fsh")
}
