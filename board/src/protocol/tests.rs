//! Layout, error and property tests of the protocol (the fuzz target under `board/fuzz` runs
//! the same decoder on arbitrary bytes).

extern crate std;
use super::*;
use std::vec;
use std::vec::Vec;

const DETS: [Detection; 2] = [
    Detection {
        class: 1,
        score: 1.0,
        x0: 3.0,
        y0: 4.5,
        x1: 60.25,
        y1: 127.0,
    },
    Detection {
        class: 0x0102,
        score: 0.5,
        x0: 0.0,
        y0: -0.0,
        x1: 1.0,
        y1: 2.0,
    },
];

fn encode(m: &Message<'_>, seq: u32, ts: u64) -> Vec<u8> {
    let mut buf = vec![0u8; m.encoded_len()];
    let n = m.encode(seq, ts, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// One message of every kind, with non-default field values.
fn samples<'a>(pixels: &'a [u8]) -> Vec<Message<'a>> {
    let inline = FrameDesc::packed(PixelFormat::Rgb8, FrameSource::Inline, 4, 2).unwrap();
    assert_eq!(inline.length as usize, pixels.len());
    let mut ring = FrameDesc::packed(PixelFormat::Nv12, FrameSource::Ring, 640, 480).unwrap();
    ring.offset = 1 << 20;
    ring.stride = 704;
    ring.length = PixelFormat::Nv12.frame_len(640, 480, 704).unwrap();
    ring.max_detections = 5;
    ring.min_score = 0.25;
    vec![
        Message::Hello(Hello {
            schema_hash: SCHEMA_HASH,
        }),
        Message::Welcome(Welcome {
            schema_hash: SCHEMA_HASH,
            input_width: 128,
            input_height: 96,
            classes: 2,
            max_frame_side: 1920,
            max_inline_bytes: MAX_INLINE_BYTES,
            max_detections: 100,
            engine: EngineKind::Vulkan,
            weights_generation: 3,
        }),
        Message::Infer(Frame {
            desc: inline,
            pixels,
        }),
        Message::Infer(Frame {
            desc: ring,
            pixels: &[],
        }),
        Message::AttachRing(AttachRing { len: 8 << 20 }),
        Message::Detections(DetectionsReply {
            frame_width: 640,
            frame_height: 480,
            engine_us: 512,
            total_us: 700,
            weights_generation: 3,
            min_score: 0.05,
            nms_iou: 0.6,
            detections: DetectionList::Records(&DETS),
        }),
        Message::StatsRequest,
        Message::Stats(Stats {
            requests: u64::MAX - 1,
            errors: 2,
            refused: 3,
            clients: 4,
            p50_us: 5,
            p99_us: 6,
            p999_us: 7,
            forward_us: 8,
            uptime_s: 9,
            weights_generation: 10,
        }),
        Message::HealthRequest,
        Message::Health(Health {
            state: ServiceState::Reloading,
            engine: EngineKind::Cpu,
            uptime_s: 100,
            weights_generation: 2,
            since_progress_ms: 7,
        }),
        Message::Reload {
            path: "/var/lib/fulcrumd/new.safetensors",
        },
        Message::Reload { path: "" },
        Message::FineTuneStart {
            params: FineTuneParams {
                max_steps: 500,
                epochs: 3,
                swap_always: true,
                freeze: FineTuneFreeze::Backbone,
                train_biases: true,
            },
            path: "data/robot-val",
        },
        Message::FineTuneStop,
        Message::FineTuneStatusRequest,
        Message::FineTuneStatus(FineTuneStatus {
            state: FineTuneState::Running,
            epoch: 2,
            step: 40,
            total_steps: 500,
            loss: 1.25,
            serving_map: 0.5,
            candidate_map: 0.625,
            swaps: 1,
            load_per_batch_us: 1200,
            step_us: 3400,
        }),
        Message::Ack(Kind::Reload),
        Message::Error(ErrorReply::new(
            ErrorCode::BAD_FRAME,
            "frame 3: stride 10 < row 12",
        )),
        Message::ClassesRequest,
        Message::Classes {
            names: "raccoon\ntraffic light",
        },
        Message::Classes { names: "" },
    ]
}

