//! Every set this CPU runs against the portable one, kernel by kernel, on planes whose rows
//! end in every possible tail of a 4- and 8-lane vector. (The GEMMs are checked per set in
//! `gemm`'s tests, the depthwise pass per set against its definition in `depthwise`'s.)

use super::*;

fn wave(n: usize, f: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * f).sin()).collect()
}

fn assert_close(set: KernelSet, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{set} {what}[{i}]: {g} vs portable {w}"
        );
    }
}

/// The sets here other than the portable one.
fn simd_tables() -> Vec<&'static Kernels> {
    KernelSet::here()
        .into_iter()
        .filter(|s| *s != KernelSet::Portable)
        .filter_map(table)
        .collect()
}

#[test]
fn the_best_set_for_this_architecture_is_the_one_that_runs() {
    // On aarch64 NEON is baseline: its set must be the one that runs (CI runs this under
    // qemu-aarch64).
    #[cfg(target_arch = "aarch64")]
    let expected = Some(KernelSet::Neon);
    #[cfg(target_arch = "x86_64")]
    let expected = {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma");
        if avx2 && has!("avx512f") {
            Some(KernelSet::Avx512)
        } else {
            avx2.then_some(KernelSet::Avx2)
        }
    };
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    let expected: Option<KernelSet> = None;
    if let Some(set) = expected {
        assert_eq!(KernelSet::best(), set);
        if std::env::var(ENV).unwrap_or_default().is_empty() {
            assert_eq!(active().set, set);
        }
    }
    assert_eq!(KernelSet::here()[0], KernelSet::Portable);
}

#[test]
fn names_parse_back_and_foreign_sets_are_refused() {
    for set in KernelSet::ALL {
        assert_eq!(KernelSet::parse(set.name()), Some(set));
        assert_eq!(KernelSet::parse(&set.name().to_uppercase()), Some(set));
    }
    assert_eq!(KernelSet::parse("sse9"), None);
    // A set of another architecture never runs here.
    let foreign = if cfg!(target_arch = "aarch64") {
        KernelSet::Avx2
    } else {
        KernelSet::Neon
    };
    assert!(!foreign.runs_here());
    assert!(table(foreign).is_none());
}

/// Nine taps over a stride-1 plane of `oh + 2` rows of `ow + 2`.
fn taps(src: &[f32], ow: usize) -> Taps<'_> {
    let ld = ow + 2;
    Taps {
        src,
        at: std::array::from_fn(|t| (t / 3) * ld + t % 3),
        step: ld,
    }
}

#[test]
fn depthwise_plane_kernels_match_the_portable_ones() {
    let w: [f32; 9] = std::array::from_fn(|i| (i as f32 * 0.7).cos());
    let portable = table(KernelSet::Portable).unwrap();
    for kern in simd_tables() {
        for ow in 1..=19 {
            let oh = 3;
            let src = wave((oh + 2) * (ow + 2), 0.31);
            let t = taps(&src, ow);
            t.check(oh, ow);
            for relu in [false, true] {
                let (mut want, mut got) = (vec![f32::NAN; oh * ow], vec![f32::NAN; oh * ow]);
                // SAFETY: tables from `table`; the taps were checked for oh rows of ow.
                unsafe {
                    (portable.dw3x3_conv)(t, &w, 0.25, relu, &mut want, ow);
                    (kern.dw3x3_conv)(t, &w, 0.25, relu, &mut got, ow);
                }
                assert_close(kern.set, "conv", &got, &want);
            }

            let gy = wave(oh * ow, 0.53);
            let y = wave(oh * ow, 0.97);
            for y in [None, Some(&y[..])] {
                let (ld, at) = (ow + 3, 1);
                let mut dst = [vec![f32::NAN; oh * ld + at], vec![f32::NAN; oh * ld + at]];
                let [d0, d1] = &mut dst;
                let wg = |dst| WeightGrad {
                    gy: &gy,
                    y,
                    dst,
                    at,
                    ld,
                };
                // SAFETY: as above; y is as long as gy and dst holds oh rows of ld from at.
                let (want, got) = unsafe {
                    (
                        (portable.dw3x3_weight_grad)(t, wg(d0), ow),
                        (kern.dw3x3_weight_grad)(t, wg(d1), ow),
                    )
                };
                assert_close(kern.set, "weight gradient", &got.0, &want.0);
                assert_close(kern.set, "bias gradient", &[got.1], &[want.1]);
                for r in 0..oh {
                    let row = |d: &Vec<f32>| d[at + r * ld..][..ow].to_vec();
                    assert_eq!(row(&dst[1]), row(&dst[0]), "{} masked gradient", kern.set);
                }
            }

            let g = wave((oh + 1) * (ow + 1), 0.29);
            let (mut want, mut got) = (vec![f32::NAN; 4 * oh * ow], vec![f32::NAN; 4 * oh * ow]);
            // SAFETY: as above; gx is 2·oh × 2·ow and g holds (oh + 1)·(ow + 1).
            unsafe {
                (portable.dw3x3_input_grad_s2)(&g, &w, &mut want, ow);
                (kern.dw3x3_input_grad_s2)(&g, &w, &mut got, ow);
            }
            assert_close(kern.set, "stride-2 input gradient", &got, &want);
        }
    }
}

