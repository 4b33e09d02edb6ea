//! Wire protocol between `fulcrumd` and the robot's firmware: fixed-size little-endian records,
//! no allocation, so the firmware side can be a microcontroller.
//!
//! A frame is a [`FrameHeader`] followed by `count` [`Detection`] records:
//!
//! ```text
//! header (24 bytes)                      detection (12 bytes)
//!  0  u32  magic  "FULC"                  0  u16  class
//!  4  u16  version (1)                    2  u16  score × 65535
//!  6  u16  kind (1 detections, 2 beat)    4  u16  x0   (pixels of the model input)
//!  8  u32  sequence                       6  u16  y0
//! 12  u16  count                          8  u16  x1
//! 14  u16  reserved, written 0, ignored  10  u16  y1
//! 16  u64  timestamp_us (capture time)
//! ```

use core::fmt;

/// `"FULC"` read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FULC");
/// Bumped on any layout change; decoders accept only their own version.
pub const VERSION: u16 = 1;

/// Why a frame could not be encoded or decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WireError {
    /// The output buffer cannot hold what is being encoded.
    BufferTooSmall,
    /// The input ends before the header or the records it announces.
    Truncated,
    BadMagic,
    BadVersion,
    BadKind,
    /// More than `u16::MAX` detections for one frame.
    TooMany,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::BufferTooSmall => "output buffer too small for the frame",
            WireError::Truncated => "frame truncated",
            WireError::BadMagic => "bad frame magic (not a fulcrum frame)",
            WireError::BadVersion => "unsupported frame version",
            WireError::BadKind => "unknown frame kind",
            WireError::TooMany => "too many detections for one frame (max 65535)",
        })
    }
}

impl core::error::Error for WireError {}

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u16)]
pub enum FrameKind {
    /// `count` detection records follow.
    Detections = 1,
    /// Liveness only; `count` is 0.
    Heartbeat = 2,
}

impl FrameKind {
    fn from_u16(v: u16) -> Result<Self, WireError> {
        match v {
            1 => Ok(FrameKind::Detections),
            2 => Ok(FrameKind::Heartbeat),
            _ => Err(WireError::BadKind),
        }
    }
}

/// One detected box in pixels of the model input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Detection {
    pub class: u16,
    /// Confidence in 0..=1 scaled to 0..=65535 (see [`Detection::score_from_unit`]).
    pub score: u16,
    pub x0: u16,
    pub y0: u16,
    pub x1: u16,
    pub y1: u16,
}

impl Detection {
    pub const LEN: usize = 12;

    /// Quantises a 0..=1 score (clamped; NaN gives 0).
    pub fn score_from_unit(score: f32) -> u16 {
        // `as` saturates and maps NaN to 0.
        (score.clamp(0.0, 1.0) * 65535.0 + 0.5) as u16
    }

    pub fn score_unit(&self) -> f32 {
        f32::from(self.score) / 65535.0
    }

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0; Self::LEN];
        let fields = [self.class, self.score, self.x0, self.y0, self.x1, self.y1];
        for (chunk, v) in out.chunks_exact_mut(2).zip(fields) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn from_bytes(b: &[u8; Self::LEN]) -> Self {
        let at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Detection {
            class: at(0),
            score: at(2),
            x0: at(4),
            y0: at(6),
            x1: at(8),
            y1: at(10),
        }
    }

    /// Writes the record to the start of `buf`; returns the bytes written.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let out = buf.get_mut(..Self::LEN).ok_or(WireError::BufferTooSmall)?;
        out.copy_from_slice(&self.to_bytes());
        Ok(Self::LEN)
    }

    /// Reads a record from the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let b = buf
            .first_chunk::<{ Self::LEN }>()
            .ok_or(WireError::Truncated)?;
        Ok(Self::from_bytes(b))
    }
}

/// The fixed header in front of every frame. `magic` and `version` are kept as fields so
/// tools can show what arrived; [`FrameHeader::new`] fills them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FrameHeader {
    pub magic: u32,
    pub version: u16,
    pub kind: FrameKind,
    /// Increments per frame; gaps tell the firmware it missed frames.
    pub sequence: u32,
    /// Number of [`Detection`] records after the header.
    pub count: u16,
    /// Capture time of the image, microseconds on the sender's monotonic clock.
    pub timestamp_us: u64,
}

