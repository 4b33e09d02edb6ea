use super::*;
use crate::compute::ops::{AdamW, Add, Decode};
use crate::compute::recording::Role;

#[test]
fn splits_cover_the_sum_in_whole_aligned_parts() {
    for rule in [TILED_SPLIT, DIRECT_SPLIT] {
        for (terms, tiles) in [
            (1, 1),
            (2047, 1),
            (4096, 1),
            (131_072, 1),
            (2048, 500),
            (5, 9),
        ] {
            let (s, c) = split(terms, tiles, rule);
            assert!(s >= 1 && u64::from(s) <= MAX_SPLITS, "{terms} {tiles}: {s}");
            assert_eq!(u64::from(c) % rule.align, 0);
            assert!(u64::from(s) * u64::from(c) >= terms);
            assert!(u64::from(s - 1) * u64::from(c) < terms, "no empty part");
        }
    }
    assert_eq!(split(131_072, 1, TILED_SPLIT).0, 512);
    assert_eq!(split(2048, 600, TILED_SPLIT).0, 1, "enough tiles: no split");
    // Direct parts: at least 2048 terms, about 64 workgroups.
    assert_eq!(split(131_072, 1, DIRECT_SPLIT), (64, 2048));
    assert_eq!(split(131_072, 16, DIRECT_SPLIT), (4, 32_768));
    assert_eq!(split(4095, 1, DIRECT_SPLIT).0, 1);
}

/// The split rule bounds the partial sums by TARGET_GROUPS tiles for the models as they
/// train: the conv scratch stays a few MiB however large the batch.
#[test]
fn weight_gradient_scratch_stays_within_the_target_tiles() {
    use crate::format::RecordLayout;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::graph::{GraphOptions, ModelGraph};
    let tile = u64::from(GEMM_TILE[0] * GEMM_TILE[1]);
    for (model, batch, size) in [("det-s", 32, 128), ("det-m", 16, 256), ("det-l", 8, 320)] {
        let arch = Arch::new(&ModelConfig::named_at(model, 2, size).unwrap());
        let layout = RecordLayout::new(size, size, 3, 64).unwrap();
        let g = ModelGraph::build(&arch, batch, &layout, &GraphOptions::default()).unwrap();
        let floats = lower(&g.recording).unwrap().conv_partial_floats as u64;
        assert!(floats > 0, "{model}: some weight gradient is split");
        assert!(
            floats <= TARGET_GROUPS * tile * 2,
            "{model} b={batch}@{size}: {floats} partial floats"
        );
    }
}

/// A tiled GEMM's tile: the default where the output is large and the grid full, no side
/// padded by more than a quarter where a smaller side would not be, shrunk until the grid
/// fills a GPU (down to 16 × 16), and never larger than the default.
#[test]
fn gemm_tiles_follow_the_shape() {
    let default = [GEMM_TILE[0], GEMM_TILE[1]];
    // det-s's pointwise convs at batch 32: 32 and 64 channels over 32 × 32 and 16 × 16.
    assert_eq!(gemm_tile(32, 1024, 32, true), default);
    assert_eq!(gemm_tile(64, 256, 32, true), default);
    assert_eq!(gemm_tile(128, 4096, 16, true), default);
    // 48 rows: 16-row tiles pad nothing, 32 or 64 pad by a third.
    assert_eq!(gemm_tile(48, 4096, 8, true), [16, 128]);
    // One image's small layer: shrunk to 16 × 16 for workgroups, as far as it goes.
    assert_eq!(gemm_tile(64, 256, 1, true), [16, 16]);
    assert_eq!(gemm_tile(16, 35, 1, true), [16, 16]);
    // Weight gradients (no fill: their parts fill the device).
    assert_eq!(gemm_tile(64, 64, 1, false), default);
    assert_eq!(gemm_tile(16, 32, 1, false), [16, 32]);
    assert_eq!(gemm_tile(16, 27, 1, false), [16, 32]);
    assert_eq!(gemm_tile(128, 128, 1, false), default);
    for m in [1, 7, 16, 33, 64, 100, 128, 1000] {
        for n in [1, 9, 27, 64, 200, 1024, 5000] {
            for fill in [true, false] {
                let [bm, bn] = gemm_tile(m, n, 2, fill);
                assert!(GEMM_TILE_ROWS.contains(&bm) && GEMM_TILE_COLS.contains(&bn));
                assert!(bm * bn <= default[0] * default[1], "{m} × {n}: {bm} × {bn}");
            }
        }
    }
    // The default tile needs no constants; another names both sides.
    assert!(tile_constants(default).is_empty());
    assert_eq!(
        tile_constants([16, 128]),
        [
            SpecConstant::u32(GEMM_TILE_IDS[0], 16),
            SpecConstant::u32(GEMM_TILE_IDS[1], 128)
        ]
    );
}

