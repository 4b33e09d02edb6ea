//! The one-page header at the start of every shard.

use std::path::Path;

use super::{page_align, Error, Result, PAGE_SIZE};

pub const MAGIC: [u8; 8] = *b"FULCRUM\x1a";
pub const FORMAT_VERSION: u32 = 1;
pub const HEADER_SIZE: usize = PAGE_SIZE;
const CRC_OFFSET: usize = HEADER_SIZE - 4;

/// A shard's header, decoded. See the module docs of `format` for the byte layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    pub record_size: u32,
    pub record_count: u32,
    pub width: u32,
    pub height: u32,
    pub channels: u32,
    pub max_boxes: u32,
    pub num_classes: u32,
    pub shard_index: u32,
    pub first_record: u64,
    pub dataset_id: u64,
}

impl ShardHeader {
    /// The file length this header promises.
    pub fn file_len(&self) -> u64 {
        HEADER_SIZE as u64 + self.record_count as u64 * self.record_size as u64
    }

    /// Byte offset of local record `i` in the shard file.
    pub fn record_offset(&self, i: u32) -> u64 {
        HEADER_SIZE as u64 + i as u64 * self.record_size as u64
    }

    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..8].copy_from_slice(&MAGIC);
        let words = [
            FORMAT_VERSION,
            HEADER_SIZE as u32,
            self.record_size,
            self.record_count,
            self.width,
            self.height,
            self.channels,
            self.max_boxes,
            self.num_classes,
            self.shard_index,
        ];
        for (i, w) in words.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[48..56].copy_from_slice(&self.first_record.to_le_bytes());
        b[56..64].copy_from_slice(&self.dataset_id.to_le_bytes());
        let crc = crc32c::crc32c(&b[..CRC_OFFSET]);
        b[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and validates a header read from `path` (used in error messages only).
    pub fn decode(b: &[u8], path: &Path) -> Result<Self> {
        let bad = |what: &str| Error::BadHeader {
            path: path.to_owned(),
            what: what.to_owned(),
        };
        if b.len() < HEADER_SIZE {
            return Err(Error::Truncated {
                path: path.to_owned(),
                actual: b.len() as u64,
                expected: HEADER_SIZE as u64,
            });
        }
        if b[0..8] != MAGIC {
            return Err(Error::BadMagic {
                path: path.to_owned(),
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(Error::BadVersion {
                path: path.to_owned(),
                found: version,
                expected: FORMAT_VERSION,
            });
        }
        if crc32c::crc32c(&b[..CRC_OFFSET]) != u32_at(CRC_OFFSET) {
            return Err(bad("header checksum mismatch"));
        }
        if u32_at(12) as usize != HEADER_SIZE {
            return Err(bad("header size is not 4096"));
        }
        let h = ShardHeader {
            record_size: u32_at(16),
            record_count: u32_at(20),
            width: u32_at(24),
            height: u32_at(28),
            channels: u32_at(32),
            max_boxes: u32_at(36),
            num_classes: u32_at(40),
            shard_index: u32_at(44),
            first_record: u64_at(48),
            dataset_id: u64_at(56),
        };
        let layout = super::RecordLayout::new(h.width, h.height, h.channels, h.max_boxes)
            .map_err(|what| bad(&what.to_string()))?;
        if h.record_size as usize != layout.record_size
            || !(h.record_size as usize).is_multiple_of(PAGE_SIZE)
        {
            return Err(bad("record size does not match the image and box layout"));
        }
        debug_assert_eq!(page_align(h.record_size as usize), h.record_size as usize);
        Ok(h)
    }

    pub fn layout(&self) -> super::RecordLayout {
        super::RecordLayout::new(self.width, self.height, self.channels, self.max_boxes)
            .expect("validated in decode")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ShardHeader {
        let layout = super::super::RecordLayout::new(128, 128, 3, 32).unwrap();
        ShardHeader {
            record_size: layout.record_size as u32,
            record_count: 7,
            width: 128,
            height: 128,
            channels: 3,
            max_boxes: 32,
            num_classes: 2,
            shard_index: 3,
            first_record: 3 * 1024,
            dataset_id: 0xDEAD_BEEF_1234,
        }
    }

    #[test]
    fn roundtrip() {
        let h = sample();
        let b = h.encode();
        assert_eq!(ShardHeader::decode(&b, Path::new("x")).unwrap(), h);
        assert_eq!(h.file_len(), 4096 + 7 * h.record_size as u64);
    }

    #[test]
    fn rejects_bad_magic_version_crc_and_short() {
        let p = Path::new("s.fsh");
        let mut b = sample().encode();
        b[0] = b'X';
        assert!(matches!(
            ShardHeader::decode(&b, p),
            Err(Error::BadMagic { .. })
        ));

        let mut b = sample().encode();
        b[8] = 9;
        let err = ShardHeader::decode(&b, p).unwrap_err();
        assert!(matches!(err, Error::BadVersion { found: 9, .. }), "{err}");
        assert!(err.to_string().contains("s.fsh"));

        let mut b = sample().encode();
        b[20] ^= 1;
        assert!(matches!(
            ShardHeader::decode(&b, p),
            Err(Error::BadHeader { .. })
        ));

        let b = sample().encode();
        assert!(matches!(
            ShardHeader::decode(&b[..100], p),
            Err(Error::Truncated { .. })
        ));
    }
}