#[test]
fn every_kind_round_trips() {
    let pixels: Vec<u8> = (0..24).collect();
    let samples = samples(&pixels);
    for kind in Kind::ALL {
        assert!(
            samples.iter().any(|m| m.kind() == kind),
            "{kind:?} has no sample"
        );
    }
    for (i, m) in samples.iter().enumerate() {
        let bytes = encode(m, 1000 + i as u32, 77 + i as u64);
        let (header, back) = decode(&bytes).unwrap_or_else(|e| panic!("{m:?}: {e}"));
        assert_eq!(back, *m);
        assert_eq!(header.kind, m.kind());
        assert_eq!(header.sequence, 1000 + i as u32);
        assert_eq!(header.timestamp_us, 77 + i as u64);
        assert_eq!(header.body_len as usize, bytes.len() - HEADER_LEN);
        // Decoded messages re-encode to the same bytes.
        assert_eq!(encode(&back, 1000 + i as u32, 77 + i as u64), bytes);
    }
}

#[test]
fn header_and_detection_layouts_are_little_endian() {
    let m = Message::Detections(DetectionsReply {
        frame_width: 0x0102,
        frame_height: 0x0304,
        engine_us: 0x0506_0708,
        total_us: 0x090A_0B0C,
        weights_generation: 0x0D0E_0F10,
        min_score: 0.25,
        nms_iou: 1.0,
        detections: DetectionList::Records(&DETS[1..]),
    });
    let bytes = encode(&m, 0xDEAD_BEEF, 0x1122_3344_5566_7788);
    assert_eq!(&bytes[..4], b"FULC");
    assert_eq!(&bytes[4..8], &[4, 0, 5, 0]);
    assert_eq!(&bytes[8..12], &[0xEF, 0xBE, 0xAD, 0xDE]);
    assert_eq!(&bytes[12..16], &[52, 0, 0, 0]);
    assert_eq!(
        &bytes[16..24],
        &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]
    );
    assert_eq!(
        &bytes[24..44],
        &[1, 0, 2, 1, 4, 3, 0, 0, 8, 7, 6, 5, 0xC, 0xB, 0xA, 9, 0x10, 0xF, 0xE, 0xD]
    );
    let f = |v: f32| v.to_le_bytes();
    assert_eq!(&bytes[44..48], &f(0.25));
    assert_eq!(&bytes[48..52], &f(1.0));
    let mut det = vec![2, 1, 0, 0];
    for v in [0.5, 0.0, -0.0, 1.0, 2.0] {
        det.extend_from_slice(&f(v));
    }
    assert_eq!(&bytes[52..], &det[..]);
}

#[test]
fn reserved_bytes_are_written_zero_and_ignored() {
    let m = Message::Ack(Kind::FineTuneStop);
    let mut bytes = encode(&m, 1, 2);
    assert_eq!(&bytes[HEADER_LEN + 2..], &[0, 0]);
    bytes[HEADER_LEN + 3] = 0xFF;
    assert_eq!(decode(&bytes).unwrap().1, m);
}

