//! Little-endian cursors over a message's bytes. Reads fail with [`WireError::Truncated`] past
//! the end; writes fail with [`WireError::BufferTooSmall`]. Nothing panics on any input.

use super::WireError;

/// Reads fixed-width little-endian fields from the front of a byte slice.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { rest: buf }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.rest.len() {
            return Err(WireError::Truncated);
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let bytes = self.take(N)?;
        let mut out = [0; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        self.array().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        self.array().map(u64::from_le_bytes)
    }

    pub(crate) fn f32(&mut self) -> Result<f32, WireError> {
        self.array().map(f32::from_le_bytes)
    }

    /// Skips a reserved field: written as zero, ignored on reading (room to grow within a
    /// version).
    pub(crate) fn reserved(&mut self, n: usize) -> Result<(), WireError> {
        self.take(n).map(drop)
    }

    /// The bytes not read yet.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

/// Writes fixed-width little-endian fields into a byte slice, front to back.
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, len: 0 }
    }

    /// Bytes written so far.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        let end = self
            .len
            .checked_add(bytes.len())
            .ok_or(WireError::BufferTooSmall)?;
        self.buf
            .get_mut(self.len..end)
            .ok_or(WireError::BufferTooSmall)?
            .copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }

    pub(crate) fn u8(&mut self, v: u8) -> Result<(), WireError> {
        self.bytes(&[v])
    }

    pub(crate) fn u16(&mut self, v: u16) -> Result<(), WireError> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn u32(&mut self, v: u32) -> Result<(), WireError> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn u64(&mut self, v: u64) -> Result<(), WireError> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn f32(&mut self, v: f32) -> Result<(), WireError> {
        self.bytes(&v.to_le_bytes())
    }

    pub(crate) fn reserved(&mut self, n: usize) -> Result<(), WireError> {
        let end = self.len.checked_add(n).ok_or(WireError::BufferTooSmall)?;
        self.buf
            .get_mut(self.len..end)
            .ok_or(WireError::BufferTooSmall)?
            .fill(0);
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let buf = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(0x0302));
        assert_eq!(r.u32(), Ok(0x0706_0504));
        assert_eq!(r.u16(), Err(WireError::Truncated));
        assert_eq!(r.rest(), &[8]);
        assert_eq!(r.take(2), Err(WireError::Truncated));
        assert_eq!(r.take(1), Ok(&[8u8][..]));
        assert_eq!(r.u8(), Err(WireError::Truncated));
    }

    #[test]
    fn writes_little_endian_and_refuses_overflow() {
        let mut buf = [0xAAu8; 7];
        let mut w = Writer::new(&mut buf);
        w.u16(0x0102).unwrap();
        w.reserved(1).unwrap();
        w.u32(0x0304_0506).unwrap();
        assert_eq!(w.len(), 7);
        assert_eq!(w.u8(0), Err(WireError::BufferTooSmall));
        assert_eq!(buf, [2, 1, 0, 6, 5, 4, 3]);
    }
}
