//! A `fulcrumd` under test: started on a small trained det-s with a socket in a folder of its
//! own, its log, signals and clients; and a raw connection for sending anything at all.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum::serve::client::Client;
use fulcrum::serve::socket::{self, Received};
use fulcrum_board::protocol::{
    decode, ErrorCode, FrameDesc, FrameSource, Hello, Kind, Message, PixelFormat, MAX_MESSAGE_LEN,
    SCHEMA_HASH,
};

pub const FULCRUM: &str = env!("CARGO_BIN_EXE_fulcrum");
pub const FULCRUMD: &str = env!("CARGO_BIN_EXE_fulcrumd");
/// Every wait here is for something that takes a few seconds at most; more means a hang.
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub fn raccoon_images() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/raccoon/images")
}

/// A few real photos, copied to a folder of their own (the shared folder holds 200).
pub fn photos(dir: &Path, n: usize) -> PathBuf {
    let out = dir.join("photos");
    std::fs::create_dir_all(&out).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(raccoon_images())
        .expect("the shared raccoon images (../shared/data beside the checkout)")
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for p in names.iter().take(n) {
        std::fs::copy(p, out.join(p.file_name().unwrap())).unwrap();
    }
    out
}

pub fn run(cmd: &mut Command) -> (ExitStatus, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("run a binary");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One small trained det-s for the whole test binary: 64 synthetic images, a few steps.
pub fn weights() -> &'static Path {
    static WEIGHTS: OnceLock<PathBuf> = OnceLock::new();
    WEIGHTS.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fulcrumd-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("syn");
        let (st, _, err) = run(Command::new(FULCRUM)
            .args(["pack", "--synthetic", "64", "--out"])
            .arg(&data));
        assert!(st.success(), "pack: {err}");
        let (st, _, err) = run(Command::new(FULCRUM)
            .args([
                "train",
                "--engine",
                "cpu",
                "--max-steps",
                "6",
                "--batch",
                "8",
                "--data",
            ])
            .arg(&data)
            .arg("--out")
            .arg(dir.join("run")));
        assert!(st.success(), "train: {err}");
        dir.join("run/last.safetensors")
    })
}

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    pub fn start(args: &[&str]) -> Daemon {
        Self::start_with(args, &[], weights())
    }

    /// The memory plan's total, as the daemon logged it at start.
    pub fn planned_mib(&self) -> f64 {
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains("memory planned up front"))
            .unwrap_or_else(|| panic!("no memory plan in the log:\n{log}"));
        let text = line.rsplit(": ").next().unwrap();
        let (value, unit) = text.split_once(' ').unwrap();
        let v: f64 = value.parse().unwrap();
        match unit {
            "KiB" => v / 1024.0,
            "MiB" => v,
            other => panic!("unit {other} in {line}"),
        }
    }

    /// Starts `fulcrumd` on `weights` with a socket in a fresh folder and waits until it
    /// accepts connections.
    pub fn start_with(args: &[&str], env: &[(&str, &str)], weights: &Path) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("fulcrumd.sock");
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(FULCRUMD);
        cmd.arg("--weights")
            .arg(weights)
            .arg("--socket")
            .arg(&socket)
            // The CPU engine unless the test picks one.
            .args(if args.contains(&"--engine") {
                &[][..]
            } else {
                &["--engine", "cpu"][..]
            })
            // A low default for the barely trained test model, unless the test sets one.
            .args(if args.contains(&"--threshold") {
                &[][..]
            } else {
                &["--threshold", "0.05"][..]
            })
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("daemon.err")).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start fulcrumd");
        let mut d = Daemon {
            child,
            socket,
            log: dir.path().join("daemon.err"),
            _dir: dir,
        };
        let started = Instant::now();
        while socket::connect_seqpacket(&d.socket).is_err() {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!("fulcrumd exited early ({status}):\n{}", d.log());
            }
            assert!(
                started.elapsed() < TIMEOUT,
                "fulcrumd did not listen:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// SIGTERM, then the exit status and the whole log (whose folder goes with `self`).
    pub fn stop_with_log(mut self) -> (ExitStatus, String) {
        let status = self.terminate();
        (status, self.log())
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> ExitStatus {
        self.terminate()
    }

    pub fn terminate(&mut self) -> ExitStatus {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < TIMEOUT,
                "fulcrumd ignored SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.socket).unwrap_or_else(|e| panic!("{e}\n{}", self.log()))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn grey_frame(w: u16, h: u16) -> (FrameDesc, Vec<u8>) {
    let desc = FrameDesc::packed(PixelFormat::Rgb8, FrameSource::Inline, w, h).unwrap();
    let pixels: Vec<u8> = (0..desc.length).map(|i| (i % 251) as u8).collect();
    (desc, pixels)
}

/// A connection without the client's conveniences, for sending anything at all.
pub struct Raw {
    pub fd: OwnedFd,
    pub buf: Vec<u8>,
    pub cmsg: Vec<u8>,
}

impl Raw {
    pub fn connect(path: &Path) -> Raw {
        Raw {
            fd: socket::connect_seqpacket(path).unwrap(),
            buf: vec![0; MAX_MESSAGE_LEN + 1],
            cmsg: socket::cmsg_buffer(),
        }
    }

    pub fn send(&self, bytes: &[u8]) {
        assert!(socket::send_packet(self.fd.as_fd(), bytes, None).unwrap());
    }

    /// The next packet (waiting up to TIMEOUT), or None once the daemon has closed.
    pub fn recv(&mut self) -> Option<Vec<u8>> {
        let started = Instant::now();
        loop {
            match socket::recv_packet(self.fd.as_fd(), &mut self.buf, &mut self.cmsg).unwrap() {
                Received::Packet { len, .. } => return Some(self.buf[..len].to_vec()),
                Received::Closed => return None,
                Received::Empty | Received::Oversized => {}
            }
            assert!(started.elapsed() < TIMEOUT, "no reply");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `bytes` and returns the error code of the reply (panics on any other reply).
    pub fn error_for(&mut self, bytes: &[u8]) -> ErrorCode {
        self.send(bytes);
        let reply = self.recv().expect("an error reply before closing");
        match decode(&reply).unwrap().1 {
            Message::Error(e) => e.code,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    pub fn hello(&mut self) {
        let hello = encode(
            &Message::Hello(Hello {
                schema_hash: SCHEMA_HASH,
            }),
            1,
        );
        self.send(&hello);
        let reply = self.recv().unwrap();
        assert_eq!(decode(&reply).unwrap().1.kind(), Kind::Welcome);
    }
}

pub fn encode(msg: &Message<'_>, seq: u32) -> Vec<u8> {
    let mut buf = vec![0; msg.encoded_len()];
    msg.encode(seq, 0, &mut buf).unwrap();
    buf
}

pub fn wait_for(what: &str, daemon: &Daemon, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "waiting for {what}:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `fulcrum infer` or `fulcrum client` JSON lines without their timings.
pub fn without_ms(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("ms");
            v
        })
        .collect()
}

/// `fulcrum infer --threshold 0.05` with the test weights on `images`: its lines without
/// timings, checked to hold detections (a comparison with none would prove nothing).
pub fn infer_lines(images: &Path) -> Vec<serde_json::Value> {
    let (st, out, err) = run(Command::new(FULCRUM)
        .args([
            "infer",
            "--engine",
            "cpu",
            "--threshold",
            "0.05",
            "--weights",
        ])
        .arg(weights())
        .arg(images));
    assert!(st.success(), "{err}");
    let lines = without_ms(&out);
    let found: usize = lines
        .iter()
        .map(|v| v["detections"].as_array().unwrap().len())
        .sum();
    assert!(
        found > 0,
        "the test model finds nothing: the comparison would be empty"
    );
    lines
}

/// A `kB` field of `/proc/PID/status` (`VmRSS:`, `RssAnon:`, …) in MiB.
pub fn status_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kib / 1024.0
}
