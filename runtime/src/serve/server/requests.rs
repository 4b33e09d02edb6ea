//! Answering one request: each ready client gets at most one a round; a frame (inline, in its
//! shared ring, or as a passed file descriptor) runs through the frame pass and the model, and
//! the other requests are answered from the daemon's state.

use super::*;

impl Server {
    /// Reads one packet from a client and answers it.
    pub(super) fn serve_one(&mut self, slot: usize) {
        let received = {
            let Some(client) = self.clients[slot].as_ref() else {
                return;
            };
            socket::recv_packet(client.fd.as_fd(), &mut self.recv, &mut self.cmsg)
        };
        let arrived = Instant::now();
        let (len, fd) = match received {
            Ok(Received::Packet { len, fd }) if len <= MAX_MESSAGE_LEN => (len, fd),
            Ok(Received::Empty) => return,
            Ok(Received::Closed) => return self.drop_client(slot, "closed"),
            // One byte more than any message fits the buffer, so that it shows here.
            Ok(Received::Oversized | Received::Packet { .. }) => {
                self.text.clear();
                let _ = write!(
                    self.text,
                    "message over {MAX_MESSAGE_LEN} bytes; frames over {MAX_INLINE_BYTES} bytes go through the memfd ring"
                );
                return self.reply_error(slot, 0, 0, ErrorCode::TOO_LARGE);
            }
            Err(e) => return self.drop_client(slot, &format!("receive failed: {e}")),
        };
        let after = self.handle(slot, len, fd, arrived);
        if after == After::Close {
            self.drop_client(slot, "closed after an error");
        }
    }

    fn handle(&mut self, slot: usize, len: usize, fd: Option<OwnedFd>, arrived: Instant) -> After {
        // Take the packet out of `self` for the duration (no copy: a swap of buffers).
        let packet = std::mem::take(&mut self.recv);
        let after = self.handle_packet(slot, &packet[..len], fd, arrived);
        self.recv = packet;
        after
    }

