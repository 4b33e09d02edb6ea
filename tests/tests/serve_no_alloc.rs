//! After warm-up, `fulcrumd`'s serving loop allocates nothing per request (everything is
//! planned up front): inline and ring frames in every pixel format, whole and cropped, in
//! every colour space, stats, health and malformed messages, counted on every thread
//! but this test's own, which plays the firmware. Its own binary, with one test, so that
//! nothing else allocates meanwhile; `FULCRUM_ALLOC_TRACE=1 … -- --nocapture` shows where.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fulcrum::compute::exec::{EngineChoice, ExecOptions};
use fulcrum::serve::client::Client;
use fulcrum::serve::frame::encode_frame;
use fulcrum::serve::{Control, Notifier, ServeConfig, Server};
use fulcrum::train::{self, RunOptions};
use fulcrum_board::protocol::{ColourSpace, Crop, FrameDesc, FrameSource, PixelFormat};
use fulcrum_tests::alloc::{allocations, ignore_this_thread, trace, Counting};
use fulcrum_tests::*;

#[global_allocator]
static GLOBAL: Counting = Counting;

fn weights(dir: &Path) -> std::path::PathBuf {
    let data = pack_synthetic(dir, 32, 128);
    let out = dir.join("run");
    let options = RunOptions {
        exec: ExecOptions {
            engine: EngineChoice::Cpu,
            threads: 1,
            ..ExecOptions::default()
        },
        ..RunOptions::default()
    };
    train::train(
        &small_training(&data, &out, 1),
        &options,
        &AtomicBool::new(false),
        &mut train::Quiet,
    )
    .expect("training runs");
    out.join(train::CHECKPOINT_FILE)
}

/// A frame of `format` from a smooth synthetic picture.
fn frame(format: PixelFormat, w: u16, h: u16) -> (FrameDesc, Vec<u8>) {
    let rgb: Vec<u8> = (0..u32::from(h))
        .flat_map(|y| (0..u32::from(w)).flat_map(move |x| [(x * 2) as u8, (y * 3) as u8, 90]))
        .collect();
    let desc = FrameDesc::packed(format, FrameSource::Inline, w, h).unwrap();
    let mut bytes = vec![0; desc.length as usize];
    encode_frame(&rgb, w, h, format, 0, &mut bytes);
    (desc, bytes)
}

#[test]
fn serving_allocates_nothing_per_request_after_warm_up() {
    let dir = tempfile::tempdir().unwrap();
    let weights = weights(dir.path());
    let socket = dir.path().join("fulcrumd.sock");
    let mut config = ServeConfig::new(
        socket.clone(),
        weights,
        ExecOptions {
            engine: EngineChoice::Cpu,
            threads: 2,
            ..ExecOptions::default()
        },
    );
    config.max_frame_side = 640;
    config.threshold = 0.01; // many detections: the reply path is exercised in full
                             // Able to fine-tune (no job runs): the serving loop's checks for swaps allocate nothing.
    config.state_dir = Some(dir.path().join("state"));
    let mut server = Server::start(config, Notifier::default()).expect("start");
    let control = Arc::new(Control::new());
    let stop = control.clone();
    let serving = std::thread::Builder::new()
        .name("fulcrumd".into())
        .spawn(move || server.run(&control))
        .unwrap();

    // From here on this thread is the firmware: its own allocations are not counted.
    ignore_this_thread();
    let mut client = Client::connect(&socket).unwrap();
    client.attach_ring(1 << 20).unwrap();
    let mut frames: Vec<_> = [
        (PixelFormat::Rgb8, 160, 120),
        (PixelFormat::Bgr8, 128, 128),
        (PixelFormat::Rgba8, 96, 200),
        (PixelFormat::Bgra8, 240, 180),
        (PixelFormat::Gray8, 200, 100),
        (PixelFormat::Yuyv, 320, 240),
        (PixelFormat::Nv12, 640, 480),
    ]
    .into_iter()
    .map(|(f, w, h)| frame(f, w, h))
    .collect();
    // The same frames again, each cropped (odd origins: chroma windows split samples) and
    // in another colour space.
    for k in 0..frames.len() {
        let (mut desc, bytes) = frames[k].clone();
        desc.crop = Crop {
            x: 3,
            y: 5,
            width: desc.width / 2 + 1,
            height: desc.height / 3 + 1,
        };
        desc.colour = ColourSpace::ALL[k % ColourSpace::ALL.len()];
        frames.push((desc, bytes));
    }
    let mut bad = frames[0].0;
    bad.stride = 7; // shorter than a row: an error reply
    let requests = |client: &mut Client, rounds: usize| {
        let mut boxes = 0;
        for round in 0..rounds {
            for (desc, bytes) in &frames {
                let reply = if desc.length <= client.welcome().max_inline_bytes && round % 2 == 0 {
                    client.infer_inline(*desc, bytes, round as u64).unwrap()
                } else {
                    client.write_ring(0, bytes).unwrap();
                    client
                        .infer_ring(FrameDesc { offset: 0, ..*desc }, round as u64)
                        .unwrap()
                };
                boxes += reply.boxes.len();
            }
            client.stats().unwrap();
            client.health().unwrap();
            assert!(client.infer_inline(bad, &frames[0].1, 0).is_err());
        }
        boxes
    };
    requests(&mut client, 3);
    let before = allocations();
    trace(5);
    let boxes = requests(&mut client, 20);
    trace(0);
    let during = allocations() - before;
    stop.stop.store(true, Ordering::SeqCst);
    serving.join().unwrap().unwrap();
    assert!(boxes > 0, "no detections: the reply path was not exercised");
    assert!(allocations() > 0, "the counting allocator is not installed");
    assert_eq!(
        during, 0,
        "{during} allocations while serving 280 frames, 40 control requests and 20 bad ones \
         after warm-up; rerun with FULCRUM_ALLOC_TRACE=1 -- --nocapture to see where"
    );
}
