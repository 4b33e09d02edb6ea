//! Wire protocol between `fulcrumd` and the robot's firmware, version 2: one message per
//! `SOCK_SEQPACKET` packet, fixed little-endian layouts, no allocation on either side, so the
//! firmware end can be a C process or a microcontroller bridge.
//!
//! Every message is a 24-byte [`Header`] and a body of `body_len` bytes:
//!
//! ```text
//!  0  u32  magic "FULC"
//!  4  u16  version (2)
//!  6  u16  kind (see Kind)
//!  8  u32  sequence      chosen by the client; a reply echoes its request's
//! 12  u32  body_len      bytes after the header; the packet holds exactly that many
//! 16  u64  timestamp_us  capture time of the frame (sender's monotonic clock); echoed
//! ```
//!
//! The bodies are listed field by field in [`SCHEMA`] (the same text the schema hash is made
//! of). A connection starts with `Hello` (the client's [`SCHEMA_HASH`]) and the daemon's
//! `Welcome` (model input, limits, engine); a client of another version or schema is refused
//! with an `Error` and the connection closed. Then the client sends `Infer` messages (a
//! [`FrameDesc`] and, for inline frames, the pixels; for frames in the memfd ring attached
//! with `AttachRing`, an offset) and gets `Detections` back in the frame's own pixels, plus
//! the control messages: stats, health, reload, fine-tune start/stop/status.
//!
//! [`decode`] checks everything a hostile peer controls before anything else reads it:
//! magic, version, kind, exact lengths, enum values, frame sizes (overflow included), text
//! (UTF-8, bounded, no NUL), and hands out borrowed views of the packet.

mod body;
mod detections;
mod frame;
mod le;
mod schema;

use core::fmt;

pub use body::{
    AttachRing, Detection, EngineKind, ErrorCode, FineTuneFreeze, FineTuneParams, FineTuneState,
    FineTuneStatus, Health, Hello, ServiceState, Stats, Welcome,
};
pub use detections::{DetectionList, DetectionsReply};
pub use frame::{ColourSpace, Crop, FrameDesc, FrameSource, PixelFormat};
pub use schema::{SCHEMA, SCHEMA_HASH};

use le::{Reader, Writer};

/// `"FULC"` read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FULC");
/// Bumped on any incompatible change; decoders accept only their own version.
pub const VERSION: u16 = 4;
pub const HEADER_LEN: usize = 24;
/// Largest frame side, in pixels, that a frame description may announce.
pub const MAX_FRAME_SIDE: u16 = 4096;
/// Largest inline frame (a 256×256 RGB frame); larger frames go through the memfd ring.
pub const MAX_INLINE_BYTES: u32 = 256 * 256 * 3;
/// Most detection records in one reply.
pub const MAX_DETECTIONS: u16 = 1024;
/// Longest path in `Reload` and `FineTuneStart`, bytes.
pub const MAX_PATH: usize = 1024;
/// Longest text in an `Error` reply, bytes (longer text is cut at a character boundary).
pub const MAX_TEXT: usize = 256;
/// Longest list of class names in a `Classes` reply, bytes.
pub const MAX_CLASS_TEXT: usize = 8192;
/// Largest message of any kind: an `Infer` with the largest inline frame. A receiver needs a
/// buffer one byte larger to tell an oversized packet from a full one.
pub const MAX_MESSAGE_LEN: usize = HEADER_LEN + FrameDesc::LEN + MAX_INLINE_BYTES as usize;

const RELOAD_FIXED_LEN: usize = 4;
const ACK_LEN: usize = 4;
const ERROR_FIXED_LEN: usize = 4;
const CLASSES_FIXED_LEN: usize = 4;