impl FrameHeader {
    pub const LEN: usize = 24;

    pub const fn new(kind: FrameKind, sequence: u32, count: u16, timestamp_us: u64) -> Self {
        FrameHeader {
            magic: MAGIC,
            version: VERSION,
            kind,
            sequence,
            count,
            timestamp_us,
        }
    }

    /// Bytes of the whole frame this header announces (header + records), so a stream reader
    /// knows how much more to read.
    pub const fn frame_len(&self) -> usize {
        Self::LEN + self.count as usize * Detection::LEN
    }

    /// Writes the header to the start of `buf`; returns the bytes written.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let out = buf.get_mut(..Self::LEN).ok_or(WireError::BufferTooSmall)?;
        out[0..4].copy_from_slice(&self.magic.to_le_bytes());
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&(self.kind as u16).to_le_bytes());
        out[8..12].copy_from_slice(&self.sequence.to_le_bytes());
        out[12..14].copy_from_slice(&self.count.to_le_bytes());
        out[14..16].fill(0); // reserved
        out[16..24].copy_from_slice(&self.timestamp_us.to_le_bytes());
        Ok(Self::LEN)
    }

    /// Reads and validates a header from the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let b = buf
            .first_chunk::<{ Self::LEN }>()
            .ok_or(WireError::Truncated)?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u16_at(4);
        if version != VERSION {
            return Err(WireError::BadVersion);
        }
        let mut ts = [0; 8];
        ts.copy_from_slice(&b[16..24]);
        Ok(FrameHeader {
            magic,
            version,
            kind: FrameKind::from_u16(u16_at(6))?,
            sequence: u32_at(8),
            count: u16_at(12),
            timestamp_us: u64::from_le_bytes(ts),
        })
    }
}

/// Writes a [`FrameKind::Detections`] frame into `buf`; returns its length.
pub fn encode_detections(
    sequence: u32,
    timestamp_us: u64,
    detections: &[Detection],
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let count = u16::try_from(detections.len()).map_err(|_| WireError::TooMany)?;
    let header = FrameHeader::new(FrameKind::Detections, sequence, count, timestamp_us);
    let out = buf
        .get_mut(..header.frame_len())
        .ok_or(WireError::BufferTooSmall)?;
    let (head, body) = out.split_at_mut(FrameHeader::LEN);
    header.encode(head)?;
    for (d, chunk) in detections.iter().zip(body.chunks_exact_mut(Detection::LEN)) {
        chunk.copy_from_slice(&d.to_bytes());
    }
    Ok(header.frame_len())
}

/// Reads a frame from the start of `buf`: its header and its detection records. Bytes after
/// [`FrameHeader::frame_len`] are left alone (the next frame, on a stream).
pub fn decode_frame(buf: &[u8]) -> Result<(FrameHeader, Detections<'_>), WireError> {
    let header = FrameHeader::decode(buf)?;
    let body = buf
        .get(FrameHeader::LEN..header.frame_len())
        .ok_or(WireError::Truncated)?;
    Ok((header, Detections(body.chunks_exact(Detection::LEN))))
}

/// The detection records of a decoded frame.
#[derive(Clone, Debug)]
pub struct Detections<'a>(core::slice::ChunksExact<'a, u8>);

