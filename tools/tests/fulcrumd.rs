//! `fulcrumd` as systemd and the robot's firmware see it, driving the real binaries: the
//! notification protocol (READY after warm-up, WATCHDOG pings, STOPPING on SIGTERM), clients
//! getting the same detections as `fulcrum infer`, peers of other uids refused, hostile
//! messages answered with errors while another client is served, a client that stops reading
//! stalling nobody else, and reloads that keep the old weights when the new file is bad.

use std::io::ErrorKind;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fulcrum::serve::socket;
use fulcrum::serve::Error;
use fulcrum_board::protocol::{
    ErrorCode, FrameDesc, FrameSource, Hello, Kind, Message, PixelFormat, HEADER_LEN,
    MAX_MESSAGE_LEN, SCHEMA_HASH,
};

mod common;

use common::daemon::{
    encode, grey_frame, infer_lines, photos, run, wait_for, weights, without_ms, Daemon, Raw,
    FULCRUM, FULCRUMD, TIMEOUT,
};

#[test]
fn systemd_sees_ready_watchdog_and_stopping() {
    let notify_dir = tempfile::tempdir().unwrap();
    let notify_path = notify_dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    // No WATCHDOG_PID: systemd's rule is that the watchdog is then the process's own.
    let daemon = Daemon::start_with(
        &[],
        &[
            ("NOTIFY_SOCKET", notify_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "300000"),
        ],
        weights(),
    );
    let mut seen: Vec<String> = Vec::new();
    let wait_for = |what: &str, seen: &mut Vec<String>| {
        let mut buf = [0u8; 4096];
        let started = Instant::now();
        while !seen.iter().any(|m| m.lines().any(|l| l == what)) {
            assert!(started.elapsed() < TIMEOUT, "no {what} in {seen:?}");
            match notify.recv(&mut buf) {
                Ok(n) => seen.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("{e}"),
            }
        }
    };
    wait_for("READY=1", &mut seen);
    let ready = seen.iter().find(|m| m.contains("READY=1")).unwrap();
    assert!(ready.contains("STATUS="), "{ready}");
    // READY comes after the warm-up: a frame is answered at once.
    let (desc, pixels) = grey_frame(64, 48);
    let reply = daemon.client().infer_inline(desc, &pixels, 5).unwrap();
    assert_eq!((reply.frame_width, reply.frame_height), (64, 48));
    // Pings at half of WatchdogSec (150 ms): several within a second and a half.
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_millis(1500) {
        if let Ok(n) = notify.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    let pings = seen
        .iter()
        .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
        .count();
    assert!(pings >= 4, "{pings} watchdog pings in 1.5 s: {seen:?}");
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    wait_for("STOPPING=1", &mut seen);
    let socket = daemon.socket.clone();
    let status = daemon.stop();
    assert_eq!(status.code(), Some(0), "exit after SIGTERM");
    assert!(!socket.exists(), "the socket is removed on exit");
}

#[test]
fn concurrent_clients_get_the_same_detections_as_infer() {
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 4);
    let daemon = Daemon::start(&[]);
    let expected = infer_lines(&photos);
    assert_eq!(expected.len(), 4);
    // Three clients at once: inline RGB, RGB through the memfd ring, and BGR.
    let variants: [&[&str]; 3] = [&[], &["--ring"], &["--format", "bgr8"]];
    let children: Vec<_> = variants
        .iter()
        .map(|extra| {
            Command::new(FULCRUM)
                .arg("client")
                .arg("--socket")
                .arg(&daemon.socket)
                .args(["--threshold", "0.05"])
                .args(*extra)
                .arg(&photos)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (child, extra) in children.into_iter().zip(variants) {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "client {extra:?}: {stderr}\n{}",
            daemon.log()
        );
        let got = without_ms(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(got, expected, "client {extra:?} differs from fulcrum infer");
    }
    // The plan was made and fits the budget given here.
    let planned = daemon.planned_mib();
    assert!(planned > 0.5 && planned < 64.0, "{planned} MiB");
    let stats = daemon.client().stats().unwrap();
    assert_eq!(stats.requests, 12);
    assert_eq!(stats.errors, 0);
    assert!(
        stats.p99_us >= stats.p50_us && stats.p50_us > 0,
        "{stats:?}"
    );
    // At stop the daemon logs its peak resident memory beside the plan.
    let (status, log) = daemon.stop_with_log();
    assert!(status.success(), "{log}");
    // After serving, the peak resident memory less the program's code and libraries is
    // within 8 MiB of the plan.
    let line = peak_at_stop(&log);
    let mib = |after| common::mib_after(line, after);
    let (peak, code, plan) = (mib("peak resident memory"), mib("("), mib("planned"));
    assert!((peak - code - plan).abs() <= 8.0, "{line}");
}

/// The line in which a stopped daemon logged its peak resident memory beside its plan.
fn peak_at_stop(log: &str) -> &str {
    log.lines()
        .find(|l| l.contains("stopped; peak resident memory"))
        .unwrap_or_else(|| panic!("no peak memory at stop:\n{log}"))
}

/// At its default engine (`auto`: here the CPU engine, or lavapipe being a CPU device) the
/// daemon's peak resident memory, its code and libraries included, is within 8 MiB of its
/// plan: choosing the engine leaves no Vulkan driver mapped.
#[test]
fn at_its_default_engine_the_daemon_stays_within_its_plan() {
    let daemon = Daemon::start(&["--engine", "auto"]);
    let planned = daemon.planned_mib();
    assert!(daemon.client().health().is_ok());
    let (status, log) = daemon.stop_with_log();
    assert!(status.success(), "{log}");
    let peak = common::mib_after(peak_at_stop(&log), "peak resident memory");
    assert!(
        peak - planned <= 8.0,
        "peak resident {peak} MiB against a plan of {planned} MiB:\n{log}"
    );
}

#[test]
fn peers_of_other_uids_are_refused_unless_allowed() {
    if !nix::unistd::getuid().is_root() {
        println!("SKIP: needs root to run a client as another uid");
        return;
    }
    let nobody = 65534;
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 1);
    for allow in [false, true] {
        let uid = nobody.to_string();
        let args: &[&str] = if allow { &["--allow-uid", &uid] } else { &[] };
        let daemon = Daemon::start(args);
        // Let the filesystem admit anyone, so that the daemon's own check is what decides.
        let parent = daemon.socket.parent().unwrap();
        std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&daemon.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (st, out, err) = run(Command::new(FULCRUM)
            .arg("client")
            .arg("--socket")
            .arg(&daemon.socket)
            .arg(&photos)
            .uid(nobody)
            .gid(nobody)
            .env("HOME", "/nonexistent"));
        if allow {
            assert!(st.success(), "allowed uid refused: {err}\n{}", daemon.log());
            assert_eq!(out.lines().count(), 1);
        } else {
            assert!(!st.success(), "uid {nobody} was served: {out}");
            assert!(
                err.contains("not allowed") || err.contains("may not use"),
                "{err}"
            );
            assert!(
                daemon.log().contains("refused a client"),
                "{}",
                daemon.log()
            );
            assert_eq!(daemon.client().stats().unwrap().refused, 1);
        }
    }
}

#[test]
fn hostile_messages_get_errors_while_another_client_is_served() {
    let daemon = Daemon::start(&["--max-frame-side", "640"]);
    let mut good = daemon.client();
    let (desc, pixels) = grey_frame(96, 64);
    let baseline = good.infer_inline(desc, &pixels, 0).unwrap();
    let mut check_good = || {
        let again = good.infer_inline(desc, &pixels, 0).unwrap();
        assert_eq!(again.boxes, baseline.boxes);
    };

    let mut bad = Raw::connect(&daemon.socket);
    bad.hello();
    let frame = encode(
        &Message::Infer(fulcrum_board::protocol::Frame {
            desc,
            pixels: &pixels,
        }),
        7,
    );
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        (
            "a truncated header",
            frame[..10].to_vec(),
            ErrorCode::MALFORMED,
        ),
        (
            "a truncated body",
            frame[..frame.len() - 1].to_vec(),
            ErrorCode::MALFORMED,
        ),
        (
            "an unknown kind",
            {
                let mut b = frame.clone();
                b[6] = 99;
                b
            },
            ErrorCode::MALFORMED,
        ),
        (
            "a frame larger than announced",
            {
                let mut b = frame.clone();
                b.push(0);
                let len = (b.len() - HEADER_LEN) as u32;
                b[12..16].copy_from_slice(&len.to_le_bytes());
                b
            },
            ErrorCode::MALFORMED,
        ),
        (
            "a stride shorter than a row",
            {
                let mut b = frame.clone();
                b[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&10u32.to_le_bytes());
                b
            },
            ErrorCode::BAD_FRAME,
        ),
        (
            "a reply kind from a client",
            encode(&Message::Ack(Kind::Hello), 8),
            ErrorCode::UNEXPECTED,
        ),
        (
            "a ring frame with no ring",
            encode(
                &Message::Infer(fulcrum_board::protocol::Frame {
                    desc: FrameDesc {
                        source: FrameSource::Ring,
                        ..desc
                    },
                    pixels: &[],
                }),
                9,
            ),
            ErrorCode::NO_RING,
        ),
        (
            "a frame over the side limit",
            {
                let big =
                    FrameDesc::packed(PixelFormat::Gray8, FrameSource::Ring, 1000, 10).unwrap();
                encode(
                    &Message::Infer(fulcrum_board::protocol::Frame {
                        desc: big,
                        pixels: &[],
                    }),
                    10,
                )
            },
            ErrorCode::TOO_LARGE,
        ),
        (
            "a packet over the message limit",
            vec![0u8; MAX_MESSAGE_LEN + 1],
            ErrorCode::TOO_LARGE,
        ),
        (
            "a reload of a missing file",
            encode(
                &Message::Reload {
                    path: "/nonexistent/w.safetensors",
                },
                11,
            ),
            ErrorCode::RELOAD_FAILED,
        ),
    ];
    for (what, bytes, code) in &cases {
        assert_eq!(bad.error_for(bytes), *code, "{what}");
        check_good();
    }

    // A ring whose frames point outside it.
    let mut ringed = daemon.client();
    ringed.attach_ring(4096).unwrap();
    let mut outside = FrameDesc::packed(PixelFormat::Gray8, FrameSource::Ring, 32, 32).unwrap();
    outside.offset = 4096 - 512;
    match ringed.infer_ring(outside, 0) {
        Err(Error::Remote { code, .. }) => assert_eq!(code, ErrorCode::BAD_FRAME),
        other => panic!("{other:?}"),
    }
    outside.offset = 0;
    ringed.write_ring(0, &[90; 1024]).unwrap();
    assert_eq!(ringed.infer_ring(outside, 3).unwrap().frame_width, 32);
    check_good();

    // What closes the connection: another version, garbage, no Hello, another schema.
    let mut wrong_version = frame.clone();
    wrong_version[4] = 1;
    let mut other_schema = encode(
        &Message::Hello(Hello {
            schema_hash: SCHEMA_HASH ^ 1,
        }),
        1,
    );
    let closing: [(&str, &[u8], ErrorCode, bool); 4] = [
        (
            "another protocol version",
            &wrong_version,
            ErrorCode::UNSUPPORTED_VERSION,
            true,
        ),
        (
            "garbage",
            b"GET / HTTP/1.1\r\n\r\n",
            ErrorCode::MALFORMED,
            false,
        ),
        ("a frame before Hello", &frame, ErrorCode::UNEXPECTED, false),
        (
            "another schema",
            &other_schema,
            ErrorCode::SCHEMA_MISMATCH,
            false,
        ),
    ];
    for (what, bytes, code, greet) in closing {
        let mut raw = Raw::connect(&daemon.socket);
        if greet {
            raw.hello();
        }
        assert_eq!(raw.error_for(bytes), code, "{what}");
        assert_eq!(raw.recv(), None, "{what}: the connection is closed");
        check_good();
    }
    other_schema.clear();
    let stats = good.stats().unwrap();
    assert_eq!(stats.errors as usize, cases.len() + 1 + 4, "{stats:?}");
    assert_eq!(stats.weights_generation, 1);
}