/// Why a message could not be encoded or decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum WireError {
    /// The output buffer cannot hold what is being encoded.
    BufferTooSmall,
    /// The input ends before the header or the body it announces.
    Truncated,
    BadMagic,
    BadVersion,
    BadKind,
    /// The body's length is not what its kind and fields say (trailing bytes included).
    BadLength,
    /// Over [`MAX_MESSAGE_LEN`] or [`MAX_INLINE_BYTES`].
    TooLarge,
    /// More than [`MAX_DETECTIONS`] detections for one reply.
    TooMany,
    BadPixelFormat,
    /// Frame sides zero or over [`MAX_FRAME_SIDE`], odd where the format subsamples, a stride
    /// shorter than a row, or a length that does not match.
    BadFrameSize,
    /// A ring frame that lies (partly) outside the ring.
    BadOffset,
    /// A crop of zero area (one side zero, the other not) or reaching outside the frame.
    BadCrop,
    /// Text or a path that is not UTF-8, contains NUL, or is too long.
    BadText,
    /// An enum field or flag with a value this version does not define.
    BadValue,
}

impl WireError {
    /// The error code a daemon replies with for a message that failed to decode.
    pub const fn code(self) -> ErrorCode {
        match self {
            WireError::BadVersion => ErrorCode::UNSUPPORTED_VERSION,
            WireError::TooLarge => ErrorCode::TOO_LARGE,
            WireError::BadPixelFormat
            | WireError::BadFrameSize
            | WireError::BadOffset
            | WireError::BadCrop => ErrorCode::BAD_FRAME,
            _ => ErrorCode::MALFORMED,
        }
    }

    /// Whether the stream can still be trusted after this error. Every packet is a whole
    /// message on `SOCK_SEQPACKET`, so only a peer that is not speaking this protocol at all
    /// (magic or version) is cut off.
    pub const fn closes_connection(self) -> bool {
        matches!(self, WireError::BadMagic | WireError::BadVersion)
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::BufferTooSmall => "output buffer too small for the message",
            WireError::Truncated => "message truncated: shorter than its header or body says",
            WireError::BadMagic => "bad magic (not a fulcrum message)",
            WireError::BadVersion => "unsupported protocol version (this side speaks 4)",
            WireError::BadKind => "unknown message kind",
            WireError::BadLength => "body length does not match the message kind and fields",
            WireError::TooLarge => "message over the size limit",
            WireError::TooMany => "too many detections for one reply (max 1024)",
            WireError::BadPixelFormat => "unknown pixel format",
            WireError::BadFrameSize => "frame size, stride or length out of range or inconsistent",
            WireError::BadOffset => "frame lies outside the attached ring",
            WireError::BadCrop => "crop of zero area or reaching outside the frame",
            WireError::BadText => "text is not UTF-8, contains NUL or is too long",
            WireError::BadValue => "a field holds a value this protocol version does not define",
        })
    }
}

impl core::error::Error for WireError {}

/// What a message is. Requests go client → daemon, replies daemon → client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u16)]
pub enum Kind {
    Hello = 1,
    Welcome = 2,
    Infer = 3,
    AttachRing = 4,
    Detections = 5,
    StatsRequest = 6,
    Stats = 7,
    HealthRequest = 8,
    Health = 9,
    Reload = 10,
    FineTuneStart = 11,
    FineTuneStop = 12,
    FineTuneStatusRequest = 13,
    FineTuneStatus = 14,
    Ack = 15,
    Error = 16,
    ClassesRequest = 17,
    Classes = 18,
}

impl Kind {
    pub const ALL: [Kind; 18] = [
        Kind::Hello,
        Kind::Welcome,
        Kind::Infer,
        Kind::AttachRing,
        Kind::Detections,
        Kind::StatsRequest,
        Kind::Stats,
        Kind::HealthRequest,
        Kind::Health,
        Kind::Reload,
        Kind::FineTuneStart,
        Kind::FineTuneStop,
        Kind::FineTuneStatusRequest,
        Kind::FineTuneStatus,
        Kind::Ack,
        Kind::Error,
        Kind::ClassesRequest,
        Kind::Classes,
    ];

    pub fn from_u16(v: u16) -> Result<Self, WireError> {
        Kind::ALL
            .into_iter()
            .find(|k| *k as u16 == v)
            .ok_or(WireError::BadKind)
    }

    /// Whether a client sends this kind (else the daemon does).
    pub const fn is_request(self) -> bool {
        matches!(
            self,
            Kind::Hello
                | Kind::Infer
                | Kind::AttachRing
                | Kind::StatsRequest
                | Kind::HealthRequest
                | Kind::Reload
                | Kind::FineTuneStart
                | Kind::FineTuneStop
                | Kind::FineTuneStatusRequest
                | Kind::ClassesRequest
        )
    }
}

