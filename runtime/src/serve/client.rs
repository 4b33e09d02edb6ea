//! The Rust client of `fulcrumd`: connect (Hello/Welcome, schema checked), send frames inline
//! or through a memfd ring, and ask for stats, health, class names, reloads and fine-tunes. `fulcrum
//! client` is built on it; the C client under `tools/` speaks the same protocol.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use fulcrum_board::protocol::{
    decode, Detection, ErrorReply, FineTuneParams, FineTuneStatus, Frame, FrameDesc, FrameSource,
    Health, Hello, Kind, Message, PixelFormat, Stats, Welcome, MAX_MESSAGE_LEN, SCHEMA_HASH,
};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};

use super::socket::{self, Received};
use super::Error;

/// How long a request waits for its reply.
const REPLY_TIMEOUT_S: i64 = 30;

/// One frame's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Detections {
    pub sequence: u32,
    pub timestamp_us: u64,
    pub frame_width: u16,
    pub frame_height: u16,
    pub engine_us: u32,
    pub total_us: u32,
    /// The weights that answered; another than [`Client::welcome`]'s means a reload, which
    /// may have changed the classes or input size ([`Client::refresh`] learns them).
    pub weights_generation: u32,
    /// The lowest score returned and the suppression's IoU limit, as the daemon applied them.
    pub min_score: f32,
    pub nms_iou: f32,
    pub boxes: Vec<Detection>,
}

/// A connection to a daemon.
pub struct Client {
    fd: OwnedFd,
    welcome: Welcome,
    sequence: u32,
    send: Vec<u8>,
    recv: Vec<u8>,
    cmsg: Vec<u8>,
    ring: Option<(OwnedFd, u64)>,
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: what.to_string(),
        source,
    }
}

impl Client {
    /// Connects and greets: the daemon answers with what it serves, or refuses (not allowed,
    /// another schema, all slots taken).
    pub fn connect(path: &Path) -> Result<Client, Error> {
        let fd = socket::connect_seqpacket(path).map_err(|e| Error::Io {
            what: format!(
                "connecting to {} (is fulcrumd running, and may this user use it?)",
                path.display()
            ),
            source: e,
        })?;
        // A daemon that stops answering must not hang its client forever.
        nix::sys::socket::setsockopt(
            &fd,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(REPLY_TIMEOUT_S, 0),
        )
        .map_err(|e| io("setting the reply timeout")(e.into()))?;
        let mut client = Client {
            fd,
            welcome: Welcome::default(),
            sequence: 0,
            send: vec![0; MAX_MESSAGE_LEN],
            recv: vec![0; MAX_MESSAGE_LEN + 1],
            cmsg: socket::cmsg_buffer(),
            ring: None,
        };
        client.refresh()?;
        Ok(client)
    }

    /// Greets the daemon (again): what it serves now. After a reload (a reply's
    /// `weights_generation` differs from the welcome's) the classes, the input size or the
    /// model may have changed; ask for [`Client::classes`] again too.
    pub fn refresh(&mut self) -> Result<&Welcome, Error> {
        let hello = Message::Hello(Hello {
            schema_hash: SCHEMA_HASH,
        });
        self.welcome = match self.request(&hello, 0, None)? {
            Message::Welcome(w) => w,
            other => return Err(Error::Unexpected(format!("{:?} to Hello", other.kind()))),
        };
        Ok(&self.welcome)
    }

    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// Sends one request and returns its reply (an `Error` reply becomes [`Error::Remote`]).
    fn request(
        &mut self,
        msg: &Message<'_>,
        timestamp_us: u64,
        pass: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Message<'_>, Error> {
        self.sequence = self.next_sequence();
        let n = msg.encode(self.sequence, timestamp_us, &mut self.send)?;
        if let Err(e) = socket::send_packet(self.fd.as_fd(), &self.send[..n], pass) {
            // A daemon that refused this connection said why before closing it.
            return match self.receive() {
                Ok(len) => match decode(&self.recv[..len]) {
                    Ok((_, Message::Error(ErrorReply { code, text }))) => Err(Error::Remote {
                        code,
                        text: text.to_string(),
                    }),
                    _ => Err(io("sending a request")(e)),
                },
                Err(_) => Err(io("sending a request")(e)),
            };
        }
        let len = self.receive()?;
        let (header, reply) = decode(&self.recv[..len])?;
        // Sequence 0 is the daemon's own: an error about the connection (a refusal at accept,
        // a packet too garbled to name), which answers whatever request is waiting.
        if header.sequence != self.sequence && header.sequence != 0 {
            return Err(Error::Unexpected(format!(
                "reply to request {} while waiting for {}",
                header.sequence, self.sequence
            )));
        }
        match reply {
            Message::Error(ErrorReply { code, text }) => Err(Error::Remote {
                code,
                text: text.to_string(),
            }),
            reply if header.sequence == 0 => Err(Error::Unexpected(format!(
                "{:?} with sequence 0 while waiting for {}",
                reply.kind(),
                self.sequence
            ))),
            reply => Ok(reply),
        }
    }