/// With fp16, every forward conv of det-s (training's, evaluation's and inference's; the
/// stem reading the records included) runs as an fp16 variant, on a CPU-type device too,
/// and nothing else does: the gradients, adds and the optimizer keep their f32 kernels
/// (the direct ones there).
#[test]
fn fp16_takes_the_forward_convs_variants_and_nothing_else() {
    use crate::format::RecordLayout;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::graph::{GraphOptions, ModelGraph};
    let arch = Arch::new(&ModelConfig::named_at("det-s", 2, 128).unwrap());
    let layout = RecordLayout::new(128, 128, 3, 8).unwrap();
    for batch in [1, 8] {
        let g = ModelGraph::build(&arch, batch, &layout, &GraphOptions::default()).unwrap();
        let rec = &g.recording;
        for direct in [false, true] {
            let plain = Variants {
                direct,
                ..Variants::default()
            };
            let f32s = lower_with(rec, plain).unwrap();
            let f16s = lower_with(
                rec,
                Variants {
                    fp16: true,
                    ..plain
                },
            )
            .unwrap();
            let mut variants = 0;
            for (e, (a, b)) in f32s.entries.iter().zip(&f16s.entries).enumerate() {
                assert_eq!(a.len(), b.len());
                for (a, b) in a.iter().zip(b) {
                    let forward_conv =
                        matches!(rec.entries[e].steps[b.step], Step::ConvForward { .. });
                    assert_eq!(b.kernel.info().fp16, forward_conv, "{}", b.kernel);
                    if forward_conv {
                        variants += 1;
                    } else {
                        assert_eq!(a.kernel, b.kernel);
                    }
                    assert_eq!((&a.bindings, a.step), (&b.bindings, b.step));
                }
            }
            assert!(
                variants > 3 * 19,
                "batch {batch}: {variants} fp16 dispatches"
            );
        }
    }
}

/// A dense conv takes eight pixels an invocation on CPU-type devices, and four on GPUs
/// from QUAD_MIN_PIXELS output pixels on, with a grid over the blocks.
#[test]
fn dense_convs_take_several_pixels_an_invocation_where_it_pays() {
    let lowered = |n, direct| {
        let op = Conv2d::dense(n, 3, 128, 128, 16, 3, 2, true);
        let mut r = Recording::new();
        let x = r.f32("x", op.input_len(), Role::Input);
        let w = r.f32("w", op.weight_len(), Role::Param);
        let b = r.f32("b", op.bias_len(), Role::Param);
        let y = r.f32("y", op.output_len(), Role::Output);
        r.entry("fwd", vec![Step::ConvForward { op, x, w, b, y }]);
        let v = Variants {
            direct,
            ..Variants::default()
        };
        let d = &lower_with(&r, v).unwrap().entries[0][0];
        (d.kernel, d.groups)
    };
    // 64 × 64 output pixels an image: 4096 invocations of 256, 1024 of four pixels, or
    // 512 of eight.
    assert_eq!(lowered(1, false), (Kernel::Conv2d, [16, 2, 1]));
    assert_eq!(lowered(1, true), (Kernel::Conv2dDirect, [2, 2, 1]));
    assert_eq!(lowered(15, false).0, Kernel::Conv2d);
    assert_eq!(lowered(16, false), (Kernel::Conv2dQuad, [64, 2, 1]));
}