/// The fixed header in front of every message (magic and version are checked, not kept).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Header {
    pub kind: Kind,
    pub sequence: u32,
    pub body_len: u32,
    pub timestamp_us: u64,
}

impl Header {
    /// Reads and checks a header from the start of `buf` (the body is not looked at), so a
    /// receiver can name the request in its error reply even when the body is bad.
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        if r.u32()? != MAGIC {
            return Err(WireError::BadMagic);
        }
        if r.u16()? != VERSION {
            return Err(WireError::BadVersion);
        }
        let kind = Kind::from_u16(r.u16()?)?;
        let sequence = r.u32()?;
        let body_len = r.u32()?;
        if body_len as usize > MAX_MESSAGE_LEN - HEADER_LEN {
            return Err(WireError::TooLarge);
        }
        Ok(Header {
            kind,
            sequence,
            body_len,
            timestamp_us: r.u64()?,
        })
    }

    fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u32(MAGIC)?;
        w.u16(VERSION)?;
        w.u16(self.kind as u16)?;
        w.u32(self.sequence)?;
        w.u32(self.body_len)?;
        w.u64(self.timestamp_us)
    }
}

/// An `Infer` request: the frame's description and, for inline frames, its pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Frame<'a> {
    pub desc: FrameDesc,
    /// `desc.length` bytes for [`FrameSource::Inline`], empty for [`FrameSource::Ring`].
    pub pixels: &'a [u8],
}

/// An `Error` reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ErrorReply<'a> {
    pub code: ErrorCode,
    /// What went wrong, for a person (at most [`MAX_TEXT`] bytes).
    pub text: &'a str,
}

impl<'a> ErrorReply<'a> {
    /// An error reply whose text is cut to [`MAX_TEXT`] bytes at a character boundary.
    pub fn new(code: ErrorCode, text: &'a str) -> Self {
        let mut end = text.len().min(MAX_TEXT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        ErrorReply {
            code,
            text: &text[..end],
        }
    }
}

/// One message, its variable parts borrowed from the packet (decoding) or from the caller
/// (encoding).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Message<'a> {
    Hello(Hello),
    Welcome(Welcome),
    Infer(Frame<'a>),
    AttachRing(AttachRing),
    Detections(DetectionsReply<'a>),
    StatsRequest,
    Stats(Stats),
    HealthRequest,
    Health(Health),
    /// Load and check new weights, then swap them in; an empty path reloads the configured
    /// file.
    Reload {
        path: &'a str,
    },
    FineTuneStart {
        params: FineTuneParams,
        /// A packed dataset (with a held-out split) on the daemon's machine.
        path: &'a str,
    },
    FineTuneStop,
    FineTuneStatusRequest,
    FineTuneStatus(FineTuneStatus),
    /// A request of this kind was carried out.
    Ack(Kind),
    Error(ErrorReply<'a>),
    ClassesRequest,
    /// The model's class names, one a line, in class-id order (at most
    /// [`MAX_CLASS_TEXT`] bytes).
    Classes {
        names: &'a str,
    },
}

impl<'a> Message<'a> {
    pub const fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Welcome(_) => Kind::Welcome,
            Message::Infer(_) => Kind::Infer,
            Message::AttachRing(_) => Kind::AttachRing,
            Message::Detections(_) => Kind::Detections,
            Message::StatsRequest => Kind::StatsRequest,
            Message::Stats(_) => Kind::Stats,
            Message::HealthRequest => Kind::HealthRequest,
            Message::Health(_) => Kind::Health,
            Message::Reload { .. } => Kind::Reload,
            Message::FineTuneStart { .. } => Kind::FineTuneStart,
            Message::FineTuneStop => Kind::FineTuneStop,
            Message::FineTuneStatusRequest => Kind::FineTuneStatusRequest,
            Message::FineTuneStatus(_) => Kind::FineTuneStatus,
            Message::Ack(_) => Kind::Ack,
            Message::Error(_) => Kind::Error,
            Message::ClassesRequest => Kind::ClassesRequest,
            Message::Classes { .. } => Kind::Classes,
        }
    }

    /// Bytes of the body (the message less its header).
    pub fn body_len(&self) -> usize {
        match self {
            Message::Hello(_) => Hello::LEN,
            Message::Welcome(_) => Welcome::LEN,
            Message::Infer(frame) => FrameDesc::LEN + frame.pixels.len(),
            Message::AttachRing(_) => AttachRing::LEN,
            Message::Detections(reply) => reply.body_len(),
            Message::StatsRequest
            | Message::HealthRequest
            | Message::FineTuneStop
            | Message::FineTuneStatusRequest
            | Message::ClassesRequest => 0,
            Message::Stats(_) => Stats::LEN,
            Message::Health(_) => Health::LEN,
            Message::Reload { path } => RELOAD_FIXED_LEN + path.len(),
            Message::FineTuneStart { path, .. } => FineTuneParams::LEN + path.len(),
            Message::FineTuneStatus(_) => FineTuneStatus::LEN,
            Message::Ack(_) => ACK_LEN,
            Message::Error(e) => ERROR_FIXED_LEN + e.text.len(),
            Message::Classes { names } => CLASSES_FIXED_LEN + names.len(),
        }
    }

    /// Bytes of the whole message.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.body_len()
    }