    /// The next request's sequence number: 0 is the daemon's (see `request`), so requests
    /// count from 1 and skip it on wrapping.
    fn next_sequence(&self) -> u32 {
        self.sequence.checked_add(1).unwrap_or(1)
    }

    fn detections(&mut self, msg: &Message<'_>, timestamp_us: u64) -> Result<Detections, Error> {
        let sequence = self.next_sequence();
        match self.request(msg, timestamp_us, None)? {
            Message::Detections(d) => Ok(Detections {
                sequence,
                timestamp_us,
                frame_width: d.frame_width,
                frame_height: d.frame_height,
                engine_us: d.engine_us,
                total_us: d.total_us,
                weights_generation: d.weights_generation,
                min_score: d.min_score,
                nms_iou: d.nms_iou,
                boxes: d.detections.iter().collect(),
            }),
            other => Err(Error::Unexpected(format!("{:?} to Infer", other.kind()))),
        }
    }

    /// Detections in a frame sent inside the message (up to the Welcome's
    /// `max_inline_bytes`).
    pub fn infer_inline(
        &mut self,
        desc: FrameDesc,
        pixels: &[u8],
        timestamp_us: u64,
    ) -> Result<Detections, Error> {
        let desc = FrameDesc {
            source: FrameSource::Inline,
            offset: 0,
            ..desc
        };
        self.detections(&Message::Infer(Frame { desc, pixels }), timestamp_us)
    }

    /// Creates a memfd ring of `len` bytes (sealed against shrinking) and passes it to the
    /// daemon; frames then go in with [`Client::write_ring`] and [`Client::infer_ring`].
    pub fn attach_ring(&mut self, len: u64) -> Result<(), Error> {
        let fd = memfd_create(
            "fulcrum-frames",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map_err(|e| io("memfd_create")(e.into()))?;
        nix::unistd::ftruncate(fd.as_fd(), len as i64)
            .map_err(|e| io("sizing the ring")(e.into()))?;
        fcntl(
            fd.as_fd(),
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL),
        )
        .map_err(|e| io("sealing the ring")(e.into()))?;
        let attach = Message::AttachRing(fulcrum_board::protocol::AttachRing { len });
        // `request` borrows self; pass the fd by a second handle to it.
        let dup = fd.try_clone().map_err(io("duplicating the ring fd"))?;
        match self.request(&attach, 0, Some(dup.as_fd()))? {
            Message::Ack(Kind::AttachRing) => {}
            other => {
                return Err(Error::Unexpected(format!(
                    "{:?} to AttachRing",
                    other.kind()
                )))
            }
        }
        self.ring = Some((fd, len));
        Ok(())
    }

    /// Attaches a ring of at least `len` bytes unless one that large is attached already.
    pub fn attach_ring_for(&mut self, len: u64) -> Result<(), Error> {
        match &self.ring {
            Some((_, have)) if *have >= len => Ok(()),
            _ => self.attach_ring(len),
        }
    }

    /// Writes `bytes` into the attached ring at `offset`.
    pub fn write_ring(&mut self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        let Some((fd, len)) = &self.ring else {
            return Err(Error::Config(
                "no ring attached: call attach_ring first".into(),
            ));
        };
        if offset + bytes.len() as u64 > *len {
            return Err(Error::Config(format!(
                "{} bytes at {offset} do not fit a ring of {len}",
                bytes.len()
            )));
        }
        let mut done = 0;
        while done < bytes.len() {
            done +=
                nix::sys::uio::pwrite(fd.as_fd(), &bytes[done..], (offset + done as u64) as i64)
                    .map_err(|e| io("writing the ring")(e.into()))?;
        }
        Ok(())
    }

    /// Detections in a frame already in the ring at `desc.offset`.
    pub fn infer_ring(&mut self, desc: FrameDesc, timestamp_us: u64) -> Result<Detections, Error> {
        let desc = FrameDesc {
            source: FrameSource::Ring,
            ..desc
        };
        self.detections(&Message::Infer(Frame { desc, pixels: &[] }), timestamp_us)
    }

    /// Detections in a packed `width × height` frame of `format`: inline if it fits, else
    /// through the ring (attached on first use, sized for this frame).
    pub fn infer(
        &mut self,
        format: PixelFormat,
        width: u16,
        height: u16,
        pixels: &[u8],
        timestamp_us: u64,
    ) -> Result<Detections, Error> {
        let desc = FrameDesc::packed(format, FrameSource::Inline, width, height)?;
        if pixels.len() != desc.length as usize {
            return Err(Error::Config(format!(
                "{width}x{height} {} needs {} bytes, got {}",
                format.name(),
                desc.length,
                pixels.len()
            )));
        }
        if desc.length <= self.welcome.max_inline_bytes {
            return self.infer_inline(desc, pixels, timestamp_us);
        }
        self.attach_ring_for(u64::from(desc.length))?;
        self.write_ring(0, pixels)?;
        self.infer_ring(desc, timestamp_us)
    }

    pub fn stats(&mut self) -> Result<Stats, Error> {
        match self.request(&Message::StatsRequest, 0, None)? {
            Message::Stats(s) => Ok(s),
            other => Err(Error::Unexpected(format!(
                "{:?} to StatsRequest",
                other.kind()
            ))),
        }
    }

