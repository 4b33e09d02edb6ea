//! The pass against a direct float reference: every format, strides, crops, shrinking and
//! enlarging, on every kernel set this CPU runs.

use super::colour::YuvToRgb;
use super::pass::TRIALS;
use super::*;
use crate::compute::cpu::kernels::{self, KernelSet};

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
}

/// The weights of output `i` of `dst` over the source interval `[origin, origin + len)`,
/// samples `lo .. hi` readable: the covered fraction of every sample when shrinking, the two
/// nearest centres (clamped) when enlarging. Written from the definition, sample by sample.
fn reference_weights(origin: f64, len: f64, lo: u32, hi: u32, dst: u32, i: u32) -> Vec<(u32, f64)> {
    let r = len / f64::from(dst);
    if r >= 1.0 {
        let (a, b) = (origin + f64::from(i) * r, origin + f64::from(i + 1) * r);
        let w: Vec<(u32, f64)> = (lo..hi)
            .map(|k| {
                (
                    k,
                    (b.min(f64::from(k) + 1.0) - a.max(f64::from(k))).max(0.0),
                )
            })
            .filter(|(_, w)| *w > 0.0)
            .collect();
        let sum: f64 = w.iter().map(|p| p.1).sum();
        w.into_iter().map(|(k, v)| (k, v / sum)).collect()
    } else {
        let c = origin + (f64::from(i) + 0.5) * r - 0.5;
        let f = c - c.floor();
        let clamp = |v: f64| v.clamp(f64::from(lo), f64::from(hi - 1)) as u32;
        vec![(clamp(c.floor()), 1.0 - f), (clamp(c.floor() + 1.0), f)]
    }
}

/// A picture's channel `c` at sample `(x, y)` of its own grid (chroma samples for U and V of
/// subsampled formats), straight from the bytes.
fn sample(p: &Pixels<'_>, c: usize, x: u32, y: u32) -> f64 {
    let (b, s) = (p.bytes(), p.stride());
    let (x, y) = (x as usize, y as usize);
    let at = |i: usize| f64::from(b[i]);
    match p.format() {
        PixelFormat::Rgb8 => at(y * s + 3 * x + c),
        PixelFormat::Bgr8 => at(y * s + 3 * x + 2 - c),
        PixelFormat::Rgba8 => at(y * s + 4 * x + c),
        PixelFormat::Bgra8 => at(y * s + 4 * x + 2 - c),
        PixelFormat::Gray8 => at(y * s + x),
        PixelFormat::Yuyv => match c {
            0 => at(y * s + 2 * x),
            1 => at(y * s + 4 * x + 1),
            _ => at(y * s + 4 * x + 3),
        },
        PixelFormat::Nv12 => match c {
            0 => at(y * s + x),
            _ => at((p.height() as usize + y) * s + 2 * x + c - 1),
        },
    }
}

/// The letterboxed picture by the definition: each channel resampled on its own grid, then
/// converted to RGB (unrounded).
fn reference(p: &Pixels<'_>, crop: Rect, size: u32) -> (Letterbox, Vec<f64>) {
    let placed = Letterbox::place(size, crop.width, crop.height);
    let n = size as usize;
    let mut out: Vec<f64> = PAD_COLOUR
        .iter()
        .cycle()
        .take(n * n * 3)
        .map(|&v| f64::from(v))
        .collect();
    let yuv = matches!(p.format(), PixelFormat::Yuyv | PixelFormat::Nv12);
    let half_x = |c: usize| yuv && c > 0;
    let half_y = |c: usize| p.format() == PixelFormat::Nv12 && c > 0;
    let axis = |at: u32, len: u32, half: bool, dst: u32, i: u32| {
        if half {
            let (lo, hi) = (at / 2, (at + len).div_ceil(2));
            reference_weights(f64::from(at) / 2.0, f64::from(len) / 2.0, lo, hi, dst, i)
        } else {
            reference_weights(f64::from(at), f64::from(len), at, at + len, dst, i)
        }
    };
    let m = YuvToRgb::new(p.colour());
    for j in 0..placed.height {
        for i in 0..placed.width {
            let mut ch = [0.0f64; 3];
            for (c, v) in ch.iter_mut().enumerate() {
                if p.format() == PixelFormat::Gray8 && c > 0 {
                    continue;
                }
                let wx = axis(crop.x, crop.width, half_x(c), placed.width, i);
                let wy = axis(crop.y, crop.height, half_y(c), placed.height, j);
                for &(y, a) in &wy {
                    for &(x, b) in &wx {
                        *v += a * b * sample(p, c, x, y);
                    }
                }
            }
            let rgb = if yuv {
                m.rgb(ch[0] as f32, ch[1] as f32, ch[2] as f32)
                    .map(f64::from)
            } else if p.format() == PixelFormat::Gray8 {
                [ch[0]; 3]
            } else {
                ch
            };
            let o =
                ((j as usize + placed.pad_y as usize) * n + i as usize + placed.pad_x as usize) * 3;
            for c in 0..3 {
                out[o + c] = rgb[c].clamp(0.0, 255.0);
            }
        }
    }
    (placed, out)
}