    /// Writes the message with this header `sequence` and `timestamp_us` to the start of
    /// `buf`; returns its length. Checks what [`decode`] checks, so what encodes decodes.
    pub fn encode(
        &self,
        sequence: u32,
        timestamp_us: u64,
        buf: &mut [u8],
    ) -> Result<usize, WireError> {
        let body_len = self.body_len();
        if body_len > MAX_MESSAGE_LEN - HEADER_LEN {
            return Err(WireError::TooLarge);
        }
        let mut w = Writer::new(buf);
        let header = Header {
            kind: self.kind(),
            sequence,
            body_len: body_len as u32,
            timestamp_us,
        };
        header.write(&mut w)?;
        match self {
            Message::Hello(m) => m.write(&mut w)?,
            Message::Welcome(m) => m.write(&mut w)?,
            Message::Infer(frame) => {
                frame.desc.validate()?;
                let expected = match frame.desc.source {
                    FrameSource::Inline => frame.desc.length as usize,
                    FrameSource::Ring => 0,
                };
                if frame.pixels.len() != expected {
                    return Err(WireError::BadLength);
                }
                frame.desc.write(&mut w)?;
                w.bytes(frame.pixels)?;
            }
            Message::AttachRing(m) => m.write(&mut w)?,
            Message::Detections(m) => m.write(&mut w)?,
            Message::StatsRequest
            | Message::HealthRequest
            | Message::FineTuneStop
            | Message::FineTuneStatusRequest
            | Message::ClassesRequest => {}
            Message::Stats(m) => m.write(&mut w)?,
            Message::Health(m) => m.write(&mut w)?,
            Message::Reload { path } => {
                w.u16(check_path(path)?)?;
                w.reserved(2)?;
                w.bytes(path.as_bytes())?;
            }
            Message::FineTuneStart { params, path } => {
                params.write(&mut w, check_path(path)?)?;
                w.bytes(path.as_bytes())?;
            }
            Message::FineTuneStatus(m) => m.write(&mut w)?,
            Message::Ack(kind) => {
                w.u16(*kind as u16)?;
                w.reserved(2)?;
            }
            Message::Error(e) => {
                w.u16(e.code.0)?;
                w.u16(check_text(e.text.as_bytes(), MAX_TEXT)? as u16)?;
                w.bytes(e.text.as_bytes())?;
            }
            Message::Classes { names } => {
                let len = check_text(names.as_bytes(), MAX_CLASS_TEXT)?;
                w.u16(class_count(names))?;
                w.u16(len as u16)?;
                w.bytes(names.as_bytes())?;
            }
        }
        debug_assert_eq!(w.len(), self.encoded_len());
        Ok(w.len())
    }

