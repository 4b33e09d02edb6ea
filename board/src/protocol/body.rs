//! The fixed-layout bodies of the protocol's messages (the variable parts — inline pixels,
//! detection records, text — are handled by [`super::Message`]).

use super::le::{Reader, Writer};
use super::WireError;

/// Which engine runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum EngineKind {
    #[default]
    Cpu = 1,
    Vulkan = 2,
}

impl EngineKind {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        match v {
            1 => Ok(EngineKind::Cpu),
            2 => Ok(EngineKind::Vulkan),
            _ => Err(WireError::BadValue),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            EngineKind::Cpu => "cpu",
            EngineKind::Vulkan => "vulkan",
        }
    }
}

/// What the daemon is doing, as `Health` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum ServiceState {
    /// Loading weights or warming up; not serving yet.
    Starting = 0,
    Ready = 1,
    /// Loading new weights; the old ones keep serving.
    Reloading = 2,
    /// Finishing in-flight requests before exit.
    Stopping = 3,
}

impl ServiceState {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        match v {
            0 => Ok(ServiceState::Starting),
            1 => Ok(ServiceState::Ready),
            2 => Ok(ServiceState::Reloading),
            3 => Ok(ServiceState::Stopping),
            _ => Err(WireError::BadValue),
        }
    }
}

/// Where a fine-tune is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum FineTuneState {
    Idle = 0,
    Running = 1,
    /// Asked to stop; checkpointing.
    Stopping = 2,
    Finished = 3,
    Failed = 4,
}

impl FineTuneState {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        match v {
            0 => Ok(FineTuneState::Idle),
            1 => Ok(FineTuneState::Running),
            2 => Ok(FineTuneState::Stopping),
            3 => Ok(FineTuneState::Finished),
            4 => Ok(FineTuneState::Failed),
            _ => Err(WireError::BadValue),
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            FineTuneState::Idle => "idle",
            FineTuneState::Running => "running",
            FineTuneState::Stopping => "stopping",
            FineTuneState::Finished => "finished",
            FineTuneState::Failed => "failed",
        }
    }
}

/// Client → daemon, first message on a connection. The protocol version is the header's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Hello {
    /// The client's [`super::SCHEMA_HASH`]; a mismatch is refused at connect.
    pub schema_hash: u32,
}

impl Hello {
    pub const LEN: usize = 8;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u32(self.schema_hash)?;
        w.reserved(4)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let schema_hash = r.u32()?;
        r.reserved(4)?;
        Ok(Hello { schema_hash })
    }
}

/// Daemon → client, the answer to `Hello`: what the daemon serves and its limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Welcome {
    pub schema_hash: u32,
    /// The model's input size; frames of any size are letterboxed to it.
    pub input_width: u16,
    pub input_height: u16,
    pub classes: u16,
    /// Largest frame side the daemon accepts (at most [`super::MAX_FRAME_SIDE`]).
    pub max_frame_side: u16,
    /// Largest inline frame; larger ones go through the memfd ring.
    pub max_inline_bytes: u32,
    /// Most detections one reply holds.
    pub max_detections: u16,
    pub engine: EngineKind,
    /// Bumped every time new weights are swapped in.
    pub weights_generation: u32,
}

impl Welcome {
    pub const LEN: usize = 24;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u32(self.schema_hash)?;
        w.u16(self.input_width)?;
        w.u16(self.input_height)?;
        w.u16(self.classes)?;
        w.u16(self.max_frame_side)?;
        w.u32(self.max_inline_bytes)?;
        w.u16(self.max_detections)?;
        w.u8(self.engine as u8)?;
        w.reserved(1)?;
        w.u32(self.weights_generation)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let schema_hash = r.u32()?;
        let input_width = r.u16()?;
        let input_height = r.u16()?;
        let classes = r.u16()?;
        let max_frame_side = r.u16()?;
        let max_inline_bytes = r.u32()?;
        let max_detections = r.u16()?;
        let engine = EngineKind::from_u8(r.u8()?)?;
        r.reserved(1)?;
        Ok(Welcome {
            schema_hash,
            input_width,
            input_height,
            classes,
            max_frame_side,
            max_inline_bytes,
            max_detections,
            engine,
            weights_generation: r.u32()?,
        })
    }
}