#[test]
fn each_decode_error() {
    let pixels = [7u8; 24];
    let frame = samples(&pixels)[2];
    let good = encode(&frame, 5, 6);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        decode(&b).map(|_| ())
    };

    assert_eq!(decode(&good[..23]).err(), Some(WireError::Truncated));
    assert_eq!(
        decode(&good[..good.len() - 1]).err(),
        Some(WireError::Truncated)
    );
    assert_eq!(with(&|b| b.push(0)), Err(WireError::BadLength));
    assert_eq!(with(&|b| b[0] ^= 1), Err(WireError::BadMagic));
    assert_eq!(with(&|b| b[4] = 1), Err(WireError::BadVersion));
    assert_eq!(with(&|b| b[6] = 0), Err(WireError::BadKind));
    assert_eq!(with(&|b| b[6] = 19), Err(WireError::BadKind));
    assert_eq!(
        with(&|b| b[12..16].copy_from_slice(&u32::MAX.to_le_bytes())),
        Err(WireError::TooLarge)
    );
    // Body fields: pixel format, source, sizes, inline offset.
    let desc = HEADER_LEN;
    assert_eq!(with(&|b| b[desc] = 9), Err(WireError::BadPixelFormat));
    assert_eq!(with(&|b| b[desc + 1] = 2), Err(WireError::BadValue));
    assert_eq!(with(&|b| b[desc + 2] = 5), Err(WireError::BadFrameSize));
    assert_eq!(with(&|b| b[desc + 16] = 1), Err(WireError::BadFrameSize));
    // The colour space and a crop wider than the frame.
    assert_eq!(with(&|b| b[desc + 28] = 4), Err(WireError::BadValue));
    assert_eq!(
        with(&|b| {
            b[desc + 36] = 0xFF;
            b[desc + 38] = 1;
        }),
        Err(WireError::BadCrop)
    );
    // A frame larger than announced: pixels past the description's length.
    assert_eq!(
        with(&|b| {
            b.push(0);
            b[12] += 1;
        }),
        Err(WireError::BadLength)
    );
    // A length that says more than the packet holds.
    assert_eq!(with(&|b| b[12] += 1), Err(WireError::Truncated));
    // The header's length cut short: the body's own fields run past it.
    let hello = encode(&Message::Hello(Hello { schema_hash: 1 }), 0, 0);
    let mut short = hello[..HEADER_LEN + 4].to_vec();
    short[12] = 4;
    assert_eq!(decode(&short).err(), Some(WireError::BadLength));

    // An inline frame over the inline limit, sized consistently.
    let big = FrameDesc::packed(PixelFormat::Rgb8, FrameSource::Inline, 300, 300).unwrap();
    let mut b = vec![0u8; HEADER_LEN + FrameDesc::LEN];
    Header {
        kind: Kind::Infer,
        sequence: 0,
        body_len: FrameDesc::LEN as u32,
        timestamp_us: 0,
    }
    .write(&mut Writer::new(&mut b))
    .unwrap();
    big.write(&mut Writer::new(&mut b[HEADER_LEN..])).unwrap();
    assert_eq!(decode(&b).err(), Some(WireError::TooLarge));
}