    /// Reads the body of a message of `kind`; `body` must be exactly the body.
    fn decode_body(kind: Kind, body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let message = match kind {
            Kind::Hello => Message::Hello(Hello::read(&mut r)?),
            Kind::Welcome => Message::Welcome(Welcome::read(&mut r)?),
            Kind::Infer => {
                let desc = FrameDesc::read(&mut r)?;
                let pixels = match desc.source {
                    FrameSource::Inline if desc.length > MAX_INLINE_BYTES => {
                        return Err(WireError::TooLarge)
                    }
                    FrameSource::Inline => r.take(desc.length as usize)?,
                    FrameSource::Ring => &[],
                };
                Message::Infer(Frame { desc, pixels })
            }
            Kind::AttachRing => Message::AttachRing(AttachRing::read(&mut r)?),
            Kind::Detections => Message::Detections(DetectionsReply::read(&mut r)?),
            Kind::StatsRequest => Message::StatsRequest,
            Kind::Stats => Message::Stats(Stats::read(&mut r)?),
            Kind::HealthRequest => Message::HealthRequest,
            Kind::Health => Message::Health(Health::read(&mut r)?),
            Kind::Reload => {
                let len = r.u16()?;
                r.reserved(2)?;
                Message::Reload {
                    path: read_text(&mut r, usize::from(len), MAX_PATH)?,
                }
            }
            Kind::FineTuneStart => {
                let (params, len) = FineTuneParams::read(&mut r)?;
                let path = read_text(&mut r, usize::from(len), MAX_PATH)?;
                Message::FineTuneStart { params, path }
            }
            Kind::FineTuneStop => Message::FineTuneStop,
            Kind::FineTuneStatusRequest => Message::FineTuneStatusRequest,
            Kind::FineTuneStatus => Message::FineTuneStatus(FineTuneStatus::read(&mut r)?),
            Kind::Ack => {
                let kind = Kind::from_u16(r.u16()?)?;
                r.reserved(2)?;
                Message::Ack(kind)
            }
            Kind::Error => {
                let code = ErrorCode(r.u16()?);
                let len = r.u16()?;
                let text = read_text(&mut r, usize::from(len), MAX_TEXT)?;
                Message::Error(ErrorReply { code, text })
            }
            Kind::ClassesRequest => Message::ClassesRequest,
            Kind::Classes => {
                let count = r.u16()?;
                let len = r.u16()?;
                let names = read_text(&mut r, usize::from(len), MAX_CLASS_TEXT)?;
                if class_count(names) != count {
                    return Err(WireError::BadLength);
                }
                Message::Classes { names }
            }
        };
        if !r.rest().is_empty() {
            return Err(WireError::BadLength);
        }
        Ok(message)
    }
}

/// Reads one whole message: `buf` is exactly one packet. Returns the header (sequence and
/// timestamp to echo) and the message, which borrows from `buf`.
pub fn decode(buf: &[u8]) -> Result<(Header, Message<'_>), WireError> {
    let header = Header::decode(buf)?;
    let body = &buf[HEADER_LEN..];
    let body_len = header.body_len as usize;
    if body.len() < body_len {
        return Err(WireError::Truncated);
    }
    if body.len() > body_len {
        return Err(WireError::BadLength);
    }
    let message = Message::decode_body(header.kind, body).map_err(|e| match e {
        // The header's length is the whole packet, so a body that ends early is a body whose
        // fields do not add up to its length.
        WireError::Truncated => WireError::BadLength,
        e => e,
    })?;
    Ok((header, message))
}

fn check_text(bytes: &[u8], max: usize) -> Result<usize, WireError> {
    if bytes.len() > max || bytes.contains(&0) {
        return Err(WireError::BadText);
    }
    Ok(bytes.len())
}

/// Lines in a newline-separated list of names (none for empty text).
fn class_count(names: &str) -> u16 {
    if names.is_empty() {
        0
    } else {
        names.split('\n').count().min(usize::from(u16::MAX)) as u16
    }
}

fn check_path(path: &str) -> Result<u16, WireError> {
    check_text(path.as_bytes(), MAX_PATH).map(|n| n as u16)
}

fn read_text<'a>(r: &mut Reader<'a>, len: usize, max: usize) -> Result<&'a str, WireError> {
    let bytes = r.take(len)?;
    check_text(bytes, max)?;
    core::str::from_utf8(bytes).map_err(|_| WireError::BadText)
}

#[cfg(test)]
mod tests;
