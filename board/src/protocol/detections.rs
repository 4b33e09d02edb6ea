//! The `Detections` reply: a fixed part and the records, which a decoder reads in place from
//! the message bytes and an encoder writes from a slice, so neither side allocates.

use super::body::Detection;
use super::le::{Reader, Writer};
use super::{WireError, MAX_DETECTIONS};

/// Daemon → client: the boxes found in one frame, in that frame's pixels. The header echoes
/// the request's sequence number and capture timestamp.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DetectionsReply<'a> {
    /// The frame's size, which the boxes are in.
    pub frame_width: u16,
    pub frame_height: u16,
    /// The engine's time on this frame, microseconds.
    pub engine_us: u32,
    /// From the request's arrival to the reply, microseconds.
    pub total_us: u32,
    /// The weights that answered (as in `Welcome`): a client that sees it change asks again
    /// for what the model is (`Hello` → `Welcome`, `ClassesRequest`), since a reload may have
    /// changed the classes or the input size.
    pub weights_generation: u32,
    /// The lowest score returned, as applied: the request's, or the daemon's default.
    pub min_score: f32,
    /// The duplicate suppression's IoU limit, as applied (1: none).
    pub nms_iou: f32,
    pub detections: DetectionList<'a>,
}

impl<'a> DetectionsReply<'a> {
    /// Bytes before the records.
    pub const FIXED_LEN: usize = 28;

    pub(crate) fn body_len(&self) -> usize {
        Self::FIXED_LEN + self.detections.len() * Detection::LEN
    }

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        let count = u16::try_from(self.detections.len())
            .ok()
            .filter(|n| *n <= MAX_DETECTIONS)
            .ok_or(WireError::TooMany)?;
        w.u16(count)?;
        w.u16(self.frame_width)?;
        w.u16(self.frame_height)?;
        w.reserved(2)?;
        w.u32(self.engine_us)?;
        w.u32(self.total_us)?;
        w.u32(self.weights_generation)?;
        w.f32(self.min_score)?;
        w.f32(self.nms_iou)?;
        for d in self.detections.iter() {
            d.write(w)?;
        }
        Ok(())
    }

    /// Reads the whole body; the records must fill it exactly.
    pub(crate) fn read(r: &mut Reader<'a>) -> Result<Self, WireError> {
        let count = r.u16()?;
        if count > MAX_DETECTIONS {
            return Err(WireError::TooMany);
        }
        let frame_width = r.u16()?;
        let frame_height = r.u16()?;
        r.reserved(2)?;
        let engine_us = r.u32()?;
        let total_us = r.u32()?;
        let weights_generation = r.u32()?;
        let min_score = r.f32()?;
        let nms_iou = r.f32()?;
        let records = r.take(usize::from(count) * Detection::LEN)?;
        Ok(DetectionsReply {
            frame_width,
            frame_height,
            engine_us,
            total_us,
            weights_generation,
            min_score,
            nms_iou,
            detections: DetectionList::Wire(records),
        })
    }
}

/// Detection records: as bytes of a received message, or a slice to send.
#[derive(Clone, Copy, Debug)]
pub enum DetectionList<'a> {
    /// Whole [`Detection::LEN`]-byte records, as they arrived.
    Wire(&'a [u8]),
    Records(&'a [Detection]),
}

impl<'a> DetectionList<'a> {
    pub fn len(&self) -> usize {
        match self {
            DetectionList::Wire(bytes) => bytes.len() / Detection::LEN,
            DetectionList::Records(records) => records.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Detection> + 'a {
        let (wire, records): (&'a [u8], &'a [Detection]) = match *self {
            DetectionList::Wire(bytes) => (bytes, &[]),
            DetectionList::Records(records) => (&[], records),
        };
        DetectionIter {
            wire: wire.chunks_exact(Detection::LEN),
            records: records.iter(),
        }
    }
}

impl PartialEq for DetectionList<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for DetectionList<'_> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=usize} detections", self.len());
    }
}

struct DetectionIter<'a> {
    wire: core::slice::ChunksExact<'a, u8>,
    records: core::slice::Iter<'a, Detection>,
}

impl Iterator for DetectionIter<'_> {
    type Item = Detection;

    fn next(&mut self) -> Option<Detection> {
        if let Some(chunk) = self.wire.next() {
            // A whole record: `chunks_exact` yields only `Detection::LEN` bytes.
            return Detection::read(&mut Reader::new(chunk)).ok();
        }
        self.records.next().copied()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.wire.len() + self.records.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for DetectionIter<'_> {}