/// The plane `whole` (`h` rows of `w`) again, written by `band(rows, oy0)` in every split into
/// two bands (rows `0..cut`, `cut..h`) and as one band per row; panics if two splits differ.
fn in_bands(
    whole: &[f32],
    w: usize,
    h: usize,
    mut band: impl FnMut(&mut [f32], usize),
) -> Vec<f32> {
    let mut last: Option<Vec<f32>> = None;
    let splits = (1..h).map(|cut| vec![0, cut, h]).chain([(0..=h).collect()]);
    for cuts in splits {
        let mut out = vec![f32::NAN; whole.len()];
        for pair in cuts.windows(2) {
            band(&mut out[pair[0] * w..pair[1] * w], pair[0]);
        }
        if let Some(prev) = &last {
            assert_eq!(*prev, out, "bands {cuts:?}");
        }
        last = Some(out);
    }
    last.unwrap_or_else(|| whole.to_vec())
}

#[test]
fn the_in_place_stride_1_plane_matches_the_portable_phases() {
    let w: [f32; 9] = std::array::from_fn(|i| (i as f32 * 0.7).cos() - 0.2);
    let portable = table(KernelSet::Portable).unwrap();
    assert!(
        portable.dw3x3_same.is_none(),
        "portable goes through phases"
    );
    for kern in simd_tables() {
        let same = kern
            .dw3x3_same
            .expect("every SIMD set reads the plane in place");
        // Past 16: several 16-lane chunks a row, ragged or not.
        for width in (1..=19).chain([24, 32, 40]) {
            for h in [1, 2, 3, 5, 6] {
                let x = wave(h * width, 0.37);
                // The phases of a stride-1, pad-1 plane: the plane in a zero frame.
                let ld = width + 2;
                let mut framed = vec![0f32; (h + 2) * ld];
                for (r, row) in x.chunks_exact(width).enumerate() {
                    framed[(r + 1) * ld + 1..][..width].copy_from_slice(row);
                }
                let t = taps(&framed, width);
                t.check(h, width);
                for relu in [false, true] {
                    let (mut want, mut got) =
                        (vec![f32::NAN; h * width], vec![f32::NAN; h * width]);
                    // SAFETY: tables from `table`; the taps were checked for h rows of width,
                    // and x and got are both h × width.
                    unsafe {
                        (portable.dw3x3_conv)(t, &w, -0.3, relu, &mut want, width);
                        same(&x, &w, -0.3, relu, &mut got, width, 0, h);
                    }
                    assert_close(
                        kern.set,
                        &format!("in-place plane {h}×{width}"),
                        &got,
                        &want,
                    );
                    assert_eq!(
                        in_bands(&got, width, h, |band, oy0| {
                            // SAFETY: as above; the band's rows lie inside the plane.
                            unsafe { same(&x, &w, -0.3, relu, band, width, oy0, h) }
                        }),
                        got,
                        "{}: {h}×{width} in bands",
                        kern.set
                    );
                }
            }
        }
    }
}

