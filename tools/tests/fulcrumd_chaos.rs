//! `fulcrumd` under a storm of careless clients and an operator who keeps reloading, for a
//! bounded time: clients that connect and vanish mid-message, rings attached and then the
//! client gone, malformed frames, a client that never reads its replies, and SIGHUP every
//! second with a good, a corrupt and an oversized weights file in turn. Meanwhile two
//! well-behaved clients (inline and ring frames) must have every request answered; afterwards
//! the daemon's memory must be within its plan + 8 MiB, its descriptors back where they
//! started, and its log free of panics.

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fulcrum::serve::client::Client;
use fulcrum::serve::socket;
use fulcrum_board::protocol::{
    AttachRing, Frame, FrameDesc, FrameSource, Hello, Message, SCHEMA_HASH,
};
use nix::sys::signal::Signal;

mod common;

use common::daemon::{encode, grey_frame, status_mib, weights, Daemon, Raw, TIMEOUT};

/// How long the storm lasts.
const STORM: Duration = Duration::from_secs(12);

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A small deterministic generator (xorshift), so a failing storm can be replayed.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }
}

/// Connects and vanishes in one of several rude ways, over and over.
fn vanishing_clients(path: &Path, until: Instant, seed: u64, done: &AtomicU64) {
    let mut dice = Dice(seed);
    let hello = encode(
        &Message::Hello(Hello {
            schema_hash: SCHEMA_HASH,
        }),
        1,
    );
    let (desc, pixels) = grey_frame(64, 48);
    let infer = encode(
        &Message::Infer(Frame {
            desc,
            pixels: &pixels,
        }),
        2,
    );
    while Instant::now() < until {
        let Ok(fd) = socket::connect_seqpacket(path) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let send = |bytes: &[u8]| {
            let _ = socket::send_packet(fd.as_fd(), bytes, None);
        };
        match dice.roll(6) {
            0 => {}                               // gone at once
            1 => send(&hello[..hello.len() / 2]), // half a header
            2 => {
                send(&hello);
                send(&infer[..infer.len() / 3]); // a frame cut short
            }
            3 => {
                // A ring passed, then the client gone before using it.
                send(&hello);
                let ring = nix::sys::memfd::memfd_create(
                    "chaos-ring",
                    nix::sys::memfd::MFdFlags::MFD_CLOEXEC
                        | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING,
                )
                .unwrap();
                nix::unistd::ftruncate(ring.as_fd(), 1 << 16).unwrap();
                nix::fcntl::fcntl(
                    ring.as_fd(),
                    nix::fcntl::FcntlArg::F_ADD_SEALS(
                        nix::fcntl::SealFlag::F_SEAL_SHRINK | nix::fcntl::SealFlag::F_SEAL_SEAL,
                    ),
                )
                .unwrap();
                let attach = encode(&Message::AttachRing(AttachRing { len: 1 << 16 }), 2);
                let _ = socket::send_packet(fd.as_fd(), &attach, Some(ring.as_fd()));
            }
            4 => std::thread::sleep(Duration::from_millis(30)), // silent for a while
            _ => {
                let junk: Vec<u8> = (0..dice.roll(200) + 1)
                    .map(|_| dice.roll(256) as u8)
                    .collect();
                send(&junk);
            }
        }
        drop(fd);
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// A greeted connection; in the storm a slot may be taken for a moment, so it tries again.
fn greeted(path: &Path) -> Raw {
    let hello = encode(
        &Message::Hello(Hello {
            schema_hash: SCHEMA_HASH,
        }),
        1,
    );
    let started = Instant::now();
    loop {
        let mut raw = Raw::connect(path);
        if socket::send_packet(raw.fd.as_fd(), &hello, None).is_ok() {
            if let Some(reply) = raw.recv() {
                if let Ok((_, Message::Welcome(_))) = fulcrum_board::protocol::decode(&reply) {
                    return raw;
                }
            }
        }
        assert!(started.elapsed() < TIMEOUT, "never let in");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A greeted connection sending malformed frames; each must be answered with an error (or
/// the connection closed, for the kinds that close it), and it reconnects.
fn malformed_frames(path: &Path, until: Instant, done: &AtomicU64) {
    let mut raw = greeted(path);
    let mut seq = 10;
    let (good, pixels) = grey_frame(64, 48);
    let variants: [(FrameDesc, usize); 4] = [
        (FrameDesc { width: 0, ..good }, pixels.len()), // no area
        (FrameDesc { stride: 3, ..good }, pixels.len()), // stride under a row
        (
            FrameDesc {
                source: FrameSource::Ring,
                ..good
            },
            0,
        ), // no ring attached
        (good, pixels.len() - 1),                       // short pixels
    ];
    while Instant::now() < until {
        let (desc, len) = variants[seq as usize % variants.len()];
        seq += 1;
        let msg = Message::Infer(Frame {
            desc,
            pixels: &pixels[..len],
        });
        let mut bytes = vec![0; msg.encoded_len()];
        // What the encoder itself refuses never reaches a daemon from this client.
        if msg.encode(seq, 0, &mut bytes).is_err() {
            continue;
        }
        raw.send(&bytes);
        match raw.recv() {
            Some(reply) => match fulcrum_board::protocol::decode(&reply) {
                Ok((_, Message::Error(_))) => {}
                other => panic!("a malformed frame got {other:?}"),
            },
            None => raw = greeted(path),
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// A greeted client that sends requests and never reads a reply.
fn never_reads(path: &Path, until: Instant) {
    let raw = Raw::connect(path);
    let hello = encode(
        &Message::Hello(Hello {
            schema_hash: SCHEMA_HASH,
        }),
        1,
    );
    let _ = socket::send_packet(raw.fd.as_fd(), &hello, None);
    let (desc, pixels) = grey_frame(64, 48);
    let infer = encode(
        &Message::Infer(Frame {
            desc,
            pixels: &pixels,
        }),
        2,
    );
    // Until the socket's buffer is full (the daemon stops reading it once its outbox is).
    for _ in 0..10_000 {
        match socket::send_packet(raw.fd.as_fd(), &infer, None) {
            Ok(true) => {}
            _ => break,
        }
    }
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `bytes` to `live` by renaming a staged copy over it, as an operator's deploy would.
fn replace(live: &Path, write: impl FnOnce(&Path)) {
    let staged = live.with_extension("staged");
    write(&staged);
    std::fs::rename(&staged, live).unwrap();
}

#[test]
fn the_daemon_survives_a_storm_and_cleans_up_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("model.safetensors");
    std::fs::copy(weights(), &live).unwrap();
    let good_bytes = std::fs::read(weights()).unwrap();
    let daemon = Daemon::start_with(&["--hello-timeout", "300"], &[], &live);
    let pid = daemon.child.id();
    let planned = daemon.planned_mib();
    // Descriptors with one client connected and gone (anything opened lazily is open now).
    {
        let mut c = daemon.client();
        let (desc, pixels) = grey_frame(64, 48);
        c.infer_inline(desc, &pixels, 0).unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let fds_before = open_fds(pid);

    let until = Instant::now() + STORM;
    let answered = Arc::new(AtomicU64::new(0));
    let rude = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let path = daemon.socket.clone();
    let mut storm = Vec::new();
    // Two well-behaved clients, connected before the storm as a robot's firmware is: every
    // request must be answered with detections.
    for ring in [false, true] {
        let (answered, failed) = (answered.clone(), failed.clone());
        let mut client = Client::connect(&path).unwrap();
        storm.push(std::thread::spawn(move || {
            let (desc, pixels) = grey_frame(96, 72);
            let mut i = 0;
            while Instant::now() < until {
                let result = if ring {
                    client
                        .attach_ring_for(pixels.len() as u64)
                        .and_then(|()| client.write_ring(0, &pixels))
                        .and_then(|()| client.infer_ring(desc, i))
                } else {
                    client.infer_inline(desc, &pixels, i)
                };
                if let Err(e) = result {
                    failed.store(true, Ordering::SeqCst);
                    panic!("a well-behaved request failed: {e}");
                }
                answered.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    for seed in [1, 2] {
        let (path, rude) = (path.clone(), rude.clone());
        storm.push(std::thread::spawn(move || {
            vanishing_clients(&path, until, 0x9E37_79B9_7F4A_7C15 ^ seed, &rude)
        }));
    }
    {
        let (path, rude) = (path.clone(), rude.clone());
        storm.push(std::thread::spawn(move || {
            malformed_frames(&path, until, &rude)
        }));
    }
    {
        let path = path.clone();
        storm.push(std::thread::spawn(move || never_reads(&path, until)));
    }
    // The operator: SIGHUP every second, with a good, a corrupt and an oversized file in turn.
    let mut reloads = 0;
    while Instant::now() < until {
        match reloads % 3 {
            0 => replace(&live, |p| std::fs::write(p, &good_bytes).unwrap()),
            1 => replace(&live, |p| {
                std::fs::write(p, &good_bytes[..good_bytes.len() / 2]).unwrap()
            }),
            _ => replace(&live, |p| {
                let f = std::fs::File::create(p).unwrap();
                f.set_len(fulcrum::model::checkpoint::max_file_bytes() + 1)
                    .unwrap();
            }),
        }
        daemon.signal(Signal::SIGHUP);
        reloads += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    for t in storm {
        t.join().expect("a storm thread failed");
    }
    assert!(!failed.load(Ordering::SeqCst));
    let answered = answered.load(Ordering::Relaxed);
    let rude = rude.load(Ordering::Relaxed);
    assert!(
        answered > 50,
        "only {answered} well-behaved requests answered"
    );
    assert!(rude > 100, "only {rude} rude connections made");

    // Afterwards: the last reload settled, every storm connection closed.
    let mut client = daemon.client();
    let started = Instant::now();
    loop {
        let stats = client.stats().unwrap();
        let health = client.health().unwrap();
        let settled = stats.clients == 1
            && health.state == fulcrum_board::protocol::ServiceState::Ready
            && open_fds(pid) <= fds_before + 1;
        if settled {
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "not settled: {stats:?} {health:?}, {} fds (before {fds_before})\n{}",
            open_fds(pid),
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let generation = client.stats().unwrap().weights_generation;
    drop(client);
    std::thread::sleep(Duration::from_millis(300));
    let log = daemon.log();
    assert_eq!(open_fds(pid), fds_before, "descriptors leaked:\n{log}");
    // Memory: what the process holds beyond its code and libraries, against the plan.
    let anon = status_mib(pid, "RssAnon:");
    assert!(
        anon <= planned + 8.0,
        "{anon:.1} MiB anonymous resident memory after the storm, plan {planned:.1} MiB"
    );
    assert!(!log.contains("panicked"), "{log}");
    // Good reloads went through, corrupt and oversized ones were refused.
    assert!(generation >= 2, "generation {generation}\n{log}");
    assert!(log.contains("reload refused"), "{log}");
    assert!(log.contains("more than any fulcrum checkpoint"), "{log}");
    eprintln!(
        "storm: {answered} requests answered, {rude} rude connections and frames, {reloads} \
         reloads (generation {generation}), {anon:.1} MiB anonymous resident (plan {planned:.1})"
    );
    assert_eq!(daemon.stop().code(), Some(0));
}
