//! systemd's notification protocol (`Type=notify`) through the `sd-notify` crate: READY once
//! serving, STATUS lines, WATCHDOG pings at half of `WatchdogSec` sent from the serving loop
//! (so a hung loop stops them and systemd restarts the service), RELOADING with
//! MONOTONIC_USEC, STOPPING. Outside systemd (no `NOTIFY_SOCKET`) every call does nothing.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

pub struct Notifier {
    /// Half of `WatchdogSec`, when systemd asked for pings.
    watchdog_every: Option<Duration>,
    last_ping: Instant,
}

impl Default for Notifier {
    fn default() -> Self {
        Self::from_env()
    }
}

impl Notifier {
    /// Reads `WATCHDOG_USEC` (and `WATCHDOG_PID`) from the environment systemd gave us.
    pub fn from_env() -> Self {
        let mut usec = 0;
        let enabled = sd_notify::watchdog_enabled(false, &mut usec);
        Notifier {
            watchdog_every: (enabled && usec > 0).then(|| Duration::from_micros(usec / 2)),
            last_ping: Instant::now(),
        }
    }

    /// How often the loop must call [`Notifier::progress`], if at all.
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog_every
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(false, states) {
            log::warn!("systemd notification failed: {e}");
        }
    }

    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// The serving loop made progress: pings the watchdog when half its interval has passed.
    pub fn progress(&mut self) {
        if let Some(every) = self.watchdog_every {
            if self.last_ping.elapsed() >= every {
                self.send(&[NotifyState::Watchdog]);
                self.last_ping = Instant::now();
            }
        }
    }

    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(e) => log::warn!("reading CLOCK_MONOTONIC for RELOADING: {e}"),
        }
    }

    /// After a reload, successful or not: serving again.
    pub fn reloaded(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }
}