#[test]
fn the_in_place_stride_2_plane_matches_its_definition() {
    let w: [f32; 9] = std::array::from_fn(|i| (i as f32 * 0.9).sin() + 0.1);
    for kern in simd_tables() {
        let half = kern
            .dw3x3_half
            .expect("every SIMD set reads the plane in place");
        for ow in (1..=19).chain([24, 32, 40]) {
            for oh in [1, 2, 3, 5] {
                let width = 2 * ow;
                let x = wave(4 * oh * ow, 0.41);
                let at = |iy: isize, ix: isize| -> f32 {
                    let inside =
                        (0..2 * oh as isize).contains(&iy) && (0..width as isize).contains(&ix);
                    if inside {
                        x[iy as usize * width + ix as usize]
                    } else {
                        0.0
                    }
                };
                for relu in [false, true] {
                    let want: Vec<f32> = (0..oh * ow)
                        .map(|i| {
                            let (oy, ox) = ((i / ow) as isize, (i % ow) as isize);
                            let a = 0.2
                                + (0..9)
                                    .map(|t| {
                                        w[t] * at(
                                            2 * oy + t as isize / 3 - 1,
                                            2 * ox + t as isize % 3 - 1,
                                        )
                                    })
                                    .sum::<f32>();
                            if relu {
                                a.max(0.0)
                            } else {
                                a
                            }
                        })
                        .collect();
                    let mut got = vec![f32::NAN; oh * ow];
                    // SAFETY: a table from `table`; x is 2·oh × 2·ow and got oh × ow.
                    unsafe { half(&x, &w, 0.2, relu, &mut got, ow, 0, oh) };
                    assert_close(kern.set, &format!("stride-2 plane {oh}×{ow}"), &got, &want);
                    assert_eq!(
                        in_bands(&got, ow, oh, |band, oy0| {
                            // SAFETY: as above; the band's rows lie inside the plane.
                            unsafe { half(&x, &w, 0.2, relu, band, ow, oy0, oh) }
                        }),
                        got,
                        "{}: stride-2 {oh}×{ow} in bands",
                        kern.set
                    );
                }
            }
        }
    }
}