#[test]
fn conv_backward_dispatches_by_kind_and_split() {
    let mut r = Recording::new();
    let big = Conv2d::dense(32, 3, 128, 128, 16, 3, 2, true);
    let dw = Conv2d::depthwise(2, 16, 9, 7, 3, 2, true);
    let mut steps = Vec::new();
    for (i, op) in [big, dw].into_iter().enumerate() {
        let x = r.f32(&format!("x{i}"), op.input_len(), Role::Input);
        let w = r.f32(&format!("w{i}"), op.weight_len(), Role::Param);
        let y = r.f32(&format!("y{i}"), op.output_len(), Role::Input);
        let gy = r.f32(&format!("gy{i}"), op.output_len(), Role::Input);
        let gw = r.f32(&format!("gw{i}"), op.weight_len(), Role::Output);
        let gb = r.f32(&format!("gb{i}"), op.bias_len(), Role::Output);
        let gx = (i == 1).then(|| r.f32(&format!("gx{i}"), op.input_len(), Role::Output));
        steps.push(Step::ConvBackward {
            op,
            x,
            w,
            y,
            gy,
            gx,
            gw: Some(gw),
            gb,
        });
    }
    r.entry("bwd", steps);
    let l = lower(&r).unwrap();
    let kernels: Vec<_> = l.entries[0].iter().map(|d| (d.kernel, d.step)).collect();
    assert_eq!(
        kernels,
        [
            (Kernel::Conv2dGradWeight, 0),
            (Kernel::Conv2dGradReduce, 0),
            (Kernel::DepthwiseGradInput, 1),
            (Kernel::DepthwiseGradWeight, 1),
        ]
    );
    // 32·64·64 terms onto one tile: split 512 ways into [512][16][28] partial sums.
    assert_eq!(l.entries[0][0].groups, [1, 1, 512]);
    assert_eq!(l.conv_partial_floats, 512 * 16 * 28);
    // Its 16·28 sums in blocks of 32.
    assert_eq!(l.entries[0][1].groups, [14, 1, 1]);
    assert_eq!(l.entries[0][3].groups, [16, 10, 1]);
    assert_eq!(l.loss_partial_floats, 0);
}

#[test]
fn a_private_pointwise_output_takes_the_add_after_it_into_its_store() {
    let mut r = Recording::new();
    let op = Conv2d::pointwise(1, 8, 4, 4, 8, true);
    let x = r.f32("x", op.input_len(), Role::Input);
    let w = r.f32("w", op.weight_len(), Role::Param);
    let b = r.f32("b", op.bias_len(), Role::Param);
    let y = r.f32("y", op.output_len(), Role::Activation);
    let out = r.f32("out", op.output_len(), Role::Output);
    let y2 = r.f32("y2", op.output_len(), Role::Output);
    let add = Add {
        len: op.output_len() as u32,
    };
    // `conv(x) + x`, from a conv whose output is `y`.
    let block = |y| {
        vec![
            Step::ConvForward { op, x, w, b, y },
            Step::Add {
                op: add,
                a: y,
                b: x,
                out,
            },
        ]
    };
    r.entry("fused", block(y));
    // The same where the conv's output is an output of its own: not fused.
    r.entry("kept", block(y2));
    let l = lower(&r).unwrap();
    let skip_word = |d: &LoweredDispatch| {
        u32::from_le_bytes(d.push[4 * CONV_SKIP_WORD..][..4].try_into().unwrap())
    };
    use Slot::Tensor as T;
    let fused = &l.entries[0];
    assert_eq!(fused.len(), 1, "{fused:?}");
    assert_eq!(fused[0].kernel, Kernel::PointwiseThin);
    assert_eq!(fused[0].bindings, [T(x), T(w), T(b), T(out), T(x)]);
    assert_eq!(skip_word(&fused[0]), 1);
    let kept: Vec<_> = l.entries[1].iter().map(|d| d.kernel).collect();
    assert_eq!(kept, [Kernel::PointwiseThin, Kernel::Add]);
    assert_eq!(l.entries[1][0].bindings[3], T(y2));
    assert_eq!(skip_word(&l.entries[1][0]), 0);
    assert_eq!(joined_steps(&r, 0), [true, false]);
    assert_eq!(joined_steps(&r, 1), [false, false]);
}

