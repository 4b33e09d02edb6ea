//! The connections: accepting them (credentials checked before anything is read, a share of
//! the slots per uid), the `Hello` deadline, the one-reply outbox of a client whose socket is
//! full and the stall that drops it, and writing replies.

use super::*;

impl Server {
    pub(super) fn allowed(&self, cred: &PeerCredentials) -> bool {
        cred.uid == self.own.uid
            || cred.gid == self.own.gid
            || self.config.allow_uids.contains(&cred.uid)
            || self.config.allow_gids.contains(&cred.gid)
    }

    pub(super) fn accept_clients(&mut self) {
        loop {
            let (fd, cred) = match socket::accept(self.listener.as_fd()) {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("accepting a client: {e}");
                    return;
                }
            };
            if !self.allowed(&cred) {
                self.counters.refused += 1;
                log::warn!(
                    "refused a client: pid {} uid {} gid {} is not allowed (allow it with --allow-uid {} or --allow-gid {})",
                    cred.pid, cred.uid, cred.gid, cred.uid, cred.gid
                );
                self.text.clear();
                let _ = write!(
                    self.text,
                    "uid {} gid {} may not use this daemon; ask for --allow-uid or --allow-gid",
                    cred.uid, cred.gid
                );
                self.send_error_to(fd.as_fd(), 0, ErrorCode::NOT_ALLOWED);
                continue;
            }
            let Some(slot) = self.free_slot_for(&cred) else {
                self.counters.refused += 1;
                let held = self.held_by(cred.uid);
                let per_uid = self.config.per_uid_limit();
                self.text.clear();
                if held >= per_uid {
                    log::warn!(
                        "refused a client (pid {}): uid {} holds {held} connections, its limit \
                         (--max-clients-per-uid)",
                        cred.pid,
                        cred.uid
                    );
                    let _ = write!(
                        self.text,
                        "uid {} holds {held} connections, its limit; close one and try again",
                        cred.uid
                    );
                } else {
                    log::warn!(
                        "refused a client (pid {}): all {} client slots are taken",
                        cred.pid,
                        self.clients.len()
                    );
                    let _ = write!(
                        self.text,
                        "all {} client slots are taken; try again later",
                        self.clients.len()
                    );
                }
                self.send_error_to(fd.as_fd(), 0, ErrorCode::BUSY);
                continue;
            };
            log::debug!("client {slot}: pid {} uid {} connected", cred.pid, cred.uid);
            self.clients[slot] = Some(Client {
                fd,
                cred,
                greeted: false,
                connected: Instant::now(),
                id: {
                    self.connections += 1;
                    self.connections
                },
                ring: None,
                pending: Vec::with_capacity(self.send.len()),
                pending_since: None,
            });
        }
    }

    /// Connections `uid` holds.
    fn held_by(&self, uid: u32) -> usize {
        self.clients
            .iter()
            .flatten()
            .filter(|c| c.cred.uid == uid)
            .count()
    }

    /// A slot for a new connection from `cred`: a free one within its uid's limit, else one
    /// freed by closing the oldest connection that has sent nothing yet (of the same uid when
    /// the uid is at its limit): connections that never greet cannot lock real clients out.
    fn free_slot_for(&mut self, cred: &PeerCredentials) -> Option<usize> {
        let at_uid_limit = self.held_by(cred.uid) >= self.config.per_uid_limit();
        if !at_uid_limit {
            if let Some(slot) = self.clients.iter().position(Option::is_none) {
                return Some(slot);
            }
        }
        let oldest_silent = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().map(|c| (slot, c)))
            // A connection whose Hello waits unread is not silent: it is served next round.
            .filter(|(_, c)| !c.greeted && (!at_uid_limit || c.cred.uid == cred.uid))
            .filter(|(_, c)| !socket::has_pending(c.fd.as_fd()))
            .min_by_key(|(_, c)| c.connected)
            .map(|(slot, _)| slot)?;
        self.counters.evicted += 1;
        log::warn!(
            "client {oldest_silent} (pid {}): closed without a Hello to make room for pid {}",
            self.peer_pid(oldest_silent),
            cred.pid
        );
        self.text.clear();
        let _ = write!(self.text, "closed to make room: no Hello since connecting");
        if let Some(c) = self.clients[oldest_silent].take() {
            self.send_error_to(c.fd.as_fd(), 0, ErrorCode::BUSY);
        }
        Some(oldest_silent)
    }

    /// Best effort: an error to a connection about to be closed.
    fn send_error_to(&mut self, fd: std::os::fd::BorrowedFd<'_>, sequence: u32, code: ErrorCode) {
        self.counters.errors += 1;
        self.counters.errors_by_code[metrics::error_slot(code)] += 1;
        let msg = Message::Error(ErrorReply::new(code, &self.text));
        if let Ok(n) = msg.encode(sequence, 0, &mut self.send) {
            let _ = socket::send_packet(fd, &self.send[..n], None);
        }
    }

    pub(super) fn drop_client(&mut self, slot: usize, why: &str) {
        if let Some(c) = self.clients[slot].take() {
            log::debug!("client {slot} (pid {}): {why}", c.cred.pid);
        }
    }

    pub(super) fn check_stall(&mut self, slot: usize) {
        let stalled = matches!(&self.clients[slot], Some(Client { pending_since: Some(t), .. })
            if t.elapsed() > self.config.stall_timeout);
        if stalled {
            log::warn!(
                "client {slot}: not reading its replies for {:?}; disconnected",
                self.config.stall_timeout
            );
            self.drop_client(slot, "stalled");
        }
    }

    pub(super) fn check_hello(&mut self, slot: usize) {
        let late = matches!(&self.clients[slot], Some(c)
            if !c.greeted && c.connected.elapsed() > self.config.hello_timeout);
        if late {
            self.counters.hello_timeouts += 1;
            log::warn!(
                "client {slot} (pid {}): no Hello within {:?}; disconnected",
                self.peer_pid(slot),
                self.config.hello_timeout
            );
            self.text.clear();
            let _ = write!(
                self.text,
                "no Hello within {} ms of connecting; closed",
                self.config.hello_timeout.as_millis()
            );
            if let Some(c) = self.clients[slot].take() {
                self.send_error_to(c.fd.as_fd(), 0, ErrorCode::UNEXPECTED);
            }
        }
    }

    pub(super) fn flush(&mut self, slot: usize) {
        let Some(client) = self.clients[slot].as_mut() else {
            return;
        };
        match socket::send_packet(client.fd.as_fd(), &client.pending, None) {
            Ok(true) => {
                client.pending.clear();
                client.pending_since = None;
            }
            Ok(false) => {}
            Err(e) => self.drop_client(slot, &format!("send failed: {e}")),
        }
    }

    /// Sends `self.send[..len]` to a client now, or keeps it in its outbox.
    pub(super) fn reply(&mut self, slot: usize, len: usize) {
        let Some(client) = self.clients[slot].as_mut() else {
            return;
        };
        match socket::send_packet(client.fd.as_fd(), &self.send[..len], None) {
            Ok(true) => {}
            Ok(false) => {
                client.pending.clear();
                client.pending.extend_from_slice(&self.send[..len]);
                client.pending_since = Some(Instant::now());
            }
            Err(e) => self.drop_client(slot, &format!("send failed: {e}")),
        }
    }

    /// An error reply with `self.text`.
    pub(super) fn reply_error(
        &mut self,
        slot: usize,
        sequence: u32,
        timestamp: u64,
        code: ErrorCode,
    ) {
        self.counters.errors += 1;
        self.counters.errors_by_code[metrics::error_slot(code)] += 1;
        let msg = Message::Error(ErrorReply::new(code, &self.text));
        match msg.encode(sequence, timestamp, &mut self.send) {
            Ok(n) => self.reply(slot, n),
            Err(e) => log::error!("encoding an error reply: {e}"),
        }
    }

    pub(super) fn reply_message(&mut self, slot: usize, header: &Header, msg: &Message<'_>) {
        match msg.encode(header.sequence, header.timestamp_us, &mut self.send) {
            Ok(n) => self.reply(slot, n),
            Err(e) => log::error!("encoding a {:?} reply: {e}", msg.kind()),
        }
    }

    pub(super) fn peer_pid(&self, slot: usize) -> i32 {
        self.clients[slot].as_ref().map_or(0, |c| c.cred.pid)
    }
}