#[test]
fn text_and_enum_fields_are_checked() {
    fn err(text: &str) -> Message<'_> {
        Message::Error(ErrorReply::new(ErrorCode::INTERNAL, text))
    }
    let mut bytes = encode(&err("abc"), 0, 0);
    let text_at = HEADER_LEN + 4;
    bytes[text_at] = 0xFF; // not UTF-8
    assert_eq!(decode(&bytes).err(), Some(WireError::BadText));
    bytes[text_at] = 0; // NUL
    assert_eq!(decode(&bytes).err(), Some(WireError::BadText));

    // Long text is cut at a character boundary, never mid-character.
    let long: std::string::String = "é".repeat(MAX_TEXT);
    let ErrorReply { text, .. } = ErrorReply::new(ErrorCode::INTERNAL, &long);
    assert_eq!(text.len(), MAX_TEXT);
    let odd = std::format!("x{long}");
    assert_eq!(
        ErrorReply::new(ErrorCode::INTERNAL, &odd).text.len(),
        MAX_TEXT - 1
    );
    assert_eq!(
        err("").encode(0, 0, &mut [0; 64]).map(|_| ()),
        Ok(()),
        "empty text is fine"
    );
    // Encoding refuses what decoding would.
    let long_path = "p".repeat(MAX_PATH + 1);
    let m = Message::Reload { path: &long_path };
    assert_eq!(m.encode(0, 0, &mut [0; 2048]), Err(WireError::BadText));
    let m = Message::Reload { path: "a\0b" };
    assert_eq!(m.encode(0, 0, &mut [0; 64]), Err(WireError::BadText));

    // Unknown flag bits, states and engines.
    let start = Message::FineTuneStart {
        params: FineTuneParams {
            max_steps: 1,
            epochs: 1,
            swap_always: false,
            freeze: FineTuneFreeze::Auto,
            train_biases: false,
        },
        path: "d",
    };
    // The choices' table is in wire-value order (the decoder looks choices up by value).
    for (value, freeze) in FineTuneFreeze::ALL.into_iter().enumerate() {
        assert_eq!(freeze as usize, value);
        assert_eq!(FineTuneFreeze::from_u8(value as u8), Some(freeze));
    }
    assert_eq!(FineTuneFreeze::from_u8(5), None);
    // Only the choices that name layers to freeze leave biases to train.
    let freezing = FineTuneFreeze::ALL.map(FineTuneFreeze::freezes_layers);
    assert_eq!(freezing, [false, false, true, true, true]);
    // Every choice, with and without biases, comes back as it went; early (4) is the one
    // that sets the freeze's third bit (bit 4), which the flags before it did not have.
    for freeze in FineTuneFreeze::ALL {
        for train_biases in [false, true] {
            let params = FineTuneParams {
                max_steps: 1,
                epochs: 1,
                swap_always: true,
                freeze,
                train_biases,
            };
            let m = Message::FineTuneStart { params, path: "d" };
            let bytes = encode(&m, 0, 0);
            let high = bytes[HEADER_LEN + 8] & 16 != 0;
            assert_eq!(high, freeze == FineTuneFreeze::Early, "{}", freeze.name());
            assert_eq!(decode(&bytes).unwrap().1, m);
        }
    }
    let mut bytes = encode(&start, 0, 0);
    bytes[HEADER_LEN + 8] = 32;
    assert_eq!(decode(&bytes).err(), Some(WireError::BadValue));
    // The third bit with low bits that make 5, 6 or 7: no such choice.
    for low in 1..=3 {
        bytes[HEADER_LEN + 8] = 16 | low << 1;
        assert_eq!(decode(&bytes).err(), Some(WireError::BadValue), "{low}");
    }
    let health = Message::Health(Health {
        state: ServiceState::Ready,
        engine: EngineKind::Cpu,
        uptime_s: 0,
        weights_generation: 0,
        since_progress_ms: 0,
    });
    let mut bytes = encode(&health, 0, 0);
    bytes[HEADER_LEN] = 4;
    assert_eq!(decode(&bytes).err(), Some(WireError::BadValue));
    bytes[HEADER_LEN] = 1;
    bytes[HEADER_LEN + 1] = 0;
    assert_eq!(decode(&bytes).err(), Some(WireError::BadValue));
    // A class count that disagrees with the names.
    let mut bytes = encode(&Message::Classes { names: "a\nb" }, 0, 0);
    bytes[HEADER_LEN] = 3;
    assert_eq!(decode(&bytes).err(), Some(WireError::BadLength));
    // An ack of a kind that does not exist.
    let mut bytes = encode(&Message::Ack(Kind::Hello), 0, 0);
    bytes[HEADER_LEN] = 99;
    assert_eq!(decode(&bytes).err(), Some(WireError::BadKind));
}