/// Client → daemon, sent once with the ring's memfd as `SCM_RIGHTS` ancillary data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AttachRing {
    /// Bytes of the ring; the memfd must be at least this long and sealed against shrinking.
    pub len: u64,
}

impl AttachRing {
    pub const LEN: usize = 8;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u64(self.len)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(AttachRing { len: r.u64()? })
    }
}

/// One detected box, in pixels of the frame that was sent (sub-pixel, so a client shows
/// exactly what `fulcrum infer` shows for the same image).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Detection {
    pub class: u16,
    /// Confidence, 0..=1.
    pub score: f32,
    pub x0: f32,
    pub y0: f32,
    pub x1: f32,
    pub y1: f32,
}

impl Detection {
    pub const LEN: usize = 24;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u16(self.class)?;
        w.reserved(2)?;
        for v in [self.score, self.x0, self.y0, self.x1, self.y1] {
            w.f32(v)?;
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let class = r.u16()?;
        r.reserved(2)?;
        Ok(Detection {
            class,
            score: r.f32()?,
            x0: r.f32()?,
            y0: r.f32()?,
            x1: r.f32()?,
            y1: r.f32()?,
        })
    }
}

/// Daemon → client: counters and latency since start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Stats {
    /// Frames answered with detections.
    pub requests: u64,
    /// Error replies sent (malformed messages, bad frames, refusals).
    pub errors: u64,
    /// Connections refused (credentials or protocol mismatch).
    pub refused: u32,
    /// Clients connected now.
    pub clients: u16,
    /// Latency percentiles, frame received → detections sent, microseconds.
    pub p50_us: u32,
    pub p99_us: u32,
    pub p999_us: u32,
    /// The engine's own forward time (median), microseconds.
    pub forward_us: u32,
    pub uptime_s: u32,
    pub weights_generation: u32,
}

impl Stats {
    pub const LEN: usize = 48;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u64(self.requests)?;
        w.u64(self.errors)?;
        w.u32(self.refused)?;
        w.u16(self.clients)?;
        w.reserved(2)?;
        for v in [
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.forward_us,
            self.uptime_s,
            self.weights_generation,
        ] {
            w.u32(v)?;
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let requests = r.u64()?;
        let errors = r.u64()?;
        let refused = r.u32()?;
        let clients = r.u16()?;
        r.reserved(2)?;
        Ok(Stats {
            requests,
            errors,
            refused,
            clients,
            p50_us: r.u32()?,
            p99_us: r.u32()?,
            p999_us: r.u32()?,
            forward_us: r.u32()?,
            uptime_s: r.u32()?,
            weights_generation: r.u32()?,
        })
    }
}

/// Daemon → client: is it serving, on what, and is its loop alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Health {
    pub state: ServiceState,
    pub engine: EngineKind,
    pub uptime_s: u32,
    pub weights_generation: u32,
    /// Milliseconds since the serving loop last made progress.
    pub since_progress_ms: u32,
}

impl Health {
    pub const LEN: usize = 16;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(self.state as u8)?;
        w.u8(self.engine as u8)?;
        w.reserved(2)?;
        w.u32(self.uptime_s)?;
        w.u32(self.weights_generation)?;
        w.u32(self.since_progress_ms)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let state = ServiceState::from_u8(r.u8()?)?;
        let engine = EngineKind::from_u8(r.u8()?)?;
        r.reserved(2)?;
        Ok(Health {
            state,
            engine,
            uptime_s: r.u32()?,
            weights_generation: r.u32()?,
            since_progress_ms: r.u32()?,
        })
    }
}

/// Which layers a fine-tune leaves as they are (`fulcrum train --freeze`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(u8)]
pub enum FineTuneFreeze {
    /// The daemon chooses, from its memory budget.
    Auto = 0,
    /// Every layer trains.
    None = 1,
    /// The stem and blocks stay; the neck and heads train.
    Backbone = 2,
    /// The heads alone train.
    BackboneNeck = 3,
    /// The stem and the blocks up to stride 8 stay; the deeper blocks, the neck and the heads
    /// train. (Last for its wire value: it came after the others.)
    Early = 4,
}

