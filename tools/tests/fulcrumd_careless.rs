//! `fulcrumd` against careless and hostile clients and operators: weights paths that are
//! devices, FIFOs or outside the folder clients may name; a second daemon on a live socket;
//! connections that never greet.

use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use fulcrum::serve::socket::{self, Received};
use fulcrum::serve::Error;
use fulcrum_board::protocol::{decode, ErrorCode, Message};
use nix::sys::signal::Signal;

mod common;

use common::daemon::{
    grey_frame, infer_lines, photos, run, status_mib, weights, without_ms, Daemon, Raw, FULCRUM,
    FULCRUMD, TIMEOUT,
};

/// Waits until the daemon's log has said `what` `count` times.
fn wait_for_log(daemon: &Daemon, what: &str, count: usize) {
    let started = Instant::now();
    while daemon.log().matches(what).count() < count {
        assert!(
            started.elapsed() < TIMEOUT,
            "no {what:?} in the log:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn reloads_of_devices_fifos_and_foreign_paths_are_refused_while_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("model.safetensors");
    std::fs::copy(weights(), &live).unwrap();
    let daemon = Daemon::start_with(&[], &[], &live);
    let mut client = daemon.client();
    let (desc, pixels) = grey_frame(80, 60);
    let before = client.infer_inline(desc, &pixels, 0).unwrap();
    let rss_before = status_mib(daemon.child.id(), "VmRSS:");

    // The weights path turned into a link to /dev/zero: refused by what the file is, at once,
    // without reading it (the build before read it until the machine ran out of memory).
    std::fs::remove_file(&live).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &live).unwrap();
    daemon.signal(Signal::SIGHUP);
    wait_for_log(&daemon, "reload refused", 1);
    assert!(
        daemon.log().contains("character device"),
        "{}",
        daemon.log()
    );
    assert!(
        status_mib(daemon.child.id(), "VmRSS:") < rss_before + 16.0,
        "the daemon grew from {rss_before} MiB to {} MiB",
        status_mib(daemon.child.id(), "VmRSS:")
    );

    // A FIFO with no writer: opening it does not wait, and it is refused.
    std::fs::remove_file(&live).unwrap();
    nix::unistd::mkfifo(&live, nix::sys::stat::Mode::S_IRWXU).unwrap();
    daemon.signal(Signal::SIGHUP);
    wait_for_log(&daemon, "reload refused", 2);
    assert!(daemon.log().contains("FIFO"), "{}", daemon.log());

    // Serving went on throughout, with the old weights.
    assert_eq!(
        client.infer_inline(desc, &pixels, 1).unwrap().boxes,
        before.boxes
    );
    assert_eq!(client.stats().unwrap().weights_generation, 1);

    // A client may not name a file unless the daemon has a folder for that.
    let elsewhere = dir.path().join("elsewhere.safetensors");
    std::fs::copy(weights(), &elsewhere).unwrap();
    match client.reload(Some(elsewhere.to_str().unwrap())) {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::RELOAD_FAILED);
            assert!(text.contains("--client-reload-dir"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    match client.reload(Some("/dev/zero")) {
        Err(Error::Remote { code, .. }) => assert_eq!(code, ErrorCode::RELOAD_FAILED),
        other => panic!("{other:?}"),
    }
    assert_eq!(client.stats().unwrap().weights_generation, 1);

    // SIGTERM still ends it promptly, with exit 0.
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn clients_name_files_only_inside_the_reload_folder() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = dir.path().join("allowed");
    std::fs::create_dir(&allowed).unwrap();
    let inside = allowed.join("new.safetensors");
    std::fs::copy(weights(), &inside).unwrap();
    let outside = dir.path().join("outside.safetensors");
    std::fs::copy(weights(), &outside).unwrap();
    // A link inside the folder that leads out of it.
    std::os::unix::fs::symlink(&outside, allowed.join("escape.safetensors")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", allowed.join("zero.safetensors")).unwrap();

    let daemon = Daemon::start(&["--client-reload-dir", allowed.to_str().unwrap()]);
    let mut client = daemon.client();
    for (path, says) in [
        (outside.clone(), "outside --client-reload-dir"),
        (
            allowed.join("escape.safetensors"),
            "outside --client-reload-dir",
        ),
        (
            allowed.join("../outside.safetensors"),
            "outside --client-reload-dir",
        ),
        (
            allowed.join("zero.safetensors"),
            "outside --client-reload-dir",
        ),
        (allowed.join("missing.safetensors"), "No such file"),
    ] {
        match client.reload(Some(path.to_str().unwrap())) {
            Err(Error::Remote { code, text }) => {
                assert_eq!(code, ErrorCode::RELOAD_FAILED, "{}", path.display());
                assert!(text.contains(says), "{}: {text}", path.display());
            }
            other => panic!("{}: {other:?}", path.display()),
        }
    }
    assert_eq!(client.stats().unwrap().weights_generation, 1);
    client.reload(Some(inside.to_str().unwrap())).unwrap();
    assert_eq!(client.stats().unwrap().weights_generation, 2);
    let (desc, pixels) = grey_frame(64, 64);
    client.infer_inline(desc, &pixels, 0).unwrap();
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn a_second_daemon_on_a_live_socket_is_refused_and_the_first_serves_on() {
    let first = Daemon::start(&[]);
    let (st, _, err) = run(Command::new(FULCRUMD)
        .arg("--weights")
        .arg(weights())
        .arg("--socket")
        .arg(&first.socket)
        .args(["--engine", "cpu"]));
    assert_eq!(st.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("pid {}", first.child.id())),
        "the refusal should name the first daemon: {err}"
    );
    // The socket is still the first daemon's, and it answers.
    let mut client = first.client();
    let (desc, pixels) = grey_frame(64, 48);
    client.infer_inline(desc, &pixels, 0).unwrap();
    let socket_path = first.socket.clone();
    assert_eq!(first.stop().code(), Some(0));
    assert!(!socket_path.exists(), "its own socket is removed at exit");
}

#[test]
fn a_daemon_leaves_a_socket_that_is_not_its_own() {
    let mut daemon = Daemon::start(&[]);
    // Someone deletes the socket (and its lock's meaning with it) and binds another there.
    std::fs::remove_file(&daemon.socket).unwrap();
    let other = socket::bind_listener(&daemon.socket, 4).unwrap();
    assert_eq!(daemon.terminate().code(), Some(0));
    let log = daemon.log();
    assert!(
        log.contains("no longer the socket this daemon bound"),
        "{log}"
    );
    assert!(
        socket::connect_seqpacket(&daemon.socket).is_ok(),
        "the other socket must survive the daemon's exit"
    );
    drop(other);
}

/// Waits until the daemon closes `raw`, and returns the error texts it sent before.
fn texts_until_closed(raw: &mut Raw) -> Vec<String> {
    let mut texts = Vec::new();
    let started = Instant::now();
    loop {
        match socket::recv_packet(raw.fd.as_fd(), &mut raw.buf, &mut raw.cmsg) {
            Ok(Received::Packet { len, .. }) => match decode(&raw.buf[..len]) {
                Ok((_, Message::Error(e))) => texts.push(e.text.to_string()),
                other => panic!("expected an error before closing, got {other:?}"),
            },
            Ok(Received::Closed) | Err(_) => return texts,
            Ok(Received::Empty | Received::Oversized) => {}
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "a silent connection was left open"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connections_that_never_greet_cannot_lock_clients_out() {
    let daemon = Daemon::start(&["--max-clients", "4", "--hello-timeout", "600"]);
    // Four silent connections, as many as there are slots.
    let mut silent: Vec<Raw> = (0..4).map(|_| Raw::connect(&daemon.socket)).collect();
    std::thread::sleep(Duration::from_millis(100));
    // A real client still gets in (the oldest silent connection makes room).
    let mut client = daemon.client();
    let (desc, pixels) = grey_frame(64, 48);
    client.infer_inline(desc, &pixels, 0).unwrap();
    // Past the deadline every silent connection is closed, each with a reason.
    let texts: Vec<String> = silent.iter_mut().flat_map(texts_until_closed).collect();
    assert_eq!(texts.len(), 4, "{texts:?}");
    assert!(texts.iter().any(|t| t.contains("make room")), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.contains("no Hello within")),
        "{texts:?}"
    );
    let log = daemon.log();
    assert!(log.contains("no Hello within"), "{log}");
    // The real client is served on, and new ones get in.
    client.infer_inline(desc, &pixels, 1).unwrap();
    let mut second = daemon.client();
    second.infer_inline(desc, &pixels, 0).unwrap();
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn one_uid_cannot_hold_every_slot() {
    // Three quarters of 4 slots: a uid's fourth greeted connection is refused.
    let daemon = Daemon::start(&["--max-clients", "4"]);
    let clients: Vec<_> = (0..3).map(|_| daemon.client()).collect();
    match fulcrum::serve::client::Client::connect(&daemon.socket) {
        Err(Error::Remote { code, text }) => {
            assert_eq!(code, ErrorCode::BUSY);
            assert!(text.contains("its limit"), "{text}");
        }
        Ok(_) => panic!("a fourth connection of one uid was let in"),
        Err(e) => panic!("{e}"),
    }
    drop(clients);
    let (st, _, err) = run(Command::new(FULCRUMD)
        .arg("--weights")
        .arg(weights())
        .args(["--socket", "/tmp/never-bound.sock"])
        .args(["--max-clients", "4", "--max-clients-per-uid", "5"]));
    assert_eq!(st.code(), Some(2));
    assert!(err.contains("--max-clients-per-uid 5"), "{err}");
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn a_request_threshold_below_the_daemons_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let photos = photos(dir.path(), 3);
    // The daemon at its default threshold, 0.3; the barely trained model scores below it.
    let daemon = Daemon::start(&["--threshold", "0.3"]);
    let expected = infer_lines(&photos);
    let (st, out, err) = run(Command::new(FULCRUM)
        .arg("client")
        .arg("--socket")
        .arg(&daemon.socket)
        .args(["--threshold", "0.05"])
        .arg(&photos));
    assert!(st.success(), "{err}");
    assert_eq!(
        without_ms(&out),
        expected,
        "client at 0.05 differs from infer"
    );

    // The reply says what was applied: the request's threshold, else the daemon's.
    let mut client = daemon.client();
    let (mut desc, pixels) = grey_frame(96, 64);
    desc.min_score = 0.01;
    let low = client.infer_inline(desc, &pixels, 0).unwrap();
    assert_eq!((low.min_score, low.nms_iou), (0.01, 0.6));
    assert!(low.boxes.iter().all(|d| d.score >= 0.01));
    desc.min_score = 0.0;
    let default = client.infer_inline(desc, &pixels, 1).unwrap();
    assert_eq!(default.min_score, 0.3);
    assert!(default.boxes.iter().all(|d| d.score >= 0.3));
    assert!(low.boxes.len() > default.boxes.len(), "{low:?}");
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn a_reload_that_changes_the_classes_is_seen_by_connected_clients() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("model.safetensors");
    std::fs::copy(weights(), &live).unwrap();
    let daemon = Daemon::start_with(&[], &[], &live);
    let mut client = daemon.client();
    let before = client.classes().unwrap();
    let (desc, pixels) = grey_frame(64, 64);
    let first = client.infer_inline(desc, &pixels, 0).unwrap();
    assert_eq!(
        first.weights_generation,
        client.welcome().weights_generation
    );

    // The same model with its classes renamed and reordered, as a retrained one would be.
    let mut renamed = fulcrum::model::Checkpoint::load(weights()).unwrap();
    renamed.classes = before.iter().rev().map(|c| format!("new-{c}")).collect();
    let staged = dir.path().join("staged.safetensors");
    renamed.save(&staged).unwrap();
    std::fs::rename(&staged, &live).unwrap();
    daemon.signal(Signal::SIGHUP);
    let started = Instant::now();
    let reply = loop {
        let reply = client.infer_inline(desc, &pixels, 1).unwrap();
        if reply.weights_generation != first.weights_generation {
            break reply;
        }
        assert!(started.elapsed() < TIMEOUT, "{}", daemon.log());
        std::thread::sleep(Duration::from_millis(20));
    };
    // The reply says the weights changed; greeting again tells what they are now.
    assert_eq!(reply.weights_generation, first.weights_generation + 1);
    assert_ne!(
        client.welcome().weights_generation,
        reply.weights_generation
    );
    let welcome = *client.refresh().unwrap();
    assert_eq!(welcome.weights_generation, reply.weights_generation);
    assert_eq!(client.classes().unwrap(), renamed.classes);
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn metrics_are_written_for_prometheus_while_serving() {
    let dir = tempfile::tempdir().unwrap();
    let prom = dir.path().join("fulcrumd.prom");
    let daemon = Daemon::start(&["--metrics", prom.to_str().unwrap(), "--metrics-every", "1"]);
    let mut client = daemon.client();
    let (desc, pixels) = grey_frame(64, 48);
    for i in 0..3 {
        client.infer_inline(desc, &pixels, i).unwrap();
    }
    // A reload naming a file, which this daemon does not allow: an error of that kind.
    assert!(client.reload(Some("/etc/passwd")).is_err());
    let started = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&prom).unwrap_or_default();
        if text.contains("fulcrumd_requests_total 3") && text.contains("reload_failed") {
            break text;
        }
        assert!(started.elapsed() < TIMEOUT, "{text}\n{}", daemon.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    for want in [
        "fulcrumd_errors_total{kind=\"reload_failed\"} 1",
        "fulcrumd_request_seconds_count 3",
        "fulcrumd_forward_seconds_count 3",
        "fulcrumd_frame_pass_seconds_count 3",
        "fulcrumd_clients 1",
        "fulcrumd_weights_generation 1",
    ] {
        assert!(text.lines().any(|l| l == want), "no {want:?} in\n{text}");
    }
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let planned = value("fulcrumd_memory_planned_bytes");
    let resident = value("fulcrumd_memory_resident_bytes");
    assert!(
        planned > 100e3 && resident > planned,
        "{planned} {resident}"
    );
    assert_eq!(daemon.stop().code(), Some(0));
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["fulcrumd.prom"]);
}

#[test]
fn crops_come_back_in_frame_pixels_and_bad_crops_are_refused() {
    use fulcrum::pack::letterbox::decode_image;
    use fulcrum::serve::frame::encode_frame;
    use fulcrum_board::protocol::{Crop, Frame, FrameDesc, FrameSource, PixelFormat};

    let dir = tempfile::tempdir().unwrap();
    let photo = std::fs::read_dir(photos(dir.path(), 1))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let image = decode_image(&photo.path()).unwrap();
    let whole = image::imageops::crop_imm(&image, 0, 0, 240, 180).to_image();
    let (x, y, w, h) = (40u16, 30u16, 160u16, 120u16);
    let part = image::imageops::crop_imm(&whole, x.into(), y.into(), w.into(), h.into()).to_image();
    let daemon = Daemon::start(&["--threshold", "0.05"]);
    let mut client = daemon.client();
    let frame = |rgb: &image::RgbImage, format| {
        let (fw, fh) = (rgb.width() as u16, rgb.height() as u16);
        let desc = FrameDesc::packed(format, FrameSource::Inline, fw, fh).unwrap();
        let mut bytes = vec![0u8; desc.length as usize];
        encode_frame(rgb.as_raw(), fw, fh, format, 0, &mut bytes);
        (desc, bytes)
    };
    for format in [PixelFormat::Rgb8, PixelFormat::Bgra8] {
        let (desc, bytes) = frame(&part, format);
        let alone = client.infer_inline(desc, &bytes, 0).unwrap();
        let (mut desc, bytes) = frame(&whole, format);
        desc.crop = Crop {
            x,
            y,
            width: w,
            height: h,
        };
        let cropped = client.infer_inline(desc, &bytes, 1).unwrap();
        assert!(
            !alone.boxes.is_empty(),
            "the model finds nothing to compare"
        );
        assert_eq!(alone.boxes.len(), cropped.boxes.len(), "{}", format.name());
        for (a, c) in alone.boxes.iter().zip(&cropped.boxes) {
            assert_eq!(a.class, c.class);
            let shifted = [
                a.x0 + f32::from(x),
                a.y0 + f32::from(y),
                a.x1 + f32::from(x),
                a.y1 + f32::from(y),
            ];
            for (s, g) in shifted.iter().zip([c.x0, c.y0, c.x1, c.y1]) {
                assert!(
                    (s - g).abs() <= 0.5,
                    "{}: {a:?} + ({x}, {y}) vs {c:?}",
                    format.name()
                );
            }
            // Inside the crop, in frame pixels.
            assert!(c.x0 >= f32::from(x) && c.x1 <= f32::from(x + w), "{c:?}");
            assert!(c.y0 >= f32::from(y) && c.y1 <= f32::from(y + h), "{c:?}");
        }
    }

    // A crop reaching outside the frame: an error reply that says so, counted, and the
    // connection and every other client served on.
    let mut raw = Raw::connect(&daemon.socket);
    raw.hello();
    let (desc, bytes) = frame(&whole, PixelFormat::Rgb8);
    let good = common::daemon::encode(
        &Message::Infer(Frame {
            desc,
            pixels: &bytes,
        }),
        7,
    );
    let mut bad = good.clone();
    // The crop (32 bytes into the description: x, y, width, height): x 235 + width 10 > 240.
    let at = fulcrum_board::protocol::HEADER_LEN + 32;
    for (i, v) in [235u16, 0, 10, 10].into_iter().enumerate() {
        bad[at + 2 * i..at + 2 * i + 2].copy_from_slice(&v.to_le_bytes());
    }
    raw.send(&bad);
    let reply = raw.recv().unwrap();
    let Message::Error(e) = decode(&reply).unwrap().1 else {
        panic!("expected an error reply")
    };
    assert_eq!(e.code, ErrorCode::BAD_FRAME);
    assert!(e.text.contains("crop"), "{}", e.text);
    let errors_before = client.stats().unwrap().errors;
    assert!(errors_before >= 1);
    raw.send(&good);
    assert!(matches!(
        decode(&raw.recv().unwrap()).unwrap().1,
        Message::Detections(_)
    ));
    assert!(client.infer_inline(desc, &bytes, 9).is_ok());
    assert_eq!(daemon.stop().code(), Some(0));
}