#[test]
fn encoding_errors() {
    let m = Message::Hello(Hello { schema_hash: 0 });
    assert_eq!(m.encode(0, 0, &mut [0; 31]), Err(WireError::BufferTooSmall));
    let many = vec![Detection::default(); usize::from(MAX_DETECTIONS) + 1];
    let m = Message::Detections(DetectionsReply {
        frame_width: 1,
        frame_height: 1,
        engine_us: 0,
        total_us: 0,
        weights_generation: 1,
        min_score: 0.3,
        nms_iou: 0.6,
        detections: DetectionList::Records(&many),
    });
    assert_eq!(m.encode(0, 0, &mut vec![0; 20000]), Err(WireError::TooMany));
    // Pixels that disagree with the description.
    let desc = FrameDesc::packed(PixelFormat::Gray8, FrameSource::Inline, 2, 2).unwrap();
    let m = Message::Infer(Frame {
        desc,
        pixels: &[0; 5],
    });
    assert_eq!(m.encode(0, 0, &mut [0; 128]), Err(WireError::BadLength));
    let ring = FrameDesc {
        source: FrameSource::Ring,
        ..desc
    };
    let m = Message::Infer(Frame {
        desc: ring,
        pixels: &[0; 4],
    });
    assert_eq!(m.encode(0, 0, &mut [0; 128]), Err(WireError::BadLength));
}

#[test]
fn error_mapping_for_replies() {
    assert_eq!(WireError::BadVersion.code(), ErrorCode::UNSUPPORTED_VERSION);
    assert_eq!(WireError::BadOffset.code(), ErrorCode::BAD_FRAME);
    assert_eq!(WireError::TooLarge.code(), ErrorCode::TOO_LARGE);
    assert_eq!(WireError::BadLength.code(), ErrorCode::MALFORMED);
    assert!(WireError::BadMagic.closes_connection());
    assert!(!WireError::BadFrameSize.closes_connection());
    assert_eq!(ErrorCode(999).name(), "unknown error");
    assert_eq!(std::format!("{}", ErrorCode::BUSY), "busy (8)");
    assert!(Kind::Infer.is_request() && !Kind::Detections.is_request());
}

/// xorshift64*: a seeded generator, so a failing case prints a seed to replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// A random valid frame description with sides up to `max_side`.
fn random_desc(rng: &mut Rng, max_side: u16) -> FrameDesc {
    let format = rng.pick(&PixelFormat::ALL);
    let even = |v: u64| ((v / 2).max(1) * 2) as u16;
    let (w, h) = (
        even(1 + rng.below(u64::from(max_side))),
        even(1 + rng.below(u64::from(max_side))),
    );
    let stride = match rng.below(2) {
        0 => 0,
        _ => format.row_bytes(w) + rng.below(64) as u32,
    };
    let source = rng.pick(&[FrameSource::Inline, FrameSource::Ring]);
    FrameDesc {
        format,
        source,
        width: w,
        height: h,
        max_detections: rng.below(100) as u16,
        stride,
        length: format.frame_len(w, h, stride).unwrap(),
        offset: match source {
            FrameSource::Inline => 0,
            FrameSource::Ring => rng.next() >> 20,
        },
        min_score: rng.below(1001) as f32 / 1000.0,
        colour: rng.pick(&ColourSpace::ALL),
        crop: match rng.below(2) {
            0 => Crop::WHOLE,
            _ => {
                let x = rng.below(u64::from(w)) as u16;
                let y = rng.below(u64::from(h)) as u16;
                Crop {
                    x,
                    y,
                    width: 1 + rng.below(u64::from(w - x)) as u16,
                    height: 1 + rng.below(u64::from(h - y)) as u16,
                }
            }
        },
    }
}

#[test]
fn random_frames_round_trip() {
    let mut rng = Rng(0x5EED_0001);
    let pixels = vec![0xA5u8; MAX_INLINE_BYTES as usize];
    for case in 0..2000 {
        let desc = random_desc(&mut rng, 96);
        let n = match desc.source {
            FrameSource::Inline => desc.length as usize,
            FrameSource::Ring => 0,
        };
        let m = Message::Infer(Frame {
            desc,
            pixels: &pixels[..n],
        });
        let bytes = encode(&m, case, rng.next());
        assert_eq!(decode(&bytes).unwrap().1, m, "case {case}: {desc:?}");
        // Any ring range check agrees with plain arithmetic.
        let ring_len = rng.next() >> 40;
        let fits = desc.offset + u64::from(desc.length) <= ring_len;
        assert_eq!(desc.ring_range(ring_len).is_ok(), fits, "case {case}");
    }
}

