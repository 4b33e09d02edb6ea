//! systemd's notification protocol (`Type=notify`) through the `sd-notify` crate: READY once
//! serving, STATUS lines, WATCHDOG pings at half of `WatchdogSec` sent from the serving loop
//! (so a hung loop stops them and systemd restarts the service), RELOADING with
//! MONOTONIC_USEC, STOPPING. Outside systemd (no `NOTIFY_SOCKET`) every call does nothing.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

/// Half of the watchdog timeout, if the watchdog is ours: as sd_watchdog_enabled(3) says, a
/// `WATCHDOG_PID` naming another process means it is not (an unset one means it is).
fn watchdog_interval(usec: Option<String>, pid: Option<String>) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|v| *v > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

pub struct Notifier {
    /// Whether systemd listens (`NOTIFY_SOCKET` is set).
    active: bool,
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
    /// Reads `WATCHDOG_USEC` and `WATCHDOG_PID` from the environment systemd gave us.
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok();
        Notifier {
            active: std::env::var_os("NOTIFY_SOCKET").is_some(),
            watchdog_every: watchdog_interval(var("WATCHDOG_USEC"), var("WATCHDOG_PID")),
            last_ping: Instant::now(),
        }
    }

    /// Whether notifications go anywhere (the service runs under systemd).
    pub fn is_active(&self) -> bool {
        self.active
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_follows_systemd_rules() {
        let me = std::process::id().to_string();
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            watchdog_interval(some("2000000"), None),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            watchdog_interval(some("2000000"), Some(me)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(watchdog_interval(some("2000000"), some("1")), None);
        assert_eq!(watchdog_interval(some("0"), None), None);
        assert_eq!(watchdog_interval(some("soon"), None), None);
        assert_eq!(watchdog_interval(None, None), None);
    }
}