impl Iterator for Detections<'_> {
    type Item = Detection;
    fn next(&mut self) -> Option<Detection> {
        let chunk = self.0.next()?;
        chunk.first_chunk().map(Detection::from_bytes)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl ExactSizeIterator for Detections<'_> {}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    const DETS: [Detection; 2] = [
        Detection {
            class: 1,
            score: 65535,
            x0: 3,
            y0: 4,
            x1: 60,
            y1: 127,
        },
        Detection {
            class: 0,
            score: 32768,
            x0: 0,
            y0: 0,
            x1: 0x1234,
            y1: 0xABCD,
        },
    ];

    #[test]
    fn detection_layout_is_little_endian() {
        let mut buf = [0u8; 16];
        assert_eq!(DETS[1].encode(&mut buf), Ok(Detection::LEN));
        assert_eq!(
            &buf[..12],
            &[0, 0, 0, 0x80, 0, 0, 0, 0, 0x34, 0x12, 0xCD, 0xAB]
        );
        assert_eq!(Detection::decode(&buf), Ok(DETS[1]));
    }

    #[test]
    fn header_roundtrip_and_layout() {
        let h = FrameHeader::new(FrameKind::Heartbeat, 0xDEAD_BEEF, 0, 1_234_567);
        let mut buf = [0xFFu8; FrameHeader::LEN];
        assert_eq!(h.encode(&mut buf), Ok(FrameHeader::LEN));
        assert_eq!(&buf[..4], b"FULC");
        assert_eq!(&buf[4..8], &[1, 0, 2, 0]);
        assert_eq!(&buf[14..16], &[0, 0]);
        assert_eq!(FrameHeader::decode(&buf), Ok(h));
    }

    #[test]
    fn frame_roundtrip() {
        let mut buf = [0u8; 128];
        let n = encode_detections(7, 99, &DETS, &mut buf).unwrap();
        assert_eq!(n, FrameHeader::LEN + 2 * Detection::LEN);
        let (h, dets) = decode_frame(&buf[..n]).unwrap();
        assert_eq!(
            (h.kind, h.sequence, h.count, h.timestamp_us),
            (FrameKind::Detections, 7, 2, 99)
        );
        assert_eq!(h.frame_len(), n);
        assert_eq!(dets.len(), 2);
        assert_eq!(dets.collect::<Vec<_>>(), DETS);

        let n = encode_detections(8, 0, &[], &mut buf).unwrap();
        assert_eq!(n, FrameHeader::LEN);
        assert_eq!(decode_frame(&buf[..n]).unwrap().1.count(), 0);
    }

    #[test]
    fn score_quantisation() {
        assert_eq!(Detection::score_from_unit(1.0), 65535);
        assert_eq!(Detection::score_from_unit(0.5), 32768);
        assert_eq!(Detection::score_from_unit(0.0), 0);
        assert_eq!(Detection::score_from_unit(2.0), 65535);
        assert_eq!(Detection::score_from_unit(-1.0), 0);
        assert_eq!(Detection::score_from_unit(f32::NAN), 0);
        let d = Detection {
            score: 65535,
            ..Detection::default()
        };
        assert_eq!(d.score_unit(), 1.0);
    }

    #[test]
    fn each_error() {
        let mut buf = [0u8; 64];
        let n = encode_detections(1, 2, &DETS, &mut buf).unwrap();

        // Encoding into too little room.
        assert_eq!(
            encode_detections(1, 2, &DETS, &mut buf[..n - 1]),
            Err(WireError::BufferTooSmall)
        );
        assert_eq!(DETS[0].encode(&mut [0; 11]), Err(WireError::BufferTooSmall));
        let h = FrameHeader::new(FrameKind::Heartbeat, 0, 0, 0);
        assert_eq!(h.encode(&mut [0; 23]), Err(WireError::BufferTooSmall));
        let many = std::vec![Detection::default(); usize::from(u16::MAX) + 1];
        assert_eq!(
            encode_detections(0, 0, &many, &mut []),
            Err(WireError::TooMany)
        );

        // Decoding short input: in the header, and in the records it announces.
        assert_eq!(
            FrameHeader::decode(&buf[..23]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            decode_frame(&buf[..n - 1]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(Detection::decode(&buf[..11]), Err(WireError::Truncated));

        // Corrupt fields.
        let mut bad = buf;
        bad[0] ^= 1;
        assert_eq!(decode_frame(&bad).err(), Some(WireError::BadMagic));
        let mut bad = buf;
        bad[4] = 2;
        assert_eq!(decode_frame(&bad).err(), Some(WireError::BadVersion));
        let mut bad = buf;
        bad[6] = 9;
        assert_eq!(decode_frame(&bad).err(), Some(WireError::BadKind));
    }
}
