//! One fixed-size record: the letterboxed image, its boxes and a checksum.

use super::page_align;

/// Bytes of the fixed part of the metadata, before the boxes.
pub const META_FIXED: usize = 40;
/// Bytes of one encoded box.
pub const BOX_BYTES: usize = 20;
/// Record flag: this record is a deterministic stand-in for a corrupt one (never on disk).
pub const FLAG_SUBSTITUTE: u16 = 1;

/// A box in pixels of the packed image.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RecordBox {
    pub class: u32,
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

/// Everything in a record's metadata except the boxes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RecordMeta {
    pub index: u64,
    pub flags: u16,
    pub source_width: u32,
    pub source_height: u32,
    pub scale: f32,
    pub pad_x: f32,
    pub pad_y: f32,
}

/// Why a record failed verification; the caller adds the file and record index.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordProblem {
    #[error("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("record index {found} where record {expected} belongs (misplaced or stale data)")]
    WrongIndex { expected: u64, found: u64 },
    #[error("box count {count} exceeds the maximum of {max}")]
    TooManyBoxes { count: u16, max: u32 },
    #[error("box {i}: class {class} out of range (the dataset has {num_classes} classes)")]
    ClassOutOfRange {
        i: usize,
        class: u32,
        num_classes: u32,
    },
    #[error(
        "box {i}: corners ({x0}, {y0})–({x1}, {y1}) outside the {width}×{height} image or empty"
    )]
    BoxOutOfRange {
        i: usize,
        x0: f32,
        y0: f32,
        x1: f32,
        y1: f32,
        width: u32,
        height: u32,
    },
}

/// Where things are inside a record of a given shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLayout {
    pub width: u32,
    pub height: u32,
    pub channels: u32,
    pub max_boxes: u32,
    /// `width × height × channels`: the image comes first.
    pub image_bytes: usize,
    /// `META_FIXED + BOX_BYTES × max_boxes`, starting at `image_bytes`.
    pub meta_bytes: usize,
    /// Image plus metadata, rounded up to a whole page.
    pub record_size: usize,
}

fn le_u16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
/// Little-endian reads at byte offset `o` (also used by the CPU kernels that read records).
pub(crate) fn le_u32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
pub(crate) fn le_f32(b: &[u8], o: usize) -> f32 {
    f32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

/// Why a record layout is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("image size {width}×{height} outside 1..={max}")]
    Size { width: u32, height: u32, max: u32 },
    #[error("{0} channels; only RGB (3) is supported")]
    Channels(u32),
    #[error("max boxes {max_boxes} outside 1..={max}")]
    MaxBoxes { max_boxes: u32, max: u32 },
}

impl RecordLayout {
    /// Largest accepted input size and box count: keeps every offset well inside `u32`.
    pub const MAX_SIDE: u32 = 4096;
    pub const MAX_BOXES: u32 = 1024;

    pub fn new(
        width: u32,
        height: u32,
        channels: u32,
        max_boxes: u32,
    ) -> Result<Self, LayoutError> {
        if !(1..=Self::MAX_SIDE).contains(&width) || !(1..=Self::MAX_SIDE).contains(&height) {
            return Err(LayoutError::Size {
                width,
                height,
                max: Self::MAX_SIDE,
            });
        }
        if channels != 3 {
            return Err(LayoutError::Channels(channels));
        }
        if !(1..=Self::MAX_BOXES).contains(&max_boxes) {
            return Err(LayoutError::MaxBoxes {
                max_boxes,
                max: Self::MAX_BOXES,
            });
        }
        let image_bytes = (width * height * channels) as usize;
        let meta_bytes = META_FIXED + BOX_BYTES * max_boxes as usize;
        Ok(RecordLayout {
            width,
            height,
            channels,
            max_boxes,
            image_bytes,
            meta_bytes,
            record_size: page_align(image_bytes + meta_bytes),
        })
    }