fn picture(format: PixelFormat, w: u32, h: u32, pad: usize, rng: &mut Rng) -> (usize, Vec<u8>) {
    let row = w as usize * format.bytes_per_pixel() as usize;
    let stride = row + pad;
    let rows = format.byte_rows(u64::from(h));
    // Smooth content (as photos are) plus noise, so that windows of every size matter.
    let bytes = (0..stride * rows as usize)
        .map(|i| ((i % stride) as u8).wrapping_mul(3) ^ (rng.byte() & 0x3F))
        .collect();
    (stride, bytes)
}

/// One picture to letterbox: format, sides, row padding, crop, output side, colour space.
#[derive(Debug, Clone, Copy)]
struct Case {
    format: PixelFormat,
    w: u32,
    h: u32,
    pad: usize,
    crop: Option<Rect>,
    size: u32,
    colour: ColourSpace,
}

impl Case {
    fn new(
        format: PixelFormat,
        (w, h): (u32, u32),
        pad: usize,
        crop: Option<Rect>,
        size: u32,
        colour: ColourSpace,
    ) -> Case {
        Case {
            format,
            w,
            h,
            pad,
            crop,
            size,
            colour,
        }
    }
}

/// Makes `case`'s picture, letterboxes it with `run` (which returns where the content landed
/// and the `size × size × 3` bytes) and checks both against the float reference: at most one
/// level of 255 off. `what` names the pass in failures.
fn check_with(
    what: &str,
    case: Case,
    rng: &mut Rng,
    run: impl FnOnce(&Pixels<'_>) -> (Letterbox, Vec<u8>),
) {
    let Case {
        format,
        w,
        h,
        pad,
        crop,
        size,
        colour,
    } = case;
    let (stride, bytes) = picture(format, w, h, pad, rng);
    let stride = if pad == 0 { 0 } else { stride };
    let p = Pixels::new(format, w, h, stride, colour, &bytes).unwrap();
    let (placed, out) = run(&p);
    let region = crop.unwrap_or(Rect::whole(w, h));
    let (want_placed, want) = reference(&p, region, size);
    assert_eq!(placed, want_placed, "{what} {case:?}");
    for (k, (&g, &r)) in out.iter().zip(&want).enumerate() {
        assert!(
            (f64::from(g) - r).abs() <= 1.0,
            "{what} {case:?}: byte {k} (pixel {}, {}) is {g}, the reference {r:.2}",
            k / 3 % size as usize,
            k / 3 / size as usize,
        );
    }
}

/// [`check_with`] the CPU pass on kernel set `set`.
#[allow(clippy::too_many_arguments)]
fn check(
    set: KernelSet,
    format: PixelFormat,
    w: u32,
    h: u32,
    pad: usize,
    crop: Option<Rect>,
    size: u32,
    colour: ColourSpace,
    rng: &mut Rng,
) {
    let case = Case::new(format, (w, h), pad, crop, size, colour);
    check_with(set.name(), case, rng, |p| {
        let mut pass = FramePass::with_kernels(size, kernels::table(set).unwrap());
        let mut out = vec![0u8; (size * size * 3) as usize];
        let placed = pass.run(p, crop, &mut out).unwrap();
        (placed, out)
    });
}

#[test]
fn every_format_matches_the_float_reference_on_every_kernel_set() {
    let mut rng = Rng(0x5EED_F00D);
    for set in KernelSet::here() {
        for format in PixelFormat::ALL {
            for (w, h, pad, size) in [
                (64, 48, 0, 16),   // shrink by 4
                (96, 54, 5, 40),   // shrink by 2.4, padded rows
                (38, 30, 0, 64),   // enlarge
                (200, 2, 3, 32),   // a thin strip
                (130, 98, 0, 128), // nearly the same size
            ] {
                check(
                    set,
                    format,
                    w,
                    h,
                    pad,
                    None,
                    size,
                    ColourSpace::Bt601Limited,
                    &mut rng,
                );
            }
        }
    }
}

#[test]
fn crops_and_colour_spaces_match_the_reference() {
    let mut rng = Rng(0xC0FFEE);
    let crop = |x, y, width, height| {
        Some(Rect {
            x,
            y,
            width,
            height,
        })
    };
    for set in KernelSet::here() {
        for format in PixelFormat::ALL {
            // Odd origins and sides: chroma windows start and end inside a chroma sample.
            for c in [
                crop(3, 5, 41, 27),
                crop(0, 0, 80, 60),
                crop(79, 59, 1, 1),
                crop(10, 11, 13, 40),
            ] {
                check(
                    set,
                    format,
                    80,
                    60,
                    7,
                    c,
                    32,
                    ColourSpace::Bt709Full,
                    &mut rng,
                );
            }
        }
        for colour in ColourSpace::ALL {
            check(
                set,
                PixelFormat::Nv12,
                64,
                48,
                0,
                None,
                16,
                colour,
                &mut rng,
            );
        }
    }
}

#[test]
fn bad_pictures_and_crops_are_refused_with_what_is_wrong() {
    let bytes = [0u8; 64];
    let new =
        |format, w, h, stride| Pixels::new(format, w, h, stride, ColourSpace::default(), &bytes);
    assert!(matches!(
        new(PixelFormat::Nv12, 3, 2, 0),
        Err(PixelsError::OddSide { side: "width", .. })
    ));
    assert!(matches!(
        new(PixelFormat::Nv12, 4, 3, 0),
        Err(PixelsError::OddSide { side: "height", .. })
    ));
    assert!(matches!(
        new(PixelFormat::Yuyv, 5, 2, 0),
        Err(PixelsError::OddSide { .. })
    ));
    assert!(matches!(
        new(PixelFormat::Rgb8, 4, 2, 11),
        Err(PixelsError::ShortStride { .. })
    ));
    assert!(matches!(
        new(PixelFormat::Rgb8, 8, 8, 0),
        Err(PixelsError::Short { need: 192, .. })
    ));
    assert!(matches!(
        new(PixelFormat::Gray8, 0, 8, 0),
        Err(PixelsError::Empty { .. })
    ));
    let p = new(PixelFormat::Gray8, 8, 8, 0).unwrap();
    let mut pass = FramePass::new(16);
    let mut out = vec![0u8; 16 * 16 * 3];
    for bad in [
        Rect {
            x: 0,
            y: 0,
            width: 0,
            height: 4,
        },
        Rect {
            x: 4,
            y: 4,
            width: 5,
            height: 1,
        },
        Rect {
            x: u32::MAX,
            y: 0,
            width: 2,
            height: 2,
        },
    ] {
        let e = pass.run(&p, Some(bad), &mut out).unwrap_err();
        assert!(matches!(e, PixelsError::BadCrop { .. }), "{e}");
        assert!(e.to_string().contains("8×8 frame"), "{e}");
    }
}

#[test]
fn reserved_scratch_is_not_reallocated_and_the_plan_is_what_is_held() {
    for (size, side) in [(128, 640), (256, 1920), (128, 4096), (320, 100)] {
        assert_eq!(
            FramePass::planned_bytes(size, side, 1),
            FramePass::with_capacity(size, side).bytes()
        );
    }
    let mut pass = FramePass::with_capacity(128, 640);
    let before = pass.bytes();
    let mut out = vec![0u8; 128 * 128 * 3];
    let bytes = vec![7u8; 640 * 640 * 4];
    for format in PixelFormat::ALL {
        for (w, h) in [(640, 480), (480, 640), (2, 640), (640, 2), (640, 640)] {
            let p = Pixels::new(format, w, h, 0, ColourSpace::default(), &bytes).unwrap();
            pass.run(&p, None, &mut out).unwrap();
            pass.run(
                &p,
                Some(Rect {
                    x: 1,
                    y: 1,
                    width: 1,
                    height: 1,
                }),
                &mut out,
            )
            .unwrap();
            assert_eq!(pass.bytes(), before, "{} {w}x{h}", format.name());
        }
    }
}

#[test]
fn bands_over_a_pool_give_the_same_bytes_and_the_choice_settles() {
    use crate::compute::cpu::pool::Pool;
    let pool = Pool::new(3);
    let mut rng = Rng(0xBA5D);
    for format in PixelFormat::ALL {
        let (stride, bytes) = picture(format, 200, 150, 3, &mut rng);
        let p = Pixels::new(format, 200, 150, stride, ColourSpace::Bt709Limited, &bytes).unwrap();
        let crop = Some(Rect {
            x: 7,
            y: 3,
            width: 151,
            height: 97,
        });
        let mut one = FramePass::new(64);
        let mut want = vec![0u8; 64 * 64 * 3];
        one.run(&p, crop, &mut want).unwrap();
        let mut split = FramePass::new(64);
        // Enough runs to try one band and three alternately, then keep the faster.
        for _ in 0..2 * TRIALS + 2 {
            let mut got = vec![1u8; 64 * 64 * 3];
            split.run_on(Some(&pool), &p, crop, &mut got).unwrap();
            assert!(got == want, "{}: banded output differs", format.name());
        }
    }
}

/// The GPU pass (Vulkan engine, `shaders/frame_pass.comp`) against the same float reference,
/// every format, padded rows, crops with odd origins, every colour space, shrinking and
/// enlarging; with the metadata after the image written as given and no validation message.
#[test]
fn the_gpu_pass_matches_the_float_reference() {
    use crate::compute::recording::{Elem, Recording, Role};
    use crate::compute::vulkan::{testing, FrameJob, VulkanExec};
    let Some(engine) = testing::engine("the_gpu_pass_matches_the_float_reference") else {
        return;
    };
    let sizes = [16u32, 32, 40, 64, 128];
    let tail_len = 64;
    let largest = (128 * 128 * 3) + tail_len;
    let mut rec = Recording::new();
    let records = rec.tensor("records", largest, Elem::Bytes, Role::Input);
    let mut exec = VulkanExec::new(engine, &rec, false, None).unwrap();
    let mut rng = Rng(0x6B0_F00D);
    let mut cases: Vec<Case> = Vec::new();
    for format in PixelFormat::ALL {
        for (w, h, pad, size) in [
            (64, 48, 0, 16),
            (96, 54, 5, 40),
            (38, 30, 0, 64),
            (200, 2, 3, 32),
            (130, 98, 0, 128),
        ] {
            let colour = ColourSpace::Bt601Limited;
            cases.push(Case::new(format, (w, h), pad, None, size, colour));
        }
        for (x, y, width, height) in [(3, 5, 41, 27), (79, 59, 1, 1), (10, 11, 13, 40)] {
            let crop = Some(Rect {
                x,
                y,
                width,
                height,
            });
            cases.push(Case::new(
                format,
                (80, 60),
                7,
                crop,
                32,
                ColourSpace::Bt709Full,
            ));
        }
    }
    for colour in ColourSpace::ALL {
        cases.push(Case::new(PixelFormat::Nv12, (64, 48), 0, None, 16, colour));
        cases.push(Case::new(PixelFormat::Yuyv, (64, 48), 0, None, 16, colour));
    }
    assert!(sizes.iter().all(|s| cases.iter().any(|c| c.size == *s)));
    let tail: Vec<u8> = (0..tail_len as u8).map(|v| v.wrapping_mul(7)).collect();
    for c in cases {
        check_with("gpu", c, &mut rng, |p| {
            let mut plan = GpuFramePlan::new(c.size).unwrap();
            let frame = plan.plan(p, c.crop).unwrap().unwrap();
            let out_bytes = (c.size * c.size * 3) as usize;
            let job = FrameJob {
                target: records,
                out_bytes,
                frame: p.picture_bytes(),
                windows: frame.windows,
                push: frame.push,
                groups: frame.groups,
                tail: &tail,
                tail_offset: out_bytes,
            };
            exec.run_frame(&job, None).unwrap();
            let mut got = vec![0u8; out_bytes + tail_len];
            exec.read_bytes(records, &mut got).unwrap();
            assert_eq!(&got[out_bytes..], &tail[..], "the metadata after the image");
            got.truncate(out_bytes);
            (frame.placed, got)
        });
    }
    testing::assert_clean(exec.engine());
}