    pub fn health(&mut self) -> Result<Health, Error> {
        match self.request(&Message::HealthRequest, 0, None)? {
            Message::Health(h) => Ok(h),
            other => Err(Error::Unexpected(format!(
                "{:?} to HealthRequest",
                other.kind()
            ))),
        }
    }

    /// The model's class names, in class-id order.
    pub fn classes(&mut self) -> Result<Vec<String>, Error> {
        match self.request(&Message::ClassesRequest, 0, None)? {
            Message::Classes { names: "" } => Ok(Vec::new()),
            Message::Classes { names } => Ok(names.split('\n').map(str::to_string).collect()),
            other => Err(Error::Unexpected(format!(
                "{:?} to ClassesRequest",
                other.kind()
            ))),
        }
    }

    /// Asks the daemon to load new weights (`None`: its configured file again).
    pub fn reload(&mut self, path: Option<&str>) -> Result<(), Error> {
        match self.request(
            &Message::Reload {
                path: path.unwrap_or(""),
            },
            0,
            None,
        )? {
            Message::Ack(Kind::Reload) => Ok(()),
            other => Err(Error::Unexpected(format!("{:?} to Reload", other.kind()))),
        }
    }

    /// Starts fine-tuning on `data` (a folder with packed `train/` and `val/` datasets, as
    /// the daemon sees the path).
    pub fn fine_tune_start(&mut self, data: &str, params: FineTuneParams) -> Result<(), Error> {
        match self.request(&Message::FineTuneStart { params, path: data }, 0, None)? {
            Message::Ack(Kind::FineTuneStart) => Ok(()),
            other => Err(Error::Unexpected(format!(
                "{:?} to FineTuneStart",
                other.kind()
            ))),
        }
    }

    /// Stops the running fine-tune (it checkpoints first).
    pub fn fine_tune_stop(&mut self) -> Result<(), Error> {
        match self.request(&Message::FineTuneStop, 0, None)? {
            Message::Ack(Kind::FineTuneStop) => Ok(()),
            other => Err(Error::Unexpected(format!(
                "{:?} to FineTuneStop",
                other.kind()
            ))),
        }
    }

    pub fn fine_tune_status(&mut self) -> Result<FineTuneStatus, Error> {
        match self.request(&Message::FineTuneStatusRequest, 0, None)? {
            Message::FineTuneStatus(s) => Ok(s),
            other => Err(Error::Unexpected(format!(
                "{:?} to FineTuneStatusRequest",
                other.kind()
            ))),
        }
    }

    /// Sends raw bytes as one packet and returns the raw reply: for tests of hostile input.
    pub fn raw_exchange(&mut self, packet: &[u8]) -> Result<Vec<u8>, Error> {
        socket::send_packet(self.fd.as_fd(), packet, None).map_err(io("sending"))?;
        let len = self.receive()?;
        Ok(self.recv[..len].to_vec())
    }

    /// Waits for one reply packet; returns its length in `self.recv`.
    fn receive(&mut self) -> Result<usize, Error> {
        match socket::recv_packet(self.fd.as_fd(), &mut self.recv, &mut self.cmsg)
            .map_err(io("receiving a reply"))?
        {
            Received::Packet { len, .. } => Ok(len),
            Received::Empty => Err(Error::Unexpected(format!(
                "no reply within {REPLY_TIMEOUT_S} s"
            ))),
            Received::Closed => Err(Error::Unexpected("the daemon closed the connection".into())),
            Received::Oversized => Err(Error::Unexpected("a reply larger than any message".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fulcrum_board::protocol::ErrorCode;

    /// A daemon that refuses at accept answers, then closes with the client's Hello maybe
    /// unread. Whichever comes first on the client's side (its send failing, a reset, or the
    /// error itself), the client reports the refusal.
    #[test]
    fn a_refusal_is_reported_whatever_the_timing() {
        let dir = tempfile::tempdir().unwrap();
        for (i, delay_ms) in [0u64, 0, 1, 2, 5, 10, 30].into_iter().enumerate() {
            let path = dir.path().join(format!("refuse-{i}.sock"));
            let listener = socket::bind_listener(&path, 4).unwrap();
            let daemon = std::thread::spawn(move || loop {
                if let Some((fd, _)) = socket::accept(listener.as_fd()).unwrap() {
                    std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                    let refusal = Message::Error(ErrorReply::new(ErrorCode::NOT_ALLOWED, "no"));
                    let mut buf = [0u8; 64];
                    let n = refusal.encode(0, 0, &mut buf).unwrap();
                    socket::send_packet(fd.as_fd(), &buf[..n], None).unwrap();
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            });
            match Client::connect(&path) {
                Err(Error::Remote { code, .. }) => assert_eq!(code, ErrorCode::NOT_ALLOWED),
                Err(e) => panic!("delay {delay_ms} ms: {e}"),
                Ok(_) => panic!("delay {delay_ms} ms: connected"),
            }
            daemon.join().unwrap();
        }
    }
}