#[test]
fn a_stem_reads_the_records_where_only_it_reads_the_normalised_input() {
    use crate::compute::recording::Elem;
    let mut r = Recording::new();
    let norm = Normalize {
        n: 1,
        h: 8,
        w: 6,
        record_stride: 8 * 6 * 3 + 2,
        flip: true,
    };
    let op = Conv2d::dense(1, 3, 8, 6, 16, 3, 2, true);
    let records = r.tensor("records", norm.input_bytes(), Elem::Bytes, Role::Input);
    let x = r.f32("x", norm.output_len(), Role::Activation);
    let x2 = r.f32("x2", norm.output_len(), Role::Output);
    let w = r.f32("w", op.weight_len(), Role::Param);
    let b = r.f32("b", op.bias_len(), Role::Param);
    let y = r.f32("y", op.output_len(), Role::Output);
    let stem = |x| {
        vec![
            Step::Normalize {
                op: norm,
                records,
                out: x,
            },
            Step::ConvForward { op, x, w, b, y },
        ]
    };
    r.entry("fused", stem(x));
    // The same where the normalised input is an output of its own: not fused.
    r.entry("kept", stem(x2));
    for (direct, shapes) in [(false, false), (true, false), (false, true), (true, true)] {
        let l = lower_with(
            &r,
            Variants {
                direct,
                shapes,
                ..Variants::default()
            },
        )
        .unwrap();
        use Slot::Tensor as T;
        let fused = &l.entries[0];
        // Compiled per shape, the stem's constants are its final push block, the records'
        // layout included; a normalisation of its own has its own push block's.
        if shapes {
            let spec = &fused[0].spec;
            assert_eq!(*spec, shape_constants(&fused[0].push));
            let stride = spec[1 + CONV_RECORD_STRIDE_WORD];
            assert_eq!(
                (stride.id, stride.bits),
                (
                    SHAPE_SPECIALISED_ID + 1 + CONV_RECORD_STRIDE_WORD as u32,
                    norm.record_stride
                )
            );
            let norm = &l.entries[1][0];
            assert_eq!(norm.kernel, Kernel::Normalize);
            assert_eq!(norm.spec, shape_constants(&norm.push));
        } else {
            assert!(l.entries.iter().flatten().all(|d| d.spec.is_empty()));
        }
        assert_eq!(fused.len(), 1, "{fused:?}");
        let want = if direct {
            Kernel::Conv2dDirectRgb
        } else {
            Kernel::Conv2dRgb
        };
        assert_eq!((fused[0].kernel, fused[0].step), (want, 1));
        assert_eq!(fused[0].bindings, [T(records), T(w), T(b), T(y)]);
        let word = |i: usize| u32::from_le_bytes(fused[0].push[4 * i..][..4].try_into().unwrap());
        assert_eq!(
            [
                word(CONV_RECORD_STRIDE_WORD),
                word(CONV_RECORD_STRIDE_WORD + 1)
            ],
            [norm.record_stride, 1]
        );
        let kept: Vec<_> = l.entries[1].iter().map(|d| d.kernel).collect();
        let plain = if direct {
            Kernel::Conv2dDirect
        } else {
            Kernel::Conv2d
        };
        assert_eq!(kept, [Kernel::Normalize, plain]);
    }
    assert_eq!(joined_steps(&r, 0), [true, false]);
    assert_eq!(joined_steps(&r, 1), [false, false]);
}

#[test]
fn a_pointwise_conv_too_small_to_fill_a_gpu_has_an_output_per_invocation() {
    let kernel_and_grid = |op: Conv2d, variants| {
        let mut r = Recording::new();
        let x = r.f32("x", op.input_len(), Role::Input);
        let w = r.f32("w", op.weight_len(), Role::Param);
        let b = r.f32("b", op.bias_len(), Role::Param);
        let y = r.f32("y", op.output_len(), Role::Output);
        r.entry("pw", vec![Step::ConvForward { op, x, w, b, y }]);
        let d = &lower_with(&r, variants).unwrap().entries[0][0];
        (d.kernel, d.groups)
    };
    let gpu = Variants::default();
    // det-s at batch 1, 64→64 at 16×16: 4 × 2 tiles.
    let small = Conv2d::pointwise(1, 64, 16, 16, 64, true);
    assert_eq!(
        kernel_and_grid(small, gpu),
        (Kernel::PointwiseThin, [4, 16, 1])
    );
    // The same layer at batch 32: 256 tiles.
    let batch = Conv2d::pointwise(32, 64, 16, 16, 64, true);
    assert_eq!(kernel_and_grid(batch, gpu), (Kernel::Pointwise, [4, 2, 32]));
    let direct = Variants {
        direct: true,
        ..gpu
    };
    // Direct: 128 pixels and 32 channels a workgroup, in vec4s where the input channels
    // and the plane allow.
    assert_eq!(
        kernel_and_grid(small, direct),
        (Kernel::PointwiseDirect4, [2, 2, 1])
    );
    let odd = Conv2d::pointwise(1, 33, 5, 7, 65, true);
    assert_eq!(
        kernel_and_grid(odd, direct),
        (Kernel::PointwiseDirect, [1, 3, 1])
    );
}