impl FineTuneFreeze {
    /// Every choice, in the order of its wire value.
    pub const ALL: [FineTuneFreeze; 5] = [
        FineTuneFreeze::Auto,
        FineTuneFreeze::None,
        FineTuneFreeze::Backbone,
        FineTuneFreeze::BackboneNeck,
        FineTuneFreeze::Early,
    ];

    /// The choice whose wire value is `v`, if one is.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(usize::from(v)).copied()
    }

    /// Whether this choice names layers to freeze (early, backbone or backbone+neck): what
    /// training the frozen layers' biases needs. `Auto` leaves it to the daemon, which may
    /// freeze none.
    pub const fn freezes_layers(self) -> bool {
        matches!(
            self,
            FineTuneFreeze::Early | FineTuneFreeze::Backbone | FineTuneFreeze::BackboneNeck
        )
    }

    pub const fn name(self) -> &'static str {
        match self {
            FineTuneFreeze::Auto => "auto",
            FineTuneFreeze::None => "none",
            FineTuneFreeze::Backbone => "backbone",
            FineTuneFreeze::BackboneNeck => "backbone+neck",
            FineTuneFreeze::Early => "early",
        }
    }
}

/// The fixed part of `FineTuneStart`; the packed dataset's path follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FineTuneParams {
    /// Stop after this many training steps; 0: run `epochs`.
    pub max_steps: u32,
    /// Epochs over the dataset; 0: the daemon's default.
    pub epochs: u16,
    /// Swap the new weights in at the end even if they do not score better.
    pub swap_always: bool,
    /// The layers left frozen (flag bits 1–2 and, for its third bit, bit 4; 0, from clients
    /// before it: the daemon's choice).
    pub freeze: FineTuneFreeze,
    /// The frozen layers' biases train all the same (flag bit 3; needs a `freeze` that
    /// [`FineTuneFreeze::freezes_layers`]).
    pub train_biases: bool,
}

impl FineTuneParams {
    /// Bytes before the path (which is `path_len` bytes).
    pub const LEN: usize = 12;
    const SWAP_ALWAYS: u32 = 1;
    const FREEZE_SHIFT: u32 = 1;
    const TRAIN_BIASES: u32 = 1 << 3;
    /// The freeze choice's third bit (`Early`, 4), apart from its first two because bit 3
    /// was taken when it came: a daemon from before refuses it as an unknown flag.
    const FREEZE_HIGH: u32 = 1 << 4;
    const FLAGS: u32 =
        Self::SWAP_ALWAYS | 3 << Self::FREEZE_SHIFT | Self::TRAIN_BIASES | Self::FREEZE_HIGH;

    pub(crate) fn write(&self, w: &mut Writer<'_>, path_len: u16) -> Result<(), WireError> {
        w.u32(self.max_steps)?;
        w.u16(self.epochs)?;
        w.u16(path_len)?;
        w.u32(
            if self.swap_always {
                Self::SWAP_ALWAYS
            } else {
                0
            } | (self.freeze as u32 & 3) << Self::FREEZE_SHIFT
                | if self.freeze as u32 & 4 != 0 {
                    Self::FREEZE_HIGH
                } else {
                    0
                }
                | if self.train_biases {
                    Self::TRAIN_BIASES
                } else {
                    0
                },
        )
    }

    /// Returns the params and the length of the path that follows.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<(Self, u16), WireError> {
        let max_steps = r.u32()?;
        let epochs = r.u16()?;
        let path_len = r.u16()?;
        let flags = r.u32()?;
        if flags & !Self::FLAGS != 0 {
            return Err(WireError::BadValue);
        }
        let high = if flags & Self::FREEZE_HIGH != 0 { 4 } else { 0 };
        let freeze = FineTuneFreeze::from_u8((flags >> Self::FREEZE_SHIFT & 3) as u8 | high)
            .ok_or(WireError::BadValue)?;
        let params = FineTuneParams {
            max_steps,
            epochs,
            swap_always: flags & Self::SWAP_ALWAYS != 0,
            freeze,
            train_biases: flags & Self::TRAIN_BIASES != 0,
        };
        Ok((params, path_len))
    }
}