#[test]
fn a_client_that_stops_reading_does_not_stall_the_others() {
    let daemon = Daemon::start(&[]);
    let mut stuck = Raw::connect(&daemon.socket);
    stuck.hello();
    let (desc, pixels) = grey_frame(32, 32);
    let frame = encode(
        &Message::Infer(fulcrum_board::protocol::Frame {
            desc,
            pixels: &pixels,
        }),
        2,
    );
    nix::fcntl::fcntl(
        stuck.fd.as_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    // Requests until the socket is full: the daemon answers until its replies fill the
    // client's buffer, then leaves it alone.
    let mut sent = 0;
    while sent < 5000 && socket::send_packet(stuck.fd.as_fd(), &frame, None).unwrap() {
        sent += 1;
    }
    assert!(sent > 10, "only {sent} requests fit");
    let mut other = daemon.client();
    let started = Instant::now();
    for i in 0..30 {
        assert_eq!(
            other.infer_inline(desc, &pixels, i).unwrap().timestamp_us,
            i
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "served slowly: {:?}",
        started.elapsed()
    );
    assert_eq!(
        other.health().unwrap().state,
        fulcrum_board::protocol::ServiceState::Ready
    );
}

#[test]
fn reloads_swap_good_weights_and_keep_serving_on_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("model.safetensors");
    std::fs::copy(weights(), &live).unwrap();
    let allowed = dir.path().to_str().unwrap();
    let daemon = Daemon::start_with(&["--client-reload-dir", allowed], &[], &live);
    let mut client = daemon.client();
    let (desc, pixels) = grey_frame(80, 60);
    let before = client.infer_inline(desc, &pixels, 0).unwrap();

    // A corrupt file, by request and by SIGHUP: refused, the old weights keep serving.
    let corrupt = dir.path().join("corrupt.safetensors");
    let bytes = std::fs::read(weights()).unwrap();
    std::fs::write(&corrupt, &bytes[..bytes.len() / 2]).unwrap();
    match client.reload(Some(corrupt.to_str().unwrap())) {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::RELOAD_FAILED);
            assert!(text.contains("corrupt.safetensors"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    std::fs::write(&live, b"not a checkpoint").unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    // Loads run beside the serving loop: wait for this one's refusal (the request's was the
    // first), so that the good file below is not what it reads.
    let started = Instant::now();
    while daemon.log().matches("reload refused").count() < 2 {
        assert!(started.elapsed() < TIMEOUT, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(client.stats().unwrap().weights_generation, 1);
    assert_eq!(
        client.infer_inline(desc, &pixels, 1).unwrap().boxes,
        before.boxes
    );

    // A good file: swapped in, generation 2, same model so same boxes.
    std::fs::copy(weights(), &live).unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGHUP);
    let started = Instant::now();
    while client.stats().unwrap().weights_generation != 2 {
        assert!(started.elapsed() < TIMEOUT, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    client.reload(None).unwrap();
    assert_eq!(client.stats().unwrap().weights_generation, 3);
    assert_eq!(
        client.infer_inline(desc, &pixels, 2).unwrap().boxes,
        before.boxes
    );
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn bad_options_are_clear_errors() {
    let (st, _, err) = run(Command::new(FULCRUMD).args(["--socket", "/tmp/x.sock"]));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("no weights"), "{err}");
    let (st, _, err) = run(Command::new(FULCRUMD).args([
        "--weights",
        "/nonexistent.safetensors",
        "--socket",
        "/tmp/x.sock",
    ]));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("/nonexistent.safetensors"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fulcrumd.toml");
    std::fs::write(&config, "weigths = \"x\"\n").unwrap();
    let (st, _, err) = run(Command::new(FULCRUMD).arg("--config").arg(&config));
    assert_eq!(st.code(), Some(2));
    assert!(
        err.contains("weigths") && err.contains("fulcrumd.toml"),
        "{err}"
    );
    // The NMS limit from the file is checked like the option's.
    std::fs::write(&config, "weights = \"x\"\nnms = 1.5\n").unwrap();
    let (st, _, err) = run(Command::new(FULCRUMD).arg("--config").arg(&config));
    assert_eq!(st.code(), Some(2));
    assert!(
        err.contains("--nms") && err.contains("not in (0, 1]"),
        "{err}"
    );
    // So is the fine-tune's share, from the file and the command line alike.
    std::fs::write(&config, "weights = \"x\"\nfine_tune_share = 0.95\n").unwrap();
    let (st, _, err) = run(Command::new(FULCRUMD).arg("--config").arg(&config));
    assert_eq!(st.code(), Some(2));
    assert!(
        err.contains("--fine-tune-share 0.95") && err.contains("from 0"),
        "{err}"
    );
    let (st, _, err) =
        run(Command::new(FULCRUMD).args(["--weights", "x", "--fine-tune-share=-0.1"]));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("--fine-tune-share -0.1"), "{err}");
    // The replay data must be a packed dataset, and its share of a batch a share.
    std::fs::write(
        &config,
        "weights = \"x\"\nfine_tune_replay = \"/nonexistent\"\n",
    )
    .unwrap();
    let (st, _, err) = run(Command::new(FULCRUMD).arg("--config").arg(&config));
    assert_eq!(st.code(), Some(2));
    assert!(
        err.contains("--fine-tune-replay /nonexistent") && err.contains("not a packed dataset"),
        "{err}"
    );
    let (st, _, err) =
        run(Command::new(FULCRUMD).args(["--weights", "x", "--fine-tune-replay-fraction", "1"]));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("--fine-tune-replay-fraction 1"), "{err}");
    let (st, out, _) = run(Command::new(FULCRUMD).arg("--help"));
    assert!(st.success());
    for option in [
        "--fine-tune-share",
        "--fine-tune-replay",
        "--weights",
        "--socket",
        "--engine",
        "--device",
        "--fp16",
        "--allow-uid",
        "--allow-gid",
        "--mem-budget",
        "--state-dir",
        "--config",
        "WatchdogSec",
    ] {
        assert!(out.contains(option), "--help does not explain {option}");
    }
    // A memory budget the plan does not fit: refused before serving, with the plan.
    let (st, _, err) = run(Command::new(FULCRUMD)
        .arg("--weights")
        .arg(weights())
        .args([
            "--socket",
            "/tmp/never.sock",
            "--engine",
            "cpu",
            "--mem-budget",
            "1M",
        ]));
    assert_eq!(st.code(), Some(2));
    assert!(
        err.contains("serving needs") && err.contains("--mem-budget is 1.0 MiB"),
        "{err}"
    );
    assert!(
        err.contains("client outboxes")
            && err.contains("model: weights")
            && err.contains("cpu engine: kernel scratch"),
        "{err}"
    );
    assert!(!Path::new("/tmp/never.sock").exists());
    // A Vulkan device that is not there: refused at start as the engine's error, naming the
    // devices there are, not blamed on the weights.
    // Whether the engine is asked for or chosen (`auto`).
    let engines: &[&str] = match fulcrum::compute::vulkan::testing::required() {
        true => &["vulkan", "auto"],
        false => &[],
    };
    for engine in engines {
        let (st, _, err) = run(Command::new(FULCRUMD)
            .arg("--weights")
            .arg(weights())
            .args(["--socket", "/tmp/never.sock", "--engine", engine])
            .args(["--device", "99", "--fp16"]));
        assert_eq!(st.code(), Some(2));
        assert!(
            err.contains("no Vulkan device 99")
                && err.contains("the devices are: 0 ")
                && !err.contains("weights"),
            "--engine {engine}: {err}"
        );
        assert!(!Path::new("/tmp/never.sock").exists());
    }
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"keep").unwrap();
    let (st, _, err) = run(Command::new(FULCRUMD)
        .arg("--weights")
        .arg(weights())
        .arg("--socket")
        .arg(&plain)
        .args(["--engine", "cpu"]));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&plain).unwrap(), b"keep");
}

/// The static library and header, built for this test in a target folder of its own (the
/// workspace's may be locked by the cargo running this test).
fn capi_library() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let target = root.join("target/capi-test");
        let (st, _, err) = run(Command::new(env!("CARGO"))
            .args(["build", "-p", "fulcrum-board-capi", "--target-dir"])
            .arg(&target)
            .current_dir(&root));
        assert!(st.success(), "building libfulcrum_protocol.a: {err}");
        target.join("debug/libfulcrum_protocol.a")
    })
    .clone()
}