#[test]
fn the_dense_stride_2_conv_without_im2col_matches_its_definition() {
    assert!(
        table(KernelSet::Portable).unwrap().dense3x3_half.is_none(),
        "portable goes through im2col"
    );
    for kern in simd_tables() {
        let dense = kern
            .dense3x3_half
            .expect("every SIMD set builds the stem's panels in place");
        // Widths 1–19, 32, 33 and 48: every tail of a vector, one and several 16-column
        // tiles, the AVX-512 set's 32-column tiles whole, ragged and followed by a 16-column
        // one; at 28 channels, also strips of 32 columns. Weights of 64 × 27 and fewer are read by
        // columns, more (65 × 27, 8 × 252) row-major.
        for ow in (1..=19).chain([32, 33, 48]) {
            for (c_in, m, oh) in [
                (3, 16, 2),
                (1, 5, 3),
                (2, 3, 1),
                (5, 6, 2),
                (28, 4, 2),
                (3, 64, 1),
                (3, 65, 1),
                (28, 8, 1),
            ] {
                let (ih, iw) = (2 * oh, 2 * ow);
                let x = wave(c_in * ih * iw, 0.43);
                let weight = wave(m * c_in * 9, 0.77);
                let bias = wave(m, 1.3);
                let at = |ci: usize, iy: isize, ix: isize| -> f32 {
                    let inside = (0..ih as isize).contains(&iy) && (0..iw as isize).contains(&ix);
                    if inside {
                        x[(ci * ih + iy as usize) * iw + ix as usize]
                    } else {
                        0.0
                    }
                };
                for (with_bias, relu) in [(false, false), (true, false), (true, true)] {
                    let want: Vec<f32> = (0..m * oh * ow)
                        .map(|i| {
                            let (co, oy, ox) = (i / (oh * ow), (i / ow) % oh, i % ow);
                            let mut a = if with_bias { bias[co] } else { 0.0 };
                            for ci in 0..c_in {
                                for t in 0..9 {
                                    let (ky, kx) = ((t / 3) as isize, (t % 3) as isize);
                                    a += weight[(co * c_in + ci) * 9 + t]
                                        * at(
                                            ci,
                                            2 * oy as isize + ky - 1,
                                            2 * ox as isize + kx - 1,
                                        );
                                }
                            }
                            if relu {
                                a.max(0.0)
                            } else {
                                a
                            }
                        })
                        .collect();
                    let ep = Epilogue {
                        bias: with_bias.then_some(&bias[..]),
                        relu,
                        residual: None,
                    };
                    let mut got = vec![f32::NAN; m * oh * ow];
                    // SAFETY: a table from `table`; x is c_in planes of 2·oh × 2·ow, weight
                    // m × c_in·9 (c_in·9 ≤ 252 taps), got m planes of oh × ow, bias m values.
                    unsafe {
                        dense(
                            Dense3x3Input::Planes(&x),
                            c_in,
                            &weight,
                            m,
                            ep,
                            got.as_mut_ptr(),
                            (oh, ow),
                            0..oh,
                        )
                    };
                    assert_close(
                        kern.set,
                        &format!("dense 3×3 stride 2, {c_in}→{m} at {oh}×{ow}"),
                        &got,
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn the_stem_reading_rgb_bytes_matches_it_reading_their_normalised_planes() {
    for kern in simd_tables() {
        let dense = kern
            .dense3x3_half
            .expect("every SIMD set has the stem kernel");
        // Widths with ragged tiles and tails; heights whose bands share an input row.
        for (oh, ow) in [(1, 1), (3, 7), (5, 16), (4, 21), (6, 33)] {
            let (ih, iw) = (2 * oh, 2 * ow);
            let image: Vec<u8> = (0..3 * ih * iw).map(|i| (i * 89 % 256) as u8).collect();
            let (m, weight, bias) = (5, wave(5 * 27, 0.61), wave(5, 0.9));
            let ep = Epilogue {
                bias: Some(&bias),
                relu: true,
                residual: None,
            };
            for flip in [false, true] {
                let mut planes = vec![0f32; 3 * ih * iw];
                let (r, gb) = planes.split_at_mut(ih * iw);
                let (g, b) = gb.split_at_mut(ih * iw);
                let rows = image.chunks_exact(3 * iw).zip(r.chunks_exact_mut(iw));
                for ((src, r), (g, b)) in
                    rows.zip(g.chunks_exact_mut(iw).zip(b.chunks_exact_mut(iw)))
                {
                    // SAFETY: a table from `table`; 3·iw bytes for rows of iw floats.
                    unsafe { (kern.rgb_row)(src, flip, [r, g, b]) };
                }
                // Output rows `..cut` and `cut..` in two calls (one when `cut` is `oh`).
                let run = |x: Dense3x3Input<'_>, cut: usize| {
                    let mut got = vec![f32::NAN; m * oh * ow];
                    for rows in [0..cut, cut..oh] {
                        // SAFETY: a table from `table`; the input is 2·oh × 2·ow (3 planes or
                        // an RGB image of that many pixels), weight m × 27, bias m values,
                        // got m planes of oh × ow.
                        unsafe { dense(x, 3, &weight, m, ep, got.as_mut_ptr(), (oh, ow), rows) };
                    }
                    got
                };
                let want = run(Dense3x3Input::Planes(&planes), oh);
                for cut in [oh, oh / 2] {
                    let got = run(
                        Dense3x3Input::Rgb {
                            image: &image,
                            flip,
                        },
                        cut,
                    );
                    assert_eq!(
                        got, want,
                        "{}: RGB stem {oh}×{ow}, flip {flip}, bands cut at {cut}",
                        kern.set
                    );
                }
            }
        }
    }
}

#[test]
fn rgb_rows_match_the_portable_ones_for_every_byte() {
    let portable = table(KernelSet::Portable).unwrap();
    // Every byte value in every channel position, over rows with every tail of a vector.
    let bytes: Vec<u8> = (0..3 * 19 * 16).map(|i| (i * 7 % 256) as u8).collect();
    for c in 0..3 {
        let seen: std::collections::HashSet<u8> =
            bytes.iter().skip(c).step_by(3).copied().collect();
        assert_eq!(seen.len(), 256, "every byte in channel {c}");
    }
    for kern in simd_tables() {
        for w in (1..=19).chain([32, 35, 40, 48, 64]) {
            for src in bytes.chunks_exact(3 * w) {
                for flip in [false, true] {
                    let mut want = [vec![f32::NAN; w], vec![f32::NAN; w], vec![f32::NAN; w]];
                    let mut got = want.clone();
                    // SAFETY: tables from `table`; 3·w bytes for rows of w floats.
                    unsafe {
                        (portable.rgb_row)(src, flip, want.each_mut().map(|v| &mut v[..]));
                        (kern.rgb_row)(src, flip, got.each_mut().map(|v| &mut v[..]));
                    }
                    assert_eq!(got, want, "{} rgb row of {w}, flip {flip}", kern.set);
                }
            }
        }
    }
}

#[test]
fn weighted_rows_match_the_portable_ones_at_every_tail() {
    let portable = table(KernelSet::Portable).unwrap();
    let stride = 211;
    let bytes: Vec<u8> = (0..stride * 9).map(|i| (i * 37 % 256) as u8).collect();
    for kern in simd_tables() {
        for weights in [
            &[1.0f32][..],
            &[0.25, 0.5, 0.25],
            &[0.2, 0.2, 0.0, 0.2, 0.2, 0.2],
            &[0.1; 9],
        ] {
            for n in (1..=70).chain([128, 200]) {
                let src = &bytes[3..];
                assert!((weights.len() - 1) * stride + n <= src.len());
                let mut want = vec![f32::NAN; n];
                let mut got = vec![f32::NAN; n];
                // SAFETY: tables from `table`; the rows lie inside `src` (asserted above).
                unsafe {
                    (portable.weighted_rows)(src, stride, weights, &mut want);
                    (kern.weighted_rows)(src, stride, weights, &mut got);
                }
                assert_close(
                    kern.set,
                    &format!("{} rows of {n}", weights.len()),
                    &got,
                    &want,
                );
            }
        }
    }
}

#[test]
fn gathered_taps_match_the_sums_they_stand_for() {
    let v = wave(700, 0.37);
    for kern in simd_tables() {
        let Some(gather) = kern.gather_taps else {
            continue;
        };
        for (dst, taps, step, offset) in [
            (37usize, 5usize, 1usize, 0isize),
            (64, 3, 2, 1),
            (19, 7, 3, -2),
            (128, 1, 4, 3),
        ] {
            let starts: Vec<u32> = (0..dst as u32).map(|i| 1 + i * 5 % 97).collect();
            let weights = wave(dst * taps, 1.3);
            for n in [1, dst / 2, dst - 1, dst] {
                let want: Vec<f32> = (0..n)
                    .map(|i| {
                        let first = (starts[i] as usize * step).wrapping_add_signed(offset);
                        (0..taps)
                            .map(|t| weights[t * dst + i] * v[first + t * step])
                            .sum()
                    })
                    .collect();
                let mut got = vec![f32::NAN; n];
                // SAFETY: a table from `table`; every index is at most (1 + 96)·4 + 3 + 6·4
                // < 700 and at least 1·1 − 2 ≥ 0 (the starts are ≥ 1).
                unsafe { gather(&v, &starts, &weights, dst, taps, step, offset, &mut got) };
                assert_close(
                    kern.set,
                    &format!("{taps} taps of {n}, step {step}"),
                    &got,
                    &want,
                );
            }
        }
    }
}