/// Daemon → client: a fine-tune's progress. Scores are mAP@0.5 on the dataset's held-out
/// split; NaN where not measured yet.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FineTuneStatus {
    pub state: FineTuneState,
    /// The epoch being trained, from 1 (0: not started).
    pub epoch: u16,
    pub step: u32,
    pub total_steps: u32,
    pub loss: f32,
    /// The weights serving now.
    pub serving_map: f32,
    /// The fine-tune's latest checkpoint.
    pub candidate_map: f32,
    /// Times new weights were swapped in by fine-tuning.
    pub swaps: u32,
    /// The balance equation's two sides, as last measured (0: not yet): the loaders' time per
    /// batch `T_g·B/C` and the device's time per training step `T_step`, µs.
    pub load_per_batch_us: u32,
    pub step_us: u32,
}

impl FineTuneStatus {
    pub const LEN: usize = 36;

    pub(crate) fn write(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(self.state as u8)?;
        w.reserved(1)?;
        w.u16(self.epoch)?;
        w.u32(self.step)?;
        w.u32(self.total_steps)?;
        w.f32(self.loss)?;
        w.f32(self.serving_map)?;
        w.f32(self.candidate_map)?;
        w.u32(self.swaps)?;
        w.u32(self.load_per_batch_us)?;
        w.u32(self.step_us)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let state = FineTuneState::from_u8(r.u8()?)?;
        r.reserved(1)?;
        let status = FineTuneStatus {
            state,
            epoch: r.u16()?,
            step: r.u32()?,
            total_steps: r.u32()?,
            loss: r.f32()?,
            serving_map: r.f32()?,
            candidate_map: r.f32()?,
            swaps: r.u32()?,
            load_per_batch_us: r.u32()?,
            step_us: r.u32()?,
        };
        Ok(status)
    }
}

/// An error reply's code. A newtype over the wire value rather than an enum, so a client
/// built against an older list still decodes (and shows) codes added later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ErrorCode(pub u16);

impl ErrorCode {
    /// The message could not be decoded; the text says which field.
    pub const MALFORMED: ErrorCode = ErrorCode(1);
    /// Another protocol version; the connection is closed.
    pub const UNSUPPORTED_VERSION: ErrorCode = ErrorCode(2);
    /// Same version, other message layouts (the schema hash differs); the connection is closed.
    pub const SCHEMA_MISMATCH: ErrorCode = ErrorCode(3);
    /// The peer's uid and gid are not allowed.
    pub const NOT_ALLOWED: ErrorCode = ErrorCode(4);
    /// Over a stated limit (message size, frame side, inline bytes).
    pub const TOO_LARGE: ErrorCode = ErrorCode(5);
    /// The frame's bytes are not where or what its description says.
    pub const BAD_FRAME: ErrorCode = ErrorCode(6);
    /// A ring frame before any ring was attached, or a ring the daemon cannot use.
    pub const NO_RING: ErrorCode = ErrorCode(7);
    /// The client's queue is full; this request was dropped.
    pub const BUSY: ErrorCode = ErrorCode(8);
    /// New weights were refused; the old ones keep serving.
    pub const RELOAD_FAILED: ErrorCode = ErrorCode(9);
    pub const FINE_TUNE_FAILED: ErrorCode = ErrorCode(10);
    /// A message that does not belong here (a reply kind sent to the daemon, infer before
    /// hello).
    pub const UNEXPECTED: ErrorCode = ErrorCode(11);
    pub const INTERNAL: ErrorCode = ErrorCode(12);

    pub const fn name(self) -> &'static str {
        match self.0 {
            1 => "malformed",
            2 => "unsupported version",
            3 => "schema mismatch",
            4 => "not allowed",
            5 => "too large",
            6 => "bad frame",
            7 => "no ring",
            8 => "busy",
            9 => "reload failed",
            10 => "fine-tune failed",
            11 => "unexpected message",
            12 => "internal error",
            _ => "unknown error",
        }
    }
}

impl core::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}