    fn handle_packet(
        &mut self,
        slot: usize,
        packet: &[u8],
        fd: Option<OwnedFd>,
        arrived: Instant,
    ) -> After {
        let (header, message) = match decode(packet) {
            Ok(m) => m,
            Err(e) => {
                let sequence = Header::decode(packet).map(|h| h.sequence).unwrap_or(0);
                self.text.clear();
                let _ = write!(self.text, "message {sequence}: {e}");
                self.reply_error(slot, sequence, 0, e.code());
                return if e.closes_connection() {
                    After::Close
                } else {
                    After::KeepOpen
                };
            }
        };
        let (seq, ts) = (header.sequence, header.timestamp_us);
        let greeted = self.clients[slot].as_ref().is_some_and(|c| c.greeted);
        if !greeted && header.kind != Kind::Hello {
            self.text.clear();
            let _ = write!(self.text, "send Hello first (got {:?})", header.kind);
            self.reply_error(slot, seq, ts, ErrorCode::UNEXPECTED);
            return After::Close;
        }
        match message {
            Message::Hello(hello) => {
                if hello.schema_hash != SCHEMA_HASH {
                    self.text.clear();
                    let _ = write!(
                        self.text,
                        "schema hash {:#010x}, this daemon speaks {:#010x}: build the client against the same fulcrum-board",
                        hello.schema_hash, SCHEMA_HASH
                    );
                    self.reply_error(slot, seq, ts, ErrorCode::SCHEMA_MISMATCH);
                    return After::Close;
                }
                if let Some(c) = self.clients[slot].as_mut() {
                    c.greeted = true;
                }
                let welcome = Message::Welcome(self.welcome());
                self.reply_message(slot, &header, &welcome);
            }
            Message::Infer(frame) => self.infer(slot, &header, frame, arrived),
            Message::AttachRing(attach) => {
                let Some(fd) = fd else {
                    self.text.clear();
                    let _ = write!(self.text, "AttachRing needs the memfd passed as SCM_RIGHTS");
                    self.reply_error(slot, seq, ts, ErrorCode::NO_RING);
                    return After::KeepOpen;
                };
                match ClientRing::map(fd, attach.len, self.config.max_ring_bytes) {
                    Ok(ring) => {
                        if let Some(c) = self.clients[slot].as_mut() {
                            c.ring = Some(ring);
                        }
                        self.reply_message(slot, &header, &Message::Ack(Kind::AttachRing));
                    }
                    Err(e) => {
                        self.set_text(&e.to_string());
                        self.reply_error(slot, seq, ts, ErrorCode::NO_RING);
                    }
                }
            }
            Message::ClassesRequest => {
                let names = Message::Classes {
                    names: &self.model.names,
                };
                match names.encode(seq, ts, &mut self.send) {
                    Ok(n) => self.reply(slot, n),
                    Err(e) => log::error!("encoding the class names: {e}"),
                }
            }
            Message::StatsRequest => {
                let stats = Message::Stats(self.stats());
                self.reply_message(slot, &header, &stats);
            }
            Message::HealthRequest => {
                let health = Message::Health(self.health());
                self.reply_message(slot, &header, &health);
            }
            Message::Reload { path } => {
                if self.loading.is_some() {
                    self.text.clear();
                    let _ = write!(
                        self.text,
                        "weights are loading already; try again when that ends"
                    );
                    self.reply_error(slot, seq, ts, ErrorCode::BUSY);
                    return After::KeepOpen;
                }
                match self.client_reload_path(path) {
                    Ok(path) => {
                        log::info!(
                            "reload of {} asked by pid {}",
                            path.display(),
                            self.peer_pid(slot)
                        );
                        let requester = self.clients[slot].as_ref().map(|c| Requester {
                            slot,
                            client: c.id,
                            header,
                        });
                        self.start_loading(path, LoadReason::Reload { requester });
                    }
                    Err(e) => {
                        log::warn!("reload refused (pid {}): {e}", self.peer_pid(slot));
                        self.set_text(&e.to_string());
                        self.reply_error(slot, seq, ts, ErrorCode::RELOAD_FAILED);
                    }
                }
            }
            Message::FineTuneStart { params, path } => {
                let started = match &mut self.fine_tune {
                    None => Err(super::fine_tune::FineTuneError::NoStateDir),
                    Some(f) => f.start(
                        &params,
                        Path::new(path),
                        &self.config.weights,
                        &self.model.path,
                    ),
                };
                match started {
                    Ok(()) => {
                        log::info!("fine-tune started on {path} by pid {}", self.peer_pid(slot));
                        self.reply_message(slot, &header, &Message::Ack(Kind::FineTuneStart));
                    }
                    Err(e) => {
                        log::warn!("fine-tune on {path} refused: {e}");
                        self.set_text(&e.to_string());
                        self.reply_error(slot, seq, ts, ErrorCode::FINE_TUNE_FAILED);
                    }
                }
            }
            Message::FineTuneStop => {
                if self.fine_tune.as_ref().is_some_and(FineTuner::stop) {
                    self.reply_message(slot, &header, &Message::Ack(Kind::FineTuneStop));
                } else {
                    self.text.clear();
                    let _ = write!(self.text, "no fine-tune is running");
                    self.reply_error(slot, seq, ts, ErrorCode::FINE_TUNE_FAILED);
                }
            }
            Message::FineTuneStatusRequest => {
                let status = self
                    .fine_tune
                    .as_ref()
                    .map_or_else(FineTuner::idle_status, FineTuner::status);
                self.reply_message(slot, &header, &Message::FineTuneStatus(status));
            }
            reply => {
                self.text.clear();
                let _ = write!(
                    self.text,
                    "{:?} is a reply; clients send requests",
                    reply.kind()
                );
                self.reply_error(slot, seq, ts, ErrorCode::UNEXPECTED);
            }
        }
        After::KeepOpen
    }