/// An AdamW update of a 10-value tensor with distinguishable hyper-parameters.
fn adamw_of_ten() -> AdamW {
    AdamW {
        len: 10,
        lr: 0.5,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 1,
    }
}

#[test]
fn an_adamw_update_and_the_average_of_its_tensor_are_one_dispatch() {
    let mut r = Recording::new();
    let adam = adamw_of_ten();
    let t = |r: &mut Recording, n: &str, role| r.f32(n, 10, role);
    let hyper = r.f32("hyper", crate::compute::recording::HYPER_LEN, Role::Input);
    let mut tensors = Vec::new();
    for name in ["a", "b"] {
        let param = t(&mut r, name, Role::Param);
        let grad = t(&mut r, &format!("{name}.grad"), Role::Input);
        let m = t(&mut r, &format!("{name}.m"), Role::State);
        let v = t(&mut r, &format!("{name}.v"), Role::State);
        let ema = t(&mut r, &format!("{name}.ema"), Role::State);
        tensors.push((param, grad, m, v, ema));
    }
    let update =
        |(param, grad, m, v, _): (TensorId, TensorId, TensorId, TensorId, TensorId)| Step::AdamW {
            op: adam,
            param,
            grad,
            m,
            v,
            hyper,
        };
    let average = |param, ema| Step::Ema {
        op: crate::compute::ops::Ema { len: 10 },
        param,
        ema,
        hyper,
    };
    let (a, b) = (tensors[0], tensors[1]);
    // a's update and average fuse; b's average follows a's, not b's own update: no fusion.
    r.entry(
        "opt",
        vec![update(a), average(a.0, a.4), update(b), average(a.0, b.4)],
    );
    let l = lower(&r).unwrap();
    let kernels: Vec<_> = l.entries[0].iter().map(|d| (d.kernel, d.step)).collect();
    assert_eq!(
        kernels,
        [(Kernel::AdamWEma, 0), (Kernel::AdamW, 2), (Kernel::Ema, 3)]
    );
    let fused = &l.entries[0][0];
    assert_eq!(fused.bindings[5], Slot::Tensor(a.4));
    assert_eq!(fused.push, l.entries[0][1].push, "AdamW's push block");
}

#[test]
fn push_constants_carry_the_op_fields() {
    let op = Conv2d::dense(2, 4, 9, 7, 6, 3, 2, true);
    let p = conv_push(&op, 3, 48);
    let w: Vec<u32> = p
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(w, [2, 4, 9, 7, 6, 3, 2, 1, 1, 1, 5, 4, 3, 48, 0, 0, 0, 0]);
    let mut r = Recording::new();
    let adam = adamw_of_ten();
    let t = |r: &mut Recording, n: &str, role| r.f32(n, 10, role);
    let (param, grad) = (t(&mut r, "p", Role::Param), t(&mut r, "g", Role::Input));
    let (m, v) = (t(&mut r, "m", Role::State), t(&mut r, "v", Role::State));
    let hyper = r.f32("hyper", crate::compute::recording::HYPER_LEN, Role::Input);
    let decode = Decode {
        n: 1,
        classes: 1,
        levels: crate::compute::ops::Levels::single(2, 2, 8),
        threshold: 0.1,
        top_k: 600,
    };
    let pred = r.f32("pred", decode.input_len(), Role::Input);
    let dets = r.tensor("dets", 600 * 24, crate::compute::Elem::Bytes, Role::Output);
    let counts = r.tensor("counts", 4, crate::compute::Elem::Bytes, Role::Output);
    r.entry(
        "opt",
        vec![Step::AdamW {
            op: adam,
            param,
            grad,
            m,
            v,
            hyper,
        }],
    );
    let l = lower(&r).unwrap();
    let d = &l.entries[0][0];
    assert_eq!(d.kernel, Kernel::AdamW);
    assert_eq!(&d.push[4..8], &0.9f32.to_le_bytes());
    assert_eq!(d.bindings[4], Slot::Tensor(hyper));
    r.entry(
        "decode",
        vec![Step::Decode {
            op: decode,
            pred,
            dets,
            counts,
        }],
    );
    let e = lower(&r).unwrap_err();
    assert!(
        matches!(
            &e,
            LowerError::Step { entry, problem: StepError::DecodeTopK { top_k: 600, .. }, .. }
                if entry == "decode"
        ),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.contains("top_k 600") && e.contains("\"decode\""), "{e}");
}