#[test]
fn the_c_firmware_client_gets_the_same_detections_as_the_rust_client() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let exe = dir.path().join("firmware_client");
    let (st, _, err) = run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(root.join("board/capi/include"))
        .arg(root.join("tools/c/firmware_client.c"))
        .arg(capi_library())
        .arg("-o")
        .arg(&exe));
    assert!(st.success(), "cc: {err}");

    let daemon = Daemon::start(&["--mem-budget", "64M"]);
    let dump = dir.path().join("frame0.nv12");
    let (st, out, err) = run(Command::new(&exe)
        .arg(&daemon.socket)
        .args(["6", "320", "240", "--dump-frame"])
        .arg(&dump));
    assert!(
        st.success(),
        "firmware_client: {err}\n{out}\n{}",
        daemon.log()
    );
    assert!(
        out.starts_with("model: input 128x128, 2 classes, engine cpu"),
        "{out}"
    );
    for i in 0..6 {
        assert!(
            out.contains(&format!("frame {i}: ")),
            "frame {i} missing:\n{out}"
        );
    }
    assert!(out.contains("stats: 6 requests, 0 errors"), "{out}");

    // The same NV12 frame from Rust: the same boxes, printed the same way.
    let bytes = std::fs::read(&dump).unwrap();
    let desc = FrameDesc::packed(PixelFormat::Nv12, FrameSource::Inline, 320, 240).unwrap();
    let rust = daemon
        .client()
        .infer(PixelFormat::Nv12, 320, 240, &bytes, 0)
        .unwrap();
    assert_eq!(bytes.len(), desc.length as usize);
    let classes = daemon.client().classes().unwrap();
    let expected: Vec<String> = rust
        .boxes
        .iter()
        .map(|d| {
            format!(
                "  {} {:.4} [{:.1}, {:.1}, {:.1}, {:.1}]",
                classes[usize::from(d.class)],
                d.score,
                d.x0,
                d.y0,
                d.x1,
                d.y1
            )
        })
        .collect();
    let first: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("frame 0:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(first, expected, "C and Rust clients disagree on frame 0");
    assert!(
        out.contains(&format!(
            "frame 0: {} detections in 320x240",
            expected.len()
        )),
        "{out}"
    );
}