    fn meta<'a>(&self, record: &'a [u8]) -> &'a [u8] {
        &record[self.image_bytes..self.image_bytes + self.meta_bytes]
    }

    /// The checksum a record should carry: image bytes, then metadata after the CRC field.
    pub fn checksum(&self, record: &[u8]) -> u32 {
        let crc = crc32c::crc32c(&record[..self.image_bytes]);
        crc32c::crc32c_append(crc, &self.meta(record)[4..])
    }

    /// Writes a complete record into `out` (exactly `record_size` bytes, zero-padded).
    /// `boxes` must already be valid for this layout; `image` is HWC u8.
    pub fn encode(&self, out: &mut [u8], image: &[u8], meta: &RecordMeta, boxes: &[RecordBox]) {
        assert_eq!(out.len(), self.record_size, "record buffer size");
        assert_eq!(image.len(), self.image_bytes, "image size");
        assert!(boxes.len() <= self.max_boxes as usize, "too many boxes");
        out[..self.image_bytes].copy_from_slice(image);
        out[self.image_bytes..].fill(0);
        self.write_meta(out, meta, boxes);
    }

    /// Rewrites metadata and boxes (and the checksum) of a record whose image is in place.
    pub fn write_meta(&self, out: &mut [u8], meta: &RecordMeta, boxes: &[RecordBox]) {
        let m = &mut out[self.image_bytes..self.image_bytes + self.meta_bytes];
        m[4..6].copy_from_slice(&(boxes.len() as u16).to_le_bytes());
        m[6..8].copy_from_slice(&meta.flags.to_le_bytes());
        m[8..16].copy_from_slice(&meta.index.to_le_bytes());
        m[16..20].copy_from_slice(&meta.source_width.to_le_bytes());
        m[20..24].copy_from_slice(&meta.source_height.to_le_bytes());
        m[24..28].copy_from_slice(&meta.scale.to_le_bytes());
        m[28..32].copy_from_slice(&meta.pad_x.to_le_bytes());
        m[32..36].copy_from_slice(&meta.pad_y.to_le_bytes());
        m[36..40].fill(0);
        m[META_FIXED..].fill(0);
        for (i, b) in boxes.iter().enumerate() {
            self.write_box(out, i, b);
        }
        let crc = self.checksum(out);
        out[self.image_bytes..self.image_bytes + 4].copy_from_slice(&crc.to_le_bytes());
    }

    pub fn image<'a>(&self, record: &'a [u8]) -> &'a [u8] {
        &record[..self.image_bytes]
    }

    pub fn image_mut<'a>(&self, record: &'a mut [u8]) -> &'a mut [u8] {
        &mut record[..self.image_bytes]
    }

    pub fn stored_checksum(&self, record: &[u8]) -> u32 {
        le_u32(self.meta(record), 0)
    }

    pub fn box_count(&self, record: &[u8]) -> u16 {
        le_u16(self.meta(record), 4)
    }

    pub fn read_meta(&self, record: &[u8]) -> RecordMeta {
        let m = self.meta(record);
        RecordMeta {
            flags: le_u16(m, 6),
            index: u64::from_le_bytes(m[8..16].try_into().unwrap()),
            source_width: le_u32(m, 16),
            source_height: le_u32(m, 20),
            scale: le_f32(m, 24),
            pad_x: le_f32(m, 28),
            pad_y: le_f32(m, 32),
        }
    }

    /// Box `i` (any `i < max_boxes`; boxes past the count read as zero).
    pub fn read_box(&self, record: &[u8], i: usize) -> RecordBox {
        let o = META_FIXED + BOX_BYTES * i;
        let m = &self.meta(record)[o..o + BOX_BYTES];
        RecordBox {
            class: le_u32(m, 0),
            x0: le_f32(m, 4),
            y0: le_f32(m, 8),
            x1: le_f32(m, 12),
            y1: le_f32(m, 16),
        }
    }

    /// Overwrites box `i` in place (used by augmentation; the checksum goes stale on purpose:
    /// records are verified when they come off disk, before they are changed).
    pub fn write_box(&self, record: &mut [u8], i: usize, b: &RecordBox) {
        let o = self.image_bytes + META_FIXED + BOX_BYTES * i;
        let d = &mut record[o..o + BOX_BYTES];
        d[0..4].copy_from_slice(&b.class.to_le_bytes());
        for (k, v) in [b.x0, b.y0, b.x1, b.y1].iter().enumerate() {
            d[4 + 4 * k..8 + 4 * k].copy_from_slice(&v.to_le_bytes());
        }
    }

    /// Rewrites each box's class id through `map` (ids checked in range beforehand), as
    /// [`RecordLayout::write_box`] does: one dataset's classes numbered as another's.
    pub fn map_classes(&self, record: &mut [u8], map: &[u32]) {
        for i in 0..self.box_count(record) as usize {
            let mut b = self.read_box(record, i);
            b.class = map[b.class as usize];
            self.write_box(record, i, &b);
        }
    }

    pub fn set_box_count(&self, record: &mut [u8], count: u16) {
        let o = self.image_bytes + 4;
        record[o..o + 2].copy_from_slice(&count.to_le_bytes());
    }

    /// Checks a record that came off disk: checksum, index, box count, classes and coordinates.
    pub fn verify(
        &self,
        record: &[u8],
        expected_index: u64,
        num_classes: u32,
    ) -> Result<(), RecordProblem> {
        let stored = self.stored_checksum(record);
        let computed = self.checksum(record);
        if stored != computed {
            return Err(RecordProblem::Checksum { stored, computed });
        }
        let found = self.read_meta(record).index;
        if found != expected_index {
            return Err(RecordProblem::WrongIndex {
                expected: expected_index,
                found,
            });
        }
        self.check_boxes(record, num_classes)
    }

    /// Label checks alone (also run on freshly encoded records by the packer's tests).
    pub fn check_boxes(&self, record: &[u8], num_classes: u32) -> Result<(), RecordProblem> {
        let count = self.box_count(record);
        if count as u32 > self.max_boxes {
            return Err(RecordProblem::TooManyBoxes {
                count,
                max: self.max_boxes,
            });
        }
        let (w, h) = (self.width as f32, self.height as f32);
        for i in 0..count as usize {
            let b = self.read_box(record, i);
            if b.class >= num_classes {
                return Err(RecordProblem::ClassOutOfRange {
                    i,
                    class: b.class,
                    num_classes,
                });
            }
            let inside = b.x0 >= 0.0 && b.y0 >= 0.0 && b.x1 <= w && b.y1 <= h;
            // `<` also rejects NaN.
            if !(inside && b.x0 < b.x1 && b.y0 < b.y1) {
                return Err(RecordProblem::BoxOutOfRange {
                    i,
                    x0: b.x0,
                    y0: b.y0,
                    x1: b.x1,
                    y1: b.y1,
                    width: self.width,
                    height: self.height,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> RecordLayout {
        RecordLayout::new(128, 128, 3, 32).unwrap()
    }

    fn encoded(l: &RecordLayout) -> Vec<u8> {
        let image: Vec<u8> = (0..l.image_bytes).map(|i| (i * 7 % 251) as u8).collect();
        let meta = RecordMeta {
            index: 42,
            source_width: 640,
            source_height: 480,
            scale: 0.2,
            pad_x: 0.0,
            pad_y: 16.0,
            flags: 0,
        };
        let boxes = [
            RecordBox {
                class: 1,
                x0: 1.0,
                y0: 2.0,
                x1: 50.0,
                y1: 60.5,
            },
            RecordBox {
                class: 0,
                x0: 0.0,
                y0: 0.0,
                x1: 128.0,
                y1: 128.0,
            },
        ];
        let mut rec = vec![0xAA; l.record_size];
        l.encode(&mut rec, &image, &meta, &boxes);
        rec
    }

    #[test]
    fn layout_of_det_s_input_is_whole_pages() {
        let l = layout();
        assert_eq!(l.image_bytes, 49152);
        assert_eq!(l.meta_bytes, 40 + 640);
        assert_eq!(l.record_size, 53248);
        assert!(RecordLayout::new(0, 128, 3, 32).is_err());
        assert!(RecordLayout::new(128, 128, 4, 32).is_err());
        assert!(RecordLayout::new(128, 128, 3, 0).is_err());
    }

    #[test]
    fn encode_then_read_back() {
        let l = layout();
        let rec = encoded(&l);
        assert_eq!(l.verify(&rec, 42, 2), Ok(()));
        assert_eq!(l.box_count(&rec), 2);
        assert_eq!(
            l.read_box(&rec, 0),
            RecordBox {
                class: 1,
                x0: 1.0,
                y0: 2.0,
                x1: 50.0,
                y1: 60.5
            }
        );
        assert_eq!(l.read_box(&rec, 2), RecordBox::default());
        let m = l.read_meta(&rec);
        assert_eq!((m.index, m.source_width, m.pad_y), (42, 640, 16.0));
        assert!(
            rec[l.image_bytes + l.meta_bytes..].iter().all(|&b| b == 0),
            "padding zeroed"
        );
    }

    #[test]
    fn verify_finds_each_problem() {
        let l = layout();
        let mut rec = encoded(&l);
        rec[100] ^= 0x10;
        assert!(matches!(
            l.verify(&rec, 42, 2),
            Err(RecordProblem::Checksum { .. })
        ));

        let rec = encoded(&l);
        assert_eq!(
            l.verify(&rec, 43, 2),
            Err(RecordProblem::WrongIndex {
                expected: 43,
                found: 42
            })
        );
        assert!(matches!(
            l.verify(&rec, 42, 1),
            Err(RecordProblem::ClassOutOfRange { i: 0, class: 1, .. })
        ));

        let mut rec = encoded(&l);
        let meta = l.read_meta(&rec);
        l.write_meta(
            &mut rec,
            &meta,
            &[RecordBox {
                class: 0,
                x0: 10.0,
                y0: 0.0,
                x1: 129.0,
                y1: 5.0,
            }],
        );
        assert!(matches!(
            l.verify(&rec, 42, 2),
            Err(RecordProblem::BoxOutOfRange { i: 0, .. })
        ));
        l.write_meta(
            &mut rec,
            &meta,
            &[RecordBox {
                class: 0,
                x0: f32::NAN,
                y0: 0.0,
                x1: 9.0,
                y1: 5.0,
            }],
        );
        assert!(matches!(
            l.verify(&rec, 42, 2),
            Err(RecordProblem::BoxOutOfRange { .. })
        ));

        let mut rec = encoded(&l);
        l.set_box_count(&mut rec, 33);
        let crc = l.checksum(&rec);
        rec[l.image_bytes..l.image_bytes + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            l.verify(&rec, 42, 2),
            Err(RecordProblem::TooManyBoxes { count: 33, max: 32 })
        );
    }
}