    fn infer(&mut self, slot: usize, header: &Header, frame: Frame<'_>, arrived: Instant) {
        let (seq, ts) = (header.sequence, header.timestamp_us);
        let desc = frame.desc;
        let Some(client) = self.clients[slot].as_ref() else {
            return;
        };
        // The ring lives in `self.clients`, which the prediction below does not touch;
        // `ClientRing::bytes` says why the client's own writes are harmless.
        let ring = client.ring.as_ref().map(ClientRing::bytes);
        let view = match frame::resolve(desc, frame.pixels, ring, self.config.max_frame_side) {
            Ok(view) => view,
            Err(refused) => {
                self.text.clear();
                let _ = write!(self.text, "frame {seq}: ");
                refused.describe(&desc, &mut self.text);
                return self.reply_error(slot, seq, ts, refused.code());
            }
        };
        let timing =
            match self
                .model
                .predictor
                .predict_into(&view.pixels(), view.crop(), &mut self.scored)
            {
                Ok(t) => t,
                Err(e) => {
                    self.text.clear();
                    let _ = write!(self.text, "frame {seq}: inference failed: {e}");
                    log::error!("{}", self.text);
                    return self.reply_error(slot, seq, ts, ErrorCode::INTERNAL);
                }
            };
        let min_score = if desc.min_score > 0.0 {
            desc.min_score
        } else {
            self.config.threshold
        };
        let most = match desc.max_detections {
            0 => usize::MAX,
            n => usize::from(n),
        };
        self.wire.clear();
        self.wire.extend(
            self.scored
                .iter()
                .filter(|d| d.score >= min_score)
                .take(most)
                .map(|d| Detection {
                    class: d.class.min(u32::from(u16::MAX)) as u16,
                    score: d.score,
                    x0: d.x0,
                    y0: d.y0,
                    x1: d.x1,
                    y1: d.y1,
                }),
        );
        let engine_us = timing.device.as_micros().min(u128::from(u32::MAX)) as u32;
        let total_us = arrived.elapsed().as_micros().min(u128::from(u32::MAX)) as u32;
        let reply = Message::Detections(DetectionsReply {
            frame_width: desc.width,
            frame_height: desc.height,
            engine_us,
            total_us,
            weights_generation: self.generation,
            min_score,
            nms_iou: self.config.nms_iou,
            detections: DetectionList::Records(&self.wire),
        });
        match reply.encode(seq, ts, &mut self.send) {
            Ok(n) => {
                self.reply(slot, n);
                self.counters.requests += 1;
                self.counters
                    .latency
                    .record(arrived.elapsed().as_micros() as u64);
                self.counters.engine.record(u64::from(engine_us));
                self.counters
                    .frame_pass
                    .record(timing.prepare.as_micros() as u64);
            }
            Err(e) => log::error!("encoding detections: {e}"),
        }
    }

    fn engine_kind(&self) -> EngineKind {
        if self.model.predictor.is_vulkan() {
            EngineKind::Vulkan
        } else {
            EngineKind::Cpu
        }
    }

    fn welcome(&self) -> Welcome {
        let side = self.model.predictor.input_size().min(u32::from(u16::MAX)) as u16;
        Welcome {
            schema_hash: SCHEMA_HASH,
            input_width: side,
            input_height: side,
            classes: self.model.classes,
            max_frame_side: self.config.max_frame_side,
            max_inline_bytes: MAX_INLINE_BYTES,
            max_detections: self.config.top_k.min(u32::from(protocol::MAX_DETECTIONS)) as u16,
            engine: self.engine_kind(),
            weights_generation: self.generation,
        }
    }

    fn stats(&self) -> Stats {
        let c = &self.counters;
        let us = |v: u64| v.min(u64::from(u32::MAX)) as u32;
        Stats {
            requests: c.requests,
            errors: c.errors,
            refused: c.refused,
            clients: self.clients.iter().flatten().count() as u16,
            p50_us: us(c.latency.quantile(0.5)),
            p99_us: us(c.latency.quantile(0.99)),
            p999_us: us(c.latency.quantile(0.999)),
            forward_us: us(c.engine.quantile(0.5)),
            uptime_s: self.started.elapsed().as_secs().min(u64::from(u32::MAX)) as u32,
            weights_generation: self.generation,
        }
    }

    fn health(&self) -> Health {
        Health {
            state: self.state,
            engine: self.engine_kind(),
            uptime_s: self.started.elapsed().as_secs().min(u64::from(u32::MAX)) as u32,
            weights_generation: self.generation,
            since_progress_ms: self
                .last_progress
                .elapsed()
                .as_millis()
                .min(u128::from(u32::MAX)) as u32,
        }
    }

    /// An error reply's text: `text`, cut at a character boundary to what a reply carries
    /// (the log has it whole).
    pub(super) fn set_text(&mut self, text: &str) {
        self.text.clear();
        let mut end = text.len().min(MAX_TEXT);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let _ = self.text.push_str(&text[..end]);
    }
}