/// A fine-tune folder: `train/` and `val/`, synthetic, packed with different seeds.
fn fine_tune_data(dir: &Path) -> PathBuf {
    let data = dir.join("fine-tune-data");
    for (split, n, seed) in [("train", "96", "21"), ("val", "32", "22")] {
        let (st, _, err) = run(Command::new(FULCRUM)
            .args(["pack", "--synthetic", n, "--seed", seed, "--out"])
            .arg(data.join(split)));
        assert!(st.success(), "pack {split}: {err}");
    }
    data
}

#[test]
fn fine_tuning_serves_on_swaps_better_weights_and_resumes_after_kill_9() {
    use fulcrum_board::protocol::{FineTuneFreeze, FineTuneParams, FineTuneState};
    let dir = tempfile::tempdir().unwrap();
    let data = fine_tune_data(dir.path());
    let state = dir.path().join("state");
    let state_arg = state.to_str().unwrap();
    // The backbone frozen, its biases training (the choice survives the kill).
    let params = FineTuneParams {
        max_steps: 0,
        epochs: 4,
        swap_always: true,
        freeze: FineTuneFreeze::Backbone,
        train_biases: true,
    };

    // Refused with reasons: no state folder; a folder without val/.
    let plain = Daemon::start(&[]);
    match plain
        .client()
        .fine_tune_start(data.to_str().unwrap(), params)
    {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::FINE_TUNE_FAILED);
            assert!(text.contains("--state-dir"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    drop(plain);
    let args = ["--state-dir", state_arg, "--fine-tune-slice", "40"];
    let daemon = Daemon::start(&args);
    let mut control = daemon.client();
    let train_only = data.join("train");
    match control.fine_tune_start(train_only.to_str().unwrap(), params) {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::FINE_TUNE_FAILED);
            assert!(
                text.contains("train/val") && text.contains("--holdout"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Biases training with nothing frozen (or the daemon left to choose) is refused.
    let unfrozen = FineTuneParams {
        freeze: FineTuneFreeze::Auto,
        ..params
    };
    match control.fine_tune_start(data.to_str().unwrap(), unfrozen) {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::FINE_TUNE_FAILED);
            assert!(
                text.contains("train_biases") && text.contains("backbone"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        control.fine_tune_status().unwrap().state,
        FineTuneState::Idle
    );

    // Started: frames are answered all along, with the same boxes until a swap.
    control
        .fine_tune_start(data.to_str().unwrap(), params)
        .unwrap();
    match control.fine_tune_start(data.to_str().unwrap(), params) {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::FINE_TUNE_FAILED);
            assert!(text.contains("already running"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let mut camera = daemon.client();
    let (desc, pixels) = grey_frame(96, 72);
    let before = camera.infer_inline(desc, &pixels, 0).unwrap();
    let checkpoint = state.join("fine-tune/run/last.safetensors");
    let mut frames = 0u32;
    wait_for("the first checkpoint and a step past it", &daemon, || {
        let reply = camera.infer_inline(desc, &pixels, 1).unwrap();
        if camera.stats().unwrap().weights_generation == 1 {
            assert_eq!(reply.boxes, before.boxes);
        }
        frames += 1;
        let saved = fulcrum::model::Checkpoint::load(&checkpoint).map(|c| c.progress.step);
        let status = control.fine_tune_status().unwrap();
        assert_eq!(status.state, FineTuneState::Running, "{}", daemon.log());
        matches!(saved, Ok(s) if s > 0 && u64::from(status.step) > s)
    });
    assert!(frames > 1);

    // kill -9 mid-run: the checkpoint is whole, and a restart resumes from it.
    let mut daemon = daemon;
    let saved = fulcrum::model::Checkpoint::load(&checkpoint)
        .expect("the checkpoint survives kill -9")
        .progress
        .step;
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    let saved_after = fulcrum::model::Checkpoint::load(&checkpoint)
        .expect("the checkpoint survives kill -9")
        .progress
        .step;
    assert!(saved_after >= saved);
    // The frozen backbone's weights were never saved with optimizer state; its biases were.
    let tuned = fulcrum::model::Checkpoint::load(&checkpoint).unwrap();
    assert!(
        tuned.get("adam.m.stem.weight").is_none()
            && tuned.get("adam.m.stem.bias").is_some()
            && tuned.get("adam.m.head.out.weight").is_some()
    );
    drop(daemon);
    let daemon = Daemon::start(&args);
    let mut control = daemon.client();
    wait_for("the fine-tune to finish", &daemon, || {
        control.fine_tune_status().unwrap().state == FineTuneState::Finished
    });
    let log = daemon.log();
    assert!(log.contains("resuming the fine-tune"), "{log}");
    assert!(
        log.contains("--freeze backbone with the frozen layers' biases training"),
        "{log}"
    );
    assert!(
        log.contains(&format!("from step {saved_after} on")),
        "resumed from step {saved_after}?\n{log}"
    );
    let status = control.fine_tune_status().unwrap();
    assert_eq!(status.step, status.total_steps);
    assert!(status.swaps >= 1, "{status:?}");
    assert!(status.serving_map.is_finite() && status.candidate_map.is_finite());
    assert!(
        status.step_us > 0 && status.load_per_batch_us > 0,
        "{status:?}"
    );
    assert!(control.stats().unwrap().weights_generation >= 2);
    assert_eq!(daemon.stop().code(), Some(0));

    // The swapped-in weights are served again after a restart; the finished job stays done.
    let daemon = Daemon::start(&args);
    assert!(daemon.log().contains("fine-tuned from"), "{}", daemon.log());
    assert_eq!(
        daemon.client().fine_tune_status().unwrap().state,
        FineTuneState::Idle
    );
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn a_stopped_fine_tune_checkpoints_and_is_not_resumed() {
    use fulcrum_board::protocol::{FineTuneParams, FineTuneState};
    let dir = tempfile::tempdir().unwrap();
    let data = fine_tune_data(dir.path());
    let state = dir.path().join("state");
    // The base's own data mixed in: the daemon's synthetic classes, another seed.
    let replay = dir.path().join("replay");
    let (st, _, err) = run(Command::new(FULCRUM)
        .args(["pack", "--synthetic", "48", "--seed", "23", "--out"])
        .arg(&replay));
    assert!(st.success(), "pack the replay data: {err}");
    let args = [
        "--state-dir",
        state.to_str().unwrap(),
        "--fine-tune-replay",
        replay.to_str().unwrap(),
    ];
    let daemon = Daemon::start(&args);
    let mut control = daemon.client();
    assert!(matches!(
        control.fine_tune_stop(),
        Err(Error::Remote {
            code: ErrorCode::FINE_TUNE_FAILED,
            ..
        })
    ));
    let params = FineTuneParams {
        max_steps: 0,
        epochs: 50,
        swap_always: false,
        freeze: fulcrum_board::protocol::FineTuneFreeze::Auto,
        train_biases: false,
    };
    control
        .fine_tune_start(data.to_str().unwrap(), params)
        .unwrap();
    wait_for("a few steps", &daemon, || {
        control.fine_tune_status().unwrap().step >= 3
    });
    control.fine_tune_stop().unwrap();
    wait_for("the stop", &daemon, || {
        control.fine_tune_status().unwrap().state == FineTuneState::Finished
    });
    let status = control.fine_tune_status().unwrap();
    assert!(status.step < status.total_steps, "{status:?}");
    let saved = fulcrum::model::Checkpoint::load(&state.join("fine-tune/run/last.safetensors"))
        .unwrap()
        .progress
        .step;
    assert_eq!(saved, u64::from(status.step));
    // Left to choose, without a memory budget, the daemon froze the backbone and said so.
    let log = daemon.log();
    assert!(log.contains("fine-tune: --freeze backbone"), "{log}");
    // Every batch held replay records (a quarter, at least one).
    assert!(
        log.contains("fine-tune: replay: ") && log.contains(&format!("from {}", replay.display())),
        "{log}"
    );
    assert_eq!(daemon.stop().code(), Some(0));
    let daemon = Daemon::start(&args);
    assert!(!daemon.log().contains("resuming"), "{}", daemon.log());
    assert_eq!(daemon.stop().code(), Some(0));
}