#[test]
fn random_detections_round_trip() {
    let mut rng = Rng(0x5EED_0002);
    for case in 0..500 {
        let dets: Vec<Detection> = (0..rng.below(u64::from(MAX_DETECTIONS) + 1))
            .map(|_| {
                let mut f = || (rng.next() >> 40) as f32 / 256.0;
                Detection {
                    class: f() as u16,
                    score: f() / 65536.0,
                    x0: f(),
                    y0: f(),
                    x1: f(),
                    y1: f(),
                }
            })
            .collect();
        let m = Message::Detections(DetectionsReply {
            frame_width: rng.next() as u16,
            frame_height: rng.next() as u16,
            engine_us: rng.next() as u32,
            total_us: rng.next() as u32,
            weights_generation: rng.next() as u32,
            min_score: (rng.next() % 1000) as f32 / 1000.0,
            nms_iou: (rng.next() % 1000) as f32 / 1000.0,
            detections: DetectionList::Records(&dets),
        });
        let bytes = encode(&m, case, 0);
        let (_, back) = decode(&bytes).unwrap();
        assert_eq!(back, m, "case {case}");
        let Message::Detections(reply) = back else {
            panic!("case {case}: not detections")
        };
        assert_eq!(reply.detections.iter().collect::<Vec<_>>(), dets);
    }
}

/// Flipped, cut and extended valid messages: decoding never panics, and whatever decodes
/// re-encodes to bytes that decode to the same message (the fuzz target's property).
#[test]
fn mutated_messages_never_panic_and_stay_consistent() {
    let pixels: Vec<u8> = (0..24).collect();
    let seeds: Vec<Vec<u8>> = samples(&pixels).iter().map(|m| encode(m, 9, 9)).collect();
    let mut rng = Rng(0x5EED_0003);
    let mut decoded = 0;
    for case in 0..20_000 {
        let mut b = seeds[rng.below(seeds.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(4) {
                0 | 1 => {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next() as u8;
                }
                2 => b.truncate(rng.below(b.len() as u64 + 1) as usize),
                _ => b.push(rng.next() as u8),
            }
            if b.is_empty() {
                break;
            }
        }
        if let Ok((h, m)) = decode(&b) {
            decoded += 1;
            let again = encode(&m, h.sequence, h.timestamp_us);
            let (h2, m2) = decode(&again).unwrap_or_else(|e| panic!("case {case}: {e}"));
            assert_eq!(h2, h, "case {case}");
            assert_eq!(
                encode(&m2, h.sequence, h.timestamp_us),
                again,
                "case {case}"
            );
        }
    }
    // The mutations keep some messages valid (reserved bytes, values), so both paths run.
    assert!(decoded > 1000, "only {decoded} mutated messages decoded");
}

/// The fuzz target's seed corpus (`board/fuzz/seeds/decode`) is one encoded message of every
/// kind, kept current: a layout change fails here until the seeds are rewritten with
/// `FULCRUM_BLESS=1 cargo test -p fulcrum-board seed_corpus`.
#[test]
fn seed_corpus_is_current() {
    use std::path::Path;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/decode");
    let pixels: Vec<u8> = (0..24).collect();
    let expected: Vec<(std::string::String, Vec<u8>)> = samples(&pixels)
        .iter()
        .enumerate()
        .map(|(i, m)| {
            (
                std::format!("{i:02}-{:?}.bin", m.kind()),
                encode(m, i as u32, 0),
            )
        })
        .collect();
    if std::env::var_os("FULCRUM_BLESS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        for (name, bytes) in &expected {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    found.sort();
    let names: Vec<_> = expected.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(found, names, "seed files in {}", dir.display());
    for (name, bytes) in &expected {
        let on_disk = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(
            &on_disk, bytes,
            "{name} is stale: rewrite with FULCRUM_BLESS=1"
        );
        assert!(decode(&on_disk).is_ok(), "{name} does not decode");
    }
}
