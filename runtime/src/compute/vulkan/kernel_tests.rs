//! Every GPU kernel against its CPU twin, through the whole path a model takes: a
//! [`Recording`], lowered, set up by [`VulkanExec`] and replayed, with the Khronos validation
//! layer on (any message fails the test). Shapes are random-ish and deliberately awkward:
//! odd sizes, strides 1–3, grids that do not fill a GEMM tile, sums long enough to be split.
//!
//! Tolerance: [`assert_close`] (`compute::cpu::gradcheck`) at `1e-4` relative, per element
//! `|gpu − cpu| ≤ 1e-4 · max(|cpu|, 1e-2 · max|cpu|)`; the floor keeps elements much smaller
//! than the tensor's largest (sums that cancel) to an absolute error of `1e-6 · max|cpu|`.
//! Integer results (classes, counts, decode order) must match exactly.

use super::exec::VulkanExec;
use super::testing::{assert_clean, engine};
use crate::base::SplitMix64;
use crate::compute::cpu::exec::CpuExec;
use crate::compute::cpu::gradcheck::{assert_close, random_vec};
use crate::compute::cpu::{self, Scratch};
use crate::compute::ops::{
    AdamW, Add, CenterLoss, Conv2d, ConvKind, Decode, Ema, Levels, Normalize, RowCopy, SgdMomentum,
    Targets, Upsample2x,
};
use crate::compute::recording::{
    Elem, Recording, Role, Step, TensorId, DETECTION_BYTES, HYPER_LEN, LOSS_LEN,
};
use crate::model::graph::GraphOptions;

/// The comparison tolerance (module docs).
const TOL: f64 = 1e-4;

fn close(name: &str, got: &[f32], want: &[f32]) {
    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    assert_close(name, got, &want, TOL);
}

/// The recording on a validated engine, or `None` (skipped) without Vulkan.
/// Every tensor in its own buffer: the tests read intermediate activations.
fn gpu(test: &str, rec: &Recording) -> Option<VulkanExec> {
    let engine = engine(test)?;
    Some(VulkanExec::separate(engine, rec, false).unwrap())
}

/// As [`gpu`], with the subgroup variants where the device has them, or the plain kernels;
/// also whether the variants are used.
fn gpu_subgroups(test: &str, rec: &Recording, subgroups: bool) -> Option<(VulkanExec, bool)> {
    let options = super::Options {
        subgroups: Some(subgroups),
        ..super::testing::options()
    };
    let engine = super::testing::engine_with_options(test, &options)?;
    let used = engine.variants().subgroups;
    assert_eq!(used, subgroups && engine.info().subgroup_arithmetic);
    Some((VulkanExec::separate(engine, rec, false).unwrap(), used))
}

fn read(exec: &mut VulkanExec, id: TensorId, len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    exec.read_f32(id, &mut v).unwrap();
    v
}

/// The CPU engine on the same recording (the twin of every kernel), two threads, every step
/// on its own and every tensor in its own memory: the comparisons read intermediate
/// activations, which a fused kernel may leave unwritten (the fused kernels' outputs are
/// tested against the unfused ones bit for bit) and a shared buffer overwrites.
fn cpu(rec: &Recording) -> CpuExec {
    let mut cpu = CpuExec::separate(rec, 2).unwrap();
    cpu.set_fusion(false);
    cpu
}

fn cpu_read(cpu: &mut CpuExec, id: TensorId, len: usize) -> Vec<f32> {
    let mut v = vec![0.0; len];
    cpu.read_f32(id, &mut v).unwrap();
    v
}

fn cpu_bytes(cpu: &mut CpuExec, id: TensorId, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    cpu.read_bytes(id, &mut v).unwrap();
    v
}

/// Detections of a bytes tensor as `(count, [class, score, x0, y0, x1, y1])` per image.
fn detections(dets: &[u8], counts: &[u8], op: &Decode) -> Vec<Vec<(u32, [f32; 5])>> {
    (0..op.n as usize)
        .map(|b| {
            let count = u32::from_le_bytes(counts[4 * b..4 * b + 4].try_into().unwrap());
            (0..count as usize)
                .map(|j| {
                    let at = DETECTION_BYTES * (b * op.top_k as usize + j);
                    let w = |i: usize| {
                        u32::from_le_bytes(dets[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
                    };
                    let f = |i: usize| f32::from_bits(w(i));
                    (w(0), [f(1), f(2), f(3), f(4), f(5)])
                })
                .collect()
        })
        .collect()
}

fn conv_cases() -> Vec<Conv2d> {
    let grouped = |n, c_in, h, w, c_out, k, s, groups, relu| Conv2d {
        groups,
        ..Conv2d::dense(n, c_in, h, w, c_out, k, s, relu)
    };
    vec![
        // Dense: det-s's stem shape on an odd image; a 5×5 kernel; stride 3; a 1×1 with
        // stride 2 (dense, not pointwise); a sum long enough to be split over the batch.
        Conv2d::dense(2, 3, 13, 11, 16, 3, 2, true),
        Conv2d::dense(1, 5, 9, 6, 7, 5, 1, false),
        Conv2d::dense(3, 2, 10, 8, 3, 3, 3, true),
        Conv2d::dense(2, 6, 7, 9, 5, 1, 2, false),
        Conv2d::dense(3, 3, 40, 41, 8, 3, 1, true),
        // The stem at a batch with enough pixels for four an invocation on GPUs.
        Conv2d::dense(16, 3, 128, 128, 16, 3, 2, true),
        // Grouped: two and three groups.
        grouped(2, 4, 7, 5, 6, 3, 1, 2, true),
        grouped(1, 6, 8, 8, 9, 3, 2, 3, false),
        // Pointwise: more channels than a tile, odd planes; a split weight gradient.
        Conv2d::pointwise(3, 33, 5, 7, 65, true),
        Conv2d::pointwise(2, 4, 50, 51, 4, false),
        // Pointwise with input channels and plane in fours (the direct kernels in vec4s): a
        // ReLU and more output channels than a tile; channels that end mid-vec4 block.
        Conv2d::pointwise(2, 12, 6, 10, 40, true),
        Conv2d::pointwise(1, 20, 4, 8, 9, false),
        // Depthwise: strides 1 and 2, a 5×5 kernel, no padding, a split weight gradient.
        Conv2d::depthwise(2, 5, 9, 7, 3, 2, true),
        Conv2d::depthwise(1, 3, 6, 11, 5, 1, false),
        Conv2d {
            pad: 0,
            ..Conv2d::depthwise(2, 4, 7, 7, 3, 1, true)
        },
        Conv2d::depthwise(2, 2, 48, 49, 3, 1, true),
        // Depthwise with rows of whole eight-value blocks in and out (the direct kernels' vec4
        // stores), strides 1 and 2.
        Conv2d::depthwise(2, 3, 8, 16, 3, 1, true),
        Conv2d::depthwise(1, 2, 10, 32, 3, 2, false),
    ]
}

/// The kernel a dense conv's forward pass lowers to, with the direct kernels or without
/// (lower.rs: eight pixels an invocation on CPU-type devices; on GPUs four from
/// QUAD_MIN_PIXELS output pixels on, else one).
fn dense_kernel(op: &Conv2d, direct: bool) -> &'static str {
    let pixels = u64::from(op.n * op.out_h() * op.out_w());
    match (direct, pixels >= super::lower::QUAD_MIN_PIXELS) {
        (true, _) => "conv2d_direct",
        (false, true) => "conv2d_quad",
        (false, false) => "conv2d",
    }
}

/// The kernel a pointwise conv's forward pass lowers to, with the direct kernels or without
/// (lower.rs: one output per invocation where the tiled grid is small).
fn pointwise_kernel(op: &Conv2d, direct: bool) -> &'static str {
    let tiles = u64::from(op.h * op.w).div_ceil(64) * u64::from(op.c_out).div_ceil(32);
    match (
        direct,
        tiles * u64::from(op.n) <= super::lower::THIN_MAX_TILES,
    ) {
        (true, _) if super::kernels::pointwise_direct4_fits(op.c_in, u64::from(op.h * op.w)) => {
            "pointwise_direct4"
        }
        (true, _) => "pointwise_direct",
        (false, true) => "pointwise_thin",
        (false, false) => "pointwise",
    }
}

/// Every conv kernel against the CPU twin, with the tiled weight-gradient kernel and with
/// the direct one (each forced whatever the device's own choice, [`super::Options::direct`]),
/// each compiled per shape and with the shape in push constants
/// ([`super::Options::specialise`]).
#[test]
fn conv_forward_and_backward_match_the_cpu_twin() {
    let cases = conv_cases();
    for direct in [false, true] {
        for specialise in [true, false] {
            conv_forward_and_backward_with(&cases, direct, specialise, true, None);
        }
    }
    // The tiled kernels' plain sums too, where the device has subgroup variants.
    conv_forward_and_backward_with(&cases, false, true, false, None);
}

/// The tiled GEMM kernels (the pointwise conv, the dense and pointwise gradients) with every
/// tile they can be specialised to ([`super::Options::gemm_tile`]), against the CPU twin: the
/// dense, grouped and pointwise cases of [`conv_cases`] but the large stem, so that tiles
/// larger than the output, ragged edges and a single row of invocations are all met.
#[test]
fn every_gemm_tile_matches_the_cpu_twin() {
    use super::kernels::{GEMM_TILE_COLS, GEMM_TILE_ROWS};
    let cases: Vec<Conv2d> = conv_cases()
        .into_iter()
        .filter(|op| op.kind() != ConvKind::Depthwise && op.input_len() < 20_000)
        .collect();
    for rows in GEMM_TILE_ROWS {
        for cols in GEMM_TILE_COLS {
            conv_forward_and_backward_with(&cases, false, true, true, Some([rows, cols]));
        }
    }
}

/// `subgroups`: the subgroup variants where the device has them (else the plain kernels);
/// `gemm_tile`: the tile every tiled GEMM dispatch takes (else each its own).
fn conv_forward_and_backward_with(
    cases: &[Conv2d],
    direct: bool,
    specialise: bool,
    subgroups: bool,
    gemm_tile: Option<[u32; 2]>,
) {
    let mut rng = SplitMix64::new(11);
    let mut rec = Recording::new();
    struct Ids {
        x: TensorId,
        w: TensorId,
        b: TensorId,
        y: TensorId,
        y_in: TensorId,
        gy: TensorId,
        gx: TensorId,
        gw: TensorId,
        gb: TensorId,
    }
    let mut ids = Vec::new();
    for (i, op) in cases.iter().enumerate() {
        let op = *op;
        let t =
            |rec: &mut Recording, name: &str, len, role| rec.f32(&format!("{name}{i}"), len, role);
        let id = Ids {
            x: t(&mut rec, "x", op.input_len(), Role::Input),
            w: t(&mut rec, "w", op.weight_len(), Role::Param),
            b: t(&mut rec, "b", op.bias_len(), Role::Param),
            y: t(&mut rec, "y", op.output_len(), Role::Output),
            y_in: t(&mut rec, "y_in", op.output_len(), Role::Input),
            gy: t(&mut rec, "gy", op.output_len(), Role::Input),
            gx: t(&mut rec, "gx", op.input_len(), Role::Output),
            gw: t(&mut rec, "gw", op.weight_len(), Role::Output),
            gb: t(&mut rec, "gb", op.bias_len(), Role::Output),
        };
        // The backward pass gets the CPU's forward output as `y` (the ReLU mask), so both
        // engines mask the same elements.
        rec.entry(
            &format!("case{i}"),
            vec![
                Step::ConvForward {
                    op,
                    x: id.x,
                    w: id.w,
                    b: id.b,
                    y: id.y,
                },
                Step::ConvBackward {
                    op,
                    x: id.x,
                    w: id.w,
                    y: id.y_in,
                    gy: id.gy,
                    gx: Some(id.gx),
                    gw: Some(id.gw),
                    gb: id.gb,
                },
            ],
        );
        ids.push(id);
    }
    let options = super::Options {
        direct: Some(direct),
        subgroups: Some(subgroups),
        specialise,
        gemm_tile,
        ..super::testing::options()
    };
    let Some(engine) = super::testing::engine_with_options("conv_forward_and_backward", &options)
    else {
        return;
    };
    let subgroups = engine.variants().subgroups;
    assert_eq!(
        subgroups,
        options.subgroups == Some(true) && engine.info().subgroup_arithmetic
    );
    let mut exec = VulkanExec::separate(engine, &rec, false).unwrap();
    let mut scratch = Scratch::new(2);
    for (i, (op, id)) in cases.iter().zip(&ids).enumerate() {
        scratch.reserve(cpu::conv2d_forward_scratch_len(op));
        scratch.reserve(cpu::conv2d_backward_scratch_len(op));
        let x = random_vec(&mut rng, op.input_len(), -1.0, 1.0);
        let w = random_vec(&mut rng, op.weight_len(), -1.0, 1.0);
        let b = random_vec(&mut rng, op.bias_len(), -0.5, 0.5);
        let gy = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
        let mut y = vec![0.0; op.output_len()];
        cpu::conv2d_forward(op, &x, &w, &b, &mut y, &mut scratch);
        let (mut gx, mut gw, mut gb) = (
            vec![0.0; op.input_len()],
            vec![0.0; op.weight_len()],
            vec![0.0; op.bias_len()],
        );
        cpu::conv2d_backward(
            op,
            &x,
            &w,
            &y,
            &gy,
            Some(&mut gx),
            &mut gw,
            &mut gb,
            &mut scratch,
        );
        for (t, v) in [
            (id.x, &x),
            (id.w, &w),
            (id.b, &b),
            (id.y_in, &y),
            (id.gy, &gy),
        ] {
            exec.write_f32(t, v).unwrap();
        }
        exec.run(i).unwrap();
        let what = format!(
            "{:?} {op:?}, direct {direct}, specialised {specialise}, subgroups {subgroups}, \
             tile {gemm_tile:?}",
            op.kind()
        );
        let suffix = if direct { "_direct" } else { "" };
        if op.kind() == ConvKind::Pointwise {
            assert_eq!(exec.kernels(i)[0].0, pointwise_kernel(op, direct), "{what}");
        }
        if matches!(op.kind(), ConvKind::Dense | ConvKind::Grouped) {
            assert_eq!(exec.kernels(i)[0].0, dense_kernel(op, direct), "{what}");
        }
        if op.kind() == ConvKind::Depthwise {
            let sums = if subgroups && !direct {
                "_subgroup"
            } else {
                ""
            };
            let want = format!("depthwise_grad_weight{suffix}{sums}");
            assert!(
                exec.kernels(i).iter().any(|k| k.0 == want),
                "{what}: {want} is lowered"
            );
        } else {
            // Pointwise convs over whole vec4s take the vec4 kernels on the direct path.
            let plane = u64::from(op.h * op.w);
            let pointwise = op.kind() == ConvKind::Pointwise;
            let vec4_input = pointwise && super::kernels::pointwise_direct4_fits(op.c_in, plane);
            let vec4_weight = pointwise && plane % 4 == 0;
            for (kernel, vec4) in [
                ("conv2d_grad_input", vec4_input),
                ("conv2d_grad_weight", vec4_weight),
            ] {
                let want = format!("{kernel}{suffix}{}", if direct && vec4 { "4" } else { "" });
                assert!(
                    exec.kernels(i).iter().any(|k| k.0 == want),
                    "{what}: {want} is lowered"
                );
            }
        }
        close(&format!("y of {what}"), &read(&mut exec, id.y, y.len()), &y);
        close(
            &format!("gx of {what}"),
            &read(&mut exec, id.gx, gx.len()),
            &gx,
        );
        close(
            &format!("gw of {what}"),
            &read(&mut exec, id.gw, gw.len()),
            &gw,
        );
        close(
            &format!("gb of {what}"),
            &read(&mut exec, id.gb, gb.len()),
            &gb,
        );
    }
    // The split reductions were exercised: dense, pointwise and depthwise cases of
    // conv_cases are long enough to be cut into parts (and one with every forced tile).
    let reduce = format!("conv2d_grad_reduce{}", if direct { "_direct" } else { "" });
    let reduces = (0..cases.len())
        .filter(|&e| exec.kernels(e).iter().any(|k| k.0 == reduce))
        .count();
    let least = if gemm_tile.is_some() { 1 } else { 3 };
    assert!(
        reduces >= least,
        "{reduces} cases split their weight gradient"
    );
    // Compiled per shape: several pipelines of a kernel, each with its shape's constants;
    // else one pipeline a kernel and tile, with none but the tile's. A tiled GEMM's tile
    // constants are there where its tile is not the default (the forced one, where forced).
    use super::kernels::{GEMM_TILE, GEMM_TILE_IDS};
    let pipelines = exec.pipelines();
    let mut tiled = std::collections::HashSet::new();
    for p in pipelines {
        let spec = p.spec_constants();
        let tile: Vec<u32> = spec
            .iter()
            .filter(|c| GEMM_TILE_IDS.contains(&c.id))
            .map(|c| c.bits)
            .collect();
        tiled.insert((p.kernel(), tile.clone()));
        let info = p.kernel().info();
        assert!(
            tile.is_empty() || (info.tiles && tile.len() == 2),
            "{}",
            p.kernel()
        );
        if let Some(forced) = gemm_tile.filter(|t| info.tiles && t[..] != GEMM_TILE[..2]) {
            assert_eq!(tile, forced, "{}", p.kernel());
        }
        let shape = &spec[..spec.len() - tile.len()];
        if specialise {
            assert_eq!(
                shape[0],
                super::SpecConstant::bool(1, true),
                "{}",
                p.kernel()
            );
            assert_eq!(
                shape.len(),
                1 + super::kernels::CONV_PUSH_BYTES as usize / 4
            );
        } else {
            assert!(shape.is_empty(), "{}", p.kernel());
        }
    }
    if specialise {
        assert!(pipelines.len() > tiled.len() + cases.len());
    } else {
        assert_eq!(pipelines.len(), tiled.len());
    }
    assert_clean(exec.engine());
}

/// A residual add after a pointwise conv, folded into the conv's store (tiled and direct
/// kernels): one dispatch, the add's result the CPU twin's of the two steps.
#[test]
fn a_residual_add_in_the_pointwise_store_matches_the_cpu_twin() {
    // Channels past a tile, a plane that leaves the last tile ragged: small enough for one
    // output per invocation, and large enough for the tiled kernel.
    let cases = [
        Conv2d::pointwise(2, 33, 5, 7, 40, true),
        Conv2d::pointwise(2, 20, 30, 31, 40, false),
        // Input channels and plane in fours: the direct kernel in vec4s.
        Conv2d::pointwise(2, 12, 6, 10, 40, true),
    ];
    for (op, direct) in cases.into_iter().flat_map(|op| [(op, false), (op, true)]) {
        let mut rng = SplitMix64::new(13);
        let mut rec = Recording::new();
        let x = rec.f32("x", op.input_len(), Role::Input);
        let w = rec.f32("w", op.weight_len(), Role::Param);
        let b = rec.f32("b", op.bias_len(), Role::Param);
        let y = rec.f32("y", op.output_len(), Role::Activation);
        let skip = rec.f32("skip", op.output_len(), Role::Input);
        let out = rec.f32("out", op.output_len(), Role::Output);
        let add = Add {
            len: op.output_len() as u32,
        };
        rec.entry(
            "block",
            vec![
                Step::ConvForward { op, x, w, b, y },
                Step::Add {
                    op: add,
                    a: y,
                    b: skip,
                    out,
                },
            ],
        );
        let options = super::Options {
            direct: Some(direct),
            ..super::testing::options()
        };
        let Some(engine) = super::testing::engine_with_options("pointwise_skip", &options) else {
            return;
        };
        let mut exec = VulkanExec::separate(engine, &rec, false).unwrap();
        let mut cpu = cpu(&rec);
        for (t, len, lo, hi) in [
            (x, op.input_len(), -1.0, 1.0),
            (w, op.weight_len(), -0.5, 0.5),
            (b, op.bias_len(), -0.5, 0.5),
            (skip, op.output_len(), -2.0, 2.0),
        ] {
            let v = random_vec(&mut rng, len, lo, hi);
            exec.write_f32(t, &v).unwrap();
            cpu.write_f32(t, &v).unwrap();
        }
        exec.run(0).unwrap();
        cpu.run(0).unwrap();
        let kernel = pointwise_kernel(&op, direct);
        assert_eq!(exec.kernels(0), [(kernel, 0)], "direct {direct}");
        let want = cpu_read(&mut cpu, out, op.output_len());
        close(
            &format!("out, direct {direct}"),
            &read(&mut exec, out, op.output_len()),
            &want,
        );
        assert_clean(exec.engine());
    }
}

/// A residual add after a nearest upsampling (det-s's neck), folded into the upsampling's
/// store: one dispatch, the CPU twin's result of the two steps.
#[test]
fn a_residual_add_in_the_upsampling_store_matches_the_cpu_twin() {
    let mut rng = SplitMix64::new(19);
    let mut rec = Recording::new();
    let op = Upsample2x {
        n: 2,
        c: 3,
        h: 5,
        w: 7,
    };
    let x = rec.f32("x", op.input_len(), Role::Input);
    let y = rec.f32("y", op.output_len(), Role::Activation);
    let skip = rec.f32("skip", op.output_len(), Role::Input);
    let out = rec.f32("out", op.output_len(), Role::Output);
    rec.entry(
        "neck",
        vec![
            Step::UpsampleForward { op, x, y },
            Step::Add {
                op: Add {
                    len: op.output_len() as u32,
                },
                a: skip,
                b: y,
                out,
            },
        ],
    );
    let Some(mut exec) = gpu("upsample_skip", &rec) else {
        return;
    };
    let mut cpu = cpu(&rec);
    for (t, len) in [(x, op.input_len()), (skip, op.output_len())] {
        let v = random_vec(&mut rng, len, -1.0, 1.0);
        exec.write_f32(t, &v).unwrap();
        cpu.write_f32(t, &v).unwrap();
    }
    exec.run(0).unwrap();
    cpu.run(0).unwrap();
    assert_eq!(exec.kernels(0), [("upsample", 0)]);
    let want = cpu_read(&mut cpu, out, op.output_len());
    close("out", &read(&mut exec, out, op.output_len()), &want);
    assert_clean(exec.engine());
}

/// The stem reading the records (its normalisation folded in, `conv2d_rgb`,
/// `conv2d_quad_rgb` and `conv2d_direct_rgb`): one dispatch, the CPU twin's result of the two
/// steps, flipped or not, records with odd padding between them (the bytes are read as words).
#[test]
fn a_stem_reading_the_records_matches_the_cpu_twin() {
    let small = (2, 14, 18);
    // Enough output pixels for four an invocation on GPUs (QUAD_MIN_PIXELS).
    let batch = (16, 128, 128);
    // (size, flip, direct, fp16): the fp16 variants on the GPUs' kernels.
    for ((n, h, w), flip, direct, fp16) in [
        (small, false, false, false),
        (small, true, false, false),
        (small, false, true, false),
        (small, true, true, false),
        (batch, true, false, false),
        (batch, true, true, false),
        (small, true, false, true),
        (batch, false, false, true),
    ] {
        let op = Conv2d::dense(n, 3, h, w, 16, 3, 2, true);
        let norm = Normalize {
            n,
            h,
            w,
            record_stride: h * w * 3 + 5,
            flip,
        };
        let mut rng = SplitMix64::new(23);
        let mut rec = Recording::new();
        let records = rec.tensor("records", norm.input_bytes(), Elem::Bytes, Role::Input);
        let x = rec.f32("x", op.input_len(), Role::Activation);
        let w = rec.f32("w", op.weight_len(), Role::Param);
        let b = rec.f32("b", op.bias_len(), Role::Param);
        let y = rec.f32("y", op.output_len(), Role::Output);
        rec.entry(
            "stem",
            vec![
                Step::Normalize {
                    op: norm,
                    records,
                    out: x,
                },
                Step::ConvForward { op, x, w, b, y },
            ],
        );
        let engine = if fp16 {
            fp16_engine("stem_rgb_f16")
        } else {
            let options = super::Options {
                direct: Some(direct),
                ..super::testing::options()
            };
            super::testing::engine_with_options("stem_rgb", &options)
        };
        let Some(engine) = engine else {
            return;
        };
        let mut exec = VulkanExec::separate(engine, &rec, false).unwrap();
        let mut cpu = cpu(&rec);
        let bytes: Vec<u8> = (0..norm.input_bytes())
            .map(|_| rng.next_u64() as u8)
            .collect();
        exec.write_bytes(records, &bytes).unwrap();
        cpu.write_bytes(records, &bytes).unwrap();
        for (t, len) in [(w, op.weight_len()), (b, op.bias_len())] {
            let v = random_vec(&mut rng, len, -0.5, 0.5);
            exec.write_f32(t, &v).unwrap();
            cpu.write_f32(t, &v).unwrap();
        }
        exec.run(0).unwrap();
        cpu.run(0).unwrap();
        let kernel = format!(
            "{}_rgb{}",
            dense_kernel(&op, direct),
            if fp16 { "_f16" } else { "" }
        );
        assert_eq!(exec.kernels(0), [(kernel.as_str(), 1)], "flip {flip}");
        let want = cpu_read(&mut cpu, y, op.output_len());
        let got = read(&mut exec, y, op.output_len());
        let name = format!("{kernel}, flip {flip}");
        if fp16 {
            assert_f16_close(&name, &got, &want);
        } else {
            close(&name, &got, &want);
        }
        assert_clean(exec.engine());
    }
}

/// Gradient-norm clipping: six gradients of awkward lengths (one dispatch of four sums and
/// one of two), the clip, and AdamW and SGD reading the scale; with a limit the norm exceeds
/// and one it does not.
#[test]
fn gradient_clipping_matches_the_cpu_twin() {
    use crate::compute::ops::{GradClip, SumSquares, CLIP_SCALE};
    let mut rng = SplitMix64::new(41);
    let lens = [5usize, 300, 1, 7001, 33, 257];
    for (max_norm, subgroups) in [(1.0f32, true), (1e4, true), (1.0, false), (1e4, false)] {
        let mut rec = Recording::new();
        let grads: Vec<TensorId> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| rec.f32(&format!("grad{i}"), n, Role::Input))
            .collect();
        let op = GradClip {
            tensors: lens.len() as u32,
            max_norm,
        };
        let sums = rec.f32("sums", op.sums_len(), Role::Output);
        let hyper = rec.f32("hyper", HYPER_LEN, Role::Input);
        let n = lens[3];
        let adam = AdamW {
            len: n as u32,
            lr: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step: 1,
        };
        let (param, m, v) = (
            rec.f32("param", n, Role::Param),
            rec.f32("m", n, Role::State),
            rec.f32("v", n, Role::State),
        );
        let (sparam, vel) = (
            rec.f32("sparam", n, Role::Param),
            rec.f32("vel", n, Role::State),
        );
        let mut steps: Vec<Step> = grads
            .iter()
            .enumerate()
            .map(|(slot, &x)| Step::SumSquares {
                op: SumSquares {
                    len: lens[slot] as u32,
                    slot: slot as u32,
                    tensors: op.tensors,
                },
                x,
                sums,
            })
            .collect();
        steps.push(Step::ClipGrad { op, sums, hyper });
        steps.push(Step::AdamW {
            op: adam,
            param,
            grad: grads[3],
            m,
            v,
            hyper,
        });
        steps.push(Step::Sgd {
            op: SgdMomentum {
                len: n as u32,
                lr: 0.0,
                momentum: 0.9,
                weight_decay: 1e-3,
            },
            param: sparam,
            grad: grads[3],
            velocity: vel,
            hyper,
        });
        rec.entry("clip", steps);
        let kernels: Vec<_> = super::lower::lower(&rec).unwrap().entries[0]
            .iter()
            .map(|d| d.kernel.name())
            .collect();
        assert_eq!(
            kernels,
            ["sum_squares", "sum_squares", "clip_grad", "adamw", "sgd"]
        );
        let Some((mut exec, subgroups)) = gpu_subgroups("gradient_clipping", &rec, subgroups)
        else {
            return;
        };
        let sums_kernel = if subgroups {
            "sum_squares_subgroup"
        } else {
            "sum_squares"
        };
        assert_eq!(exec.kernels(0)[0].0, sums_kernel);
        let mut cpu = cpu(&rec);
        for t in grads.iter().copied().chain([param, sparam]) {
            let data = random_vec(&mut rng, rec.get(t).len, -0.5, 0.5);
            exec.write_f32(t, &data).unwrap();
            cpu.write_f32(t, &data).unwrap();
        }
        for step in 1..=2u32 {
            let h = AdamW {
                step,
                lr: 1e-2,
                ..adam
            }
            .hyper();
            exec.write_f32(hyper, &h).unwrap();
            cpu.write_f32(hyper, &h).unwrap();
            exec.run(0).unwrap();
            cpu.run(0).unwrap();
            let got = read(&mut exec, sums, op.sums_len());
            close("sums", &got, &cpu_read(&mut cpu, sums, op.sums_len()));
            // The norm of the values written (about 0.29 · √7597 ≈ 25), and the limit bites
            // only below it.
            assert!((20.0..30.0).contains(&got[0]), "{got:?}");
            assert_eq!(got[CLIP_SCALE] < 1.0, max_norm < got[0], "{got:?}");
            for t in [param, m, v, sparam, vel] {
                let len = rec.get(t).len;
                let name = format!("{} after step {step}, limit {max_norm}", rec.get(t).name);
                close(&name, &read(&mut exec, t, len), &cpu_read(&mut cpu, t, len));
            }
        }
        assert_clean(exec.engine());
    }
}

/// The elementwise and optimizer kernels against the CPU engine, those that allow it compiled
/// per shape and with the shape in push constants ([`super::Options::specialise`]).
#[test]
fn elementwise_kernels_match_the_reference() {
    for specialise in [true, false] {
        elementwise_kernels_with(specialise);
    }
}

fn elementwise_kernels_with(specialise: bool) {
    let mut rng = SplitMix64::new(12);
    let mut rec = Recording::new();
    let add = Add { len: 1001 };
    let a = rec.f32("a", 1001, Role::Input);
    let b = rec.f32("b", 1001, Role::Input);
    let sum = rec.f32("sum", 1001, Role::Output);
    let acc = rec.f32("acc", 1001, Role::Output);
    // Whole vec4s: the direct kernels' vec4 variants on CPU-type devices.
    let add4 = Add { len: 1000 };
    let a4 = rec.f32("a4", 1000, Role::Input);
    let b4 = rec.f32("b4", 1000, Role::Input);
    let sum4 = rec.f32("sum4", 1000, Role::Output);
    let acc4 = rec.f32("acc4", 1000, Role::Output);
    let up = Upsample2x {
        n: 2,
        c: 3,
        h: 5,
        w: 7,
    };
    let ux = rec.f32("ux", up.input_len(), Role::Input);
    let uy = rec.f32("uy", up.output_len(), Role::Output);
    let ugy = rec.f32("ugy", up.output_len(), Role::Input);
    let ugx = rec.f32("ugx", up.input_len(), Role::Output);
    let norms = [false, true].map(|flip| Normalize {
        n: 3,
        h: 5,
        w: 7,
        record_stride: 5 * 7 * 3 + 9,
        flip,
    });
    let records = rec.tensor(
        "records",
        norms[0].input_bytes() + 3,
        Elem::Bytes,
        Role::Input,
    );
    let outs = [0, 1].map(|i| rec.f32(&format!("norm{i}"), norms[0].output_len(), Role::Output));
    let adam = AdamW {
        len: 777,
        lr: 0.0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
    };
    let sgd = SgdMomentum {
        len: 777,
        lr: 0.0,
        momentum: 0.9,
        weight_decay: 1e-3,
    };
    let param = rec.f32("param", 777, Role::Param);
    let grad = rec.f32("grad", 777, Role::Input);
    let m = rec.f32("m", 777, Role::State);
    let v = rec.f32("v", 777, Role::State);
    let sparam = rec.f32("sparam", 777, Role::Param);
    let vel = rec.f32("vel", 777, Role::State);
    let average = rec.f32("ema", 777, Role::State);
    let hyper = rec.f32("hyper", HYPER_LEN, Role::Input);
    let mut steps = vec![
        Step::Add {
            op: add,
            a,
            b,
            out: sum,
        },
        Step::Add {
            op: add,
            a,
            b,
            out: acc,
        },
        Step::AddAssign {
            op: add,
            dst: acc,
            src: sum,
        },
        Step::Add {
            op: add4,
            a: a4,
            b: b4,
            out: sum4,
        },
        Step::Add {
            op: add4,
            a: b4,
            b: a4,
            out: acc4,
        },
        Step::AddAssign {
            op: add4,
            dst: acc4,
            src: sum4,
        },
        Step::UpsampleForward {
            op: up,
            x: ux,
            y: uy,
        },
        Step::UpsampleBackward {
            op: up,
            gy: ugy,
            gx: ugx,
        },
    ];
    for (op, out) in norms.iter().zip(outs) {
        steps.push(Step::Normalize {
            op: *op,
            records,
            out,
        });
    }
    steps.push(Step::AdamW {
        op: adam,
        param,
        grad,
        m,
        v,
        hyper,
    });
    steps.push(Step::Ema {
        op: Ema { len: 777 },
        param,
        ema: average,
        hyper,
    });
    steps.push(Step::Sgd {
        op: sgd,
        param: sparam,
        grad,
        velocity: vel,
        hyper,
    });
    rec.entry("all", steps);
    let options = super::Options {
        specialise,
        ..super::testing::options()
    };
    let Some(engine) = super::testing::engine_with_options("elementwise_kernels", &options) else {
        return;
    };
    let mut exec = VulkanExec::separate(engine, &rec, false).unwrap();
    // Per shape: the upsampling, its gradient and the two normalisations (mirrored or not).
    let shaped = exec
        .pipelines()
        .iter()
        .filter(|p| !p.spec_constants().is_empty());
    assert_eq!(shaped.count(), if specialise { 4 } else { 0 });
    // The adds of whole vec4s take the vec4 kernels where the device takes direct ones.
    let kernels: Vec<&str> = exec.kernels(0).iter().map(|k| k.0).collect();
    let vec4 = exec.engine().variants().direct;
    let adds = if vec4 {
        [
            "add",
            "add",
            "add_assign",
            "add_direct4",
            "add_direct4",
            "add_assign_direct4",
        ]
    } else {
        ["add", "add", "add_assign", "add", "add", "add_assign"]
    };
    assert_eq!(kernels[..6], adds);
    let mut cpu = cpu(&rec);
    for t in [a, b, a4, b4, ux, ugy, param, sparam, grad, average] {
        let len = rec.get(t).len;
        let data = random_vec(&mut rng, len, -2.0, 2.0);
        exec.write_f32(t, &data).unwrap();
        cpu.write_f32(t, &data).unwrap();
    }
    let bytes: Vec<u8> = (0..rec.get(records).len)
        .map(|_| (rng.next_u64() >> 56) as u8)
        .collect();
    exec.write_bytes(records, &bytes).unwrap();
    cpu.write_bytes(records, &bytes).unwrap();
    // Three optimizer steps with a changing learning rate: state carries over and the
    // bias corrections come from `hyper` each time.
    for step in 1..=3u32 {
        let h = AdamW {
            step,
            lr: 1e-2 * step as f32,
            ..adam
        }
        .hyper();
        exec.write_f32(hyper, &h).unwrap();
        cpu.write_f32(hyper, &h).unwrap();
        exec.run(0).unwrap();
        cpu.run(0).unwrap();
        for t in [
            sum, acc, sum4, acc4, uy, ugx, outs[0], outs[1], param, m, v, average, sparam, vel,
        ] {
            let name = &rec.get(t).name;
            let got = read(&mut exec, t, rec.get(t).len);
            let want = cpu_read(&mut cpu, t, rec.get(t).len);
            close(&format!("{name} after step {step}"), &got, &want);
        }
    }
    assert_clean(exec.engine());
}

/// `n` records of `layout`: random image bytes, and random boxes `4 + size(U(0, 1))` px on a
/// side inside a `side`-px image.
fn records_with_boxes_sized(
    rng: &mut SplitMix64,
    n: usize,
    side: u32,
    classes: u32,
    layout: &crate::format::RecordLayout,
    size: impl Fn(f32) -> f32,
) -> Vec<u8> {
    use crate::format::{RecordBox, RecordMeta};
    let mut out = vec![0u8; n * layout.record_size];
    for (i, rec) in out.chunks_exact_mut(layout.record_size).enumerate() {
        let image: Vec<u8> = (0..layout.image_bytes)
            .map(|_| (rng.next_u64() >> 56) as u8)
            .collect();
        let count = (rng.next_u64() % (u64::from(layout.max_boxes) + 1)) as usize;
        let s = side as f32;
        let boxes: Vec<RecordBox> = (0..count)
            .map(|_| {
                let w = 4.0 + size(rng.next_f32());
                let h = 4.0 + size(rng.next_f32());
                let x0 = rng.next_f32() * (s - w);
                let y0 = rng.next_f32() * (s - h);
                RecordBox {
                    class: (rng.next_u64() % u64::from(classes)) as u32,
                    x0,
                    y0,
                    x1: x0 + w,
                    y1: y0 + h,
                }
            })
            .collect();
        let meta = RecordMeta {
            index: i as u64,
            ..RecordMeta::default()
        };
        layout.encode(rec, &image, &meta, &boxes);
    }
    out
}

#[test]
fn targets_loss_and_loss_gradient_match_the_reference() {
    use crate::format::RecordLayout;
    const NEIGHBOUR_WEIGHT: f32 = 0.35;
    let mut rng = SplitMix64::new(13);
    // (batch, classes, grid, max boxes, levels): one loss part, 9·16·16 = 2304 cells in two,
    // and three levels (strides 8, 16, 32 over 128 px: 256 + 64 + 16 cells a plane, boxes
    // up to 124 px, so every level gets some).
    let shapes = [
        (3u32, 3u32, 8u32, 5u32, 1usize),
        (9, 2, 16, 12, 1),
        (4, 2, 16, 12, 3),
    ];
    let mut rec = Recording::new();
    let mut cases = Vec::new();
    let mut loss_ops = Vec::new();
    for (i, &(n, classes, grid, max_boxes, level_count)) in shapes.iter().enumerate() {
        let levels = if level_count == 1 {
            Levels::single(grid, grid, 8)
        } else {
            Levels::new(&[8, 16, 32], grid * 8, grid * 8)
        };
        let layout = RecordLayout::new(grid * 8, grid * 8, 3, max_boxes).unwrap();
        let records = rec.tensor(
            &format!("records{i}"),
            n as usize * layout.record_size,
            Elem::Bytes,
            Role::Input,
        );
        let mut steps = Vec::new();
        let mut outs = Vec::new();
        // Plain, and flipped with the centres' neighbours (which the loss then reads),
        // reaching three cells for the three levels' large boxes; then those neighbours at
        // most three in full (shared out in the boxes of more: a box spans up to six cells
        // of its level here).
        let reach = if level_count == 3 { 3 } else { 1 };
        let variants = [
            (false, 0.0, 0),
            (true, NEIGHBOUR_WEIGHT, 0),
            (true, NEIGHBOUR_WEIGHT, 3),
        ];
        for (v, (flip, neighbour_weight, neighbour_cells)) in variants.into_iter().enumerate() {
            let op = Targets {
                n,
                classes,
                levels,
                max_boxes,
                record_stride: layout.record_size as u32,
                meta_offset: layout.image_bytes as u32,
                min_overlap: 0.7,
                flip,
                neighbour_weight,
                neighbour_radius: if flip { reach } else { 1 },
                neighbour_cells,
            };
            let out = rec.f32(&format!("targets{i}.{v}"), op.output_len(), Role::Output);
            steps.push(Step::Targets { op, records, out });
            outs.push(out);
        }
        let cells = levels.total_cells() as u32;
        let loss_op = CenterLoss {
            offset_weight: 0.5,
            size_weight: 2.0,
            giou_weight: 1.7,
            ..CenterLoss::det_s(n, classes, cells / grid, grid)
        };
        let pred = rec.f32(&format!("pred{i}"), loss_op.pred_len(), Role::Input);
        let loss = rec.f32(&format!("loss{i}"), LOSS_LEN, Role::Output);
        let grad = rec.f32(&format!("grad{i}"), loss_op.pred_len(), Role::Output);
        steps.push(Step::LossForward {
            op: loss_op,
            pred,
            target: outs[1],
            loss,
        });
        steps.push(Step::LossBackward {
            op: loss_op,
            pred,
            target: outs[1],
            loss,
            grad,
        });
        rec.entry(&format!("case{i}"), steps);
        cases.push((layout, records, outs, pred, loss, grad, n, classes, grid));
        loss_ops.push(loss_op);
    }
    // Case 1's loss alone (as an evaluation records it): its parts added by loss_finish, not
    // in the gradient's pass.
    let (_, _, outs, pred, ..) = &cases[1];
    let loss_alone = rec.f32("loss alone", LOSS_LEN, Role::Output);
    rec.entry(
        "loss alone",
        vec![Step::LossForward {
            op: loss_ops[1],
            pred: *pred,
            target: outs[1],
            loss: loss_alone,
        }],
    );
    // With the subgroup variants where the device has them, and with the plain kernels.
    for subgroups in [true, false] {
        let Some((mut exec, subgroups)) =
            gpu_subgroups("targets_loss_and_loss_gradient", &rec, subgroups)
        else {
            return;
        };
        let mut cpu = cpu(&rec);
        for (i, (layout, records, outs, pred, loss, grad, n, classes, grid)) in
            cases.iter().enumerate()
        {
            // Boxes up to the whole image in the three-level case, small ones the most.
            let spread = if i == 2 { 120.0 } else { (grid * 4) as f32 };
            let power = if i == 2 { 2 } else { 1 };
            let bytes =
                records_with_boxes_sized(&mut rng, *n as usize, grid * 8, *classes, layout, |u| {
                    u.powi(power) * spread
                });
            exec.write_bytes(*records, &bytes).unwrap();
            cpu.write_bytes(*records, &bytes).unwrap();
            // Logits over a wide range, so both tails of the focal loss are exercised.
            let p = random_vec(&mut rng, rec.get(*pred).len, -8.0, 8.0);
            exec.write_f32(*pred, &p).unwrap();
            cpu.write_f32(*pred, &p).unwrap();
            exec.run(i).unwrap();
            cpu.run(i).unwrap();
            for &t in outs.iter().chain([loss, grad]) {
                let name = &rec.get(t).name;
                let len = rec.get(t).len;
                close(name, &read(&mut exec, t, len), &cpu_read(&mut cpu, t, len));
            }
            let l = cpu_read(&mut cpu, *loss, LOSS_LEN);
            assert!(l[4] >= 1.0, "case {i}: some centres ({l:?})");
            let plane = rec.get(outs[1]).len / (*n as usize * (*classes as usize + 5));
            let mut masks = |t: usize| {
                let v = cpu_read(&mut cpu, outs[t], rec.get(outs[t]).len);
                (0..*n as usize)
                    .flat_map(|b| {
                        let at = (b * (*classes as usize + 5) + *classes as usize + 4) * plane;
                        v[at..at + plane].to_vec()
                    })
                    .collect::<Vec<f32>>()
            };
            let (plain, wide) = (masks(0), masks(1));
            assert!(plain.iter().all(|&m| m == 0.0 || m == 1.0), "case {i}");
            assert!(
                wide.iter()
                    .all(|&m| [0.0, NEIGHBOUR_WEIGHT, 1.0].contains(&m))
                    && wide.contains(&NEIGHBOUR_WEIGHT),
                "case {i}: neighbours"
            );
            let shared = masks(2);
            assert!(
                shared
                    .iter()
                    .all(|&m| m == 0.0 || m == 1.0 || (m > 0.0 && m <= NEIGHBOUR_WEIGHT)),
                "case {i}: shared neighbours"
            );
            // Case 0's few boxes need not have four neighbours.
            assert!(
                i == 0 || shared.iter().any(|&m| m > 0.0 && m < NEIGHBOUR_WEIGHT),
                "case {i}: neighbours shared out"
            );
            assert!(l[5] > 0.0, "case {i}: a GIoU term ({l:?})");
            // The loss in parts is finished in the gradient's pass.
            let parts = exec.kernels(i).iter().any(|k| k.0 == "loss_grad_finish");
            assert_eq!(parts, i == 1, "case {i}: the loss is split into parts");
            assert!(
                !exec.kernels(i).iter().any(|k| k.0 == "loss_finish"),
                "case {i}"
            );
            if i == 1 {
                // Finished on its own, the same loss to the bit.
                let alone = shapes.len();
                exec.run(alone).unwrap();
                assert!(exec.kernels(alone).iter().any(|k| k.0 == "loss_finish"));
                let fused = read(&mut exec, *loss, LOSS_LEN);
                assert_eq!(read(&mut exec, loss_alone, LOSS_LEN), fused);
                assert!(fused[0] > 0.0, "{fused:?}");
            }
            let first = if subgroups {
                "loss_partial_subgroup"
            } else {
                "loss_partial"
            };
            assert!(
                exec.kernels(i).iter().any(|k| k.0 == first),
                "case {i}: {first}"
            );
            if i == 2 {
                // Centres on every level.
                let t = cpu_read(&mut cpu, outs[0], rec.get(outs[0]).len);
                let plane = 256 + 64 + 16;
                let channels = *classes as usize + 5;
                let mask = |b: usize| &t[(b * channels + channels - 1) * plane..][..plane];
                for (l, range) in [0..256, 256..320, 320..336].into_iter().enumerate() {
                    assert!(
                        (0..*n as usize).any(|b| mask(b)[range.clone()].contains(&1.0)),
                        "case {i}: no centre on level {l}"
                    );
                }
            }
        }
        assert_clean(exec.engine());
    }
}

#[test]
fn row_copy_gathers_into_part_of_a_tensor_and_scatters_back() {
    let mut rng = SplitMix64::new(21);
    // Six rows of 37 into rows of 50 at offset 9 (one level's cells of a multi-level output),
    // then back.
    let gather = RowCopy::gather(6, 37, 50, 9, 296);
    let scatter = gather.reversed();
    let mut rec = Recording::new();
    let src = rec.f32("src", gather.src_len(), Role::Input);
    // Filled whole first (one row), then written in part.
    let fill = rec.f32("fill", gather.dst_len(), Role::Input);
    let whole = rec.f32("whole", gather.dst_len(), Role::Output);
    let back = rec.f32("back", scatter.dst_len(), Role::Output);
    let len = gather.dst_len() as u32;
    rec.entry(
        "copy",
        vec![
            Step::RowCopy {
                op: RowCopy::gather(1, len, len, 0, len),
                src: fill,
                dst: whole,
            },
            Step::RowCopy {
                op: gather,
                src,
                dst: whole,
            },
            Step::RowCopy {
                op: scatter,
                src: whole,
                dst: back,
            },
        ],
    );
    let Some(mut exec) = gpu("row_copy", &rec) else {
        return;
    };
    let mut cpu = cpu(&rec);
    let x = random_vec(&mut rng, rec.get(src).len, -1.0, 1.0);
    let filled = vec![-7.0; rec.get(whole).len];
    exec.write_f32(src, &x).unwrap();
    cpu.write_f32(src, &x).unwrap();
    exec.write_f32(fill, &filled).unwrap();
    cpu.write_f32(fill, &filled).unwrap();
    exec.run(0).unwrap();
    cpu.run(0).unwrap();
    let got = read(&mut exec, whole, filled.len());
    assert_eq!(got, cpu_read(&mut cpu, whole, filled.len()));
    assert_eq!(&got[..9], &[-7.0; 9], "before the first row: untouched");
    assert_eq!(&got[9..46], &x[..37]);
    assert_eq!(&got[46..59], &[-7.0; 13], "between rows: untouched");
    assert_eq!(&got[259..], &x[5 * 37..], "the last row");
    assert_eq!(read(&mut exec, back, x.len()), x);
    assert_clean(exec.engine());
}

#[test]
fn decode_matches_the_reference_in_order_and_values() {
    let mut rng = SplitMix64::new(14);
    let ops = [
        // Fewer candidates than top_k; more than top_k; a grid bigger than one sort window
        // (3·24·24 = 1728 cells > 1024 − 100), so the selection takes several rounds.
        Decode {
            n: 2,
            classes: 2,
            levels: Levels::single(5, 7, 8),
            threshold: 0.3,
            top_k: 100,
        },
        Decode {
            n: 3,
            classes: 3,
            levels: Levels::single(9, 8, 4),
            threshold: 0.0,
            top_k: 7,
        },
        Decode {
            n: 2,
            classes: 3,
            levels: Levels::single(24, 24, 8),
            threshold: 0.05,
            top_k: 100,
        },
        // Three levels over a 128 × 96 input: 16×12, 8×6 and 4×3 grids.
        Decode {
            n: 2,
            classes: 2,
            levels: Levels::new(&[8, 16, 32], 96, 128),
            threshold: 0.2,
            top_k: 50,
        },
    ];
    let mut rec = Recording::new();
    let mut ids = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let pred = rec.f32(&format!("pred{i}"), op.input_len(), Role::Input);
        let dets = rec.tensor(
            &format!("dets{i}"),
            op.output_len() * DETECTION_BYTES,
            Elem::Bytes,
            Role::Output,
        );
        let counts = rec.tensor(
            &format!("counts{i}"),
            4 * op.n as usize,
            Elem::Bytes,
            Role::Output,
        );
        rec.entry(
            &format!("case{i}"),
            vec![Step::Decode {
                op: *op,
                pred,
                dets,
                counts,
            }],
        );
        ids.push((pred, dets, counts));
    }
    let Some(mut exec) = gpu("decode", &rec) else {
        return;
    };
    let mut cpu = cpu(&rec);
    for (i, (op, &(pred, dets, counts))) in ops.iter().zip(&ids).enumerate() {
        let plane = op.levels.total_cells();
        let k = op.classes as usize;
        let mut p = random_vec(&mut rng, op.input_len(), -4.0, 2.0);
        // Plateaus of equal logits (two adjacent cells, and the same value on two classes):
        // equal scores, ordered by (class, y, x).
        for b in 0..op.n as usize {
            let img = &mut p[b * (k + 4) * plane..][..(k + 4) * plane];
            img[plane / 2] = 3.0;
            img[plane / 2 + 1] = 3.0;
            img[plane + 3] = 3.0;
            for v in &mut img[k * plane..(k + 2) * plane] {
                *v = v.abs() / 2.0;
            }
        }
        exec.write_f32(pred, &p).unwrap();
        cpu.write_f32(pred, &p).unwrap();
        exec.run(i).unwrap();
        cpu.run(i).unwrap();
        let (mut d, mut c) = (vec![0u8; rec.get(dets).len], vec![0u8; rec.get(counts).len]);
        exec.read_bytes(dets, &mut d).unwrap();
        exec.read_bytes(counts, &mut c).unwrap();
        let got = detections(&d, &c, op);
        let want = detections(
            &cpu_bytes(&mut cpu, dets, d.len()),
            &cpu_bytes(&mut cpu, counts, c.len()),
            op,
        );
        for (b, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "case {i} image {b}: detection count");
            assert!(
                !g.is_empty(),
                "case {i} image {b}: no detections to compare"
            );
            let classes: Vec<u32> = g.iter().map(|d| d.0).collect();
            let want_classes: Vec<u32> = w.iter().map(|d| d.0).collect();
            assert_eq!(
                classes, want_classes,
                "case {i} image {b}: classes in order"
            );
            let flat =
                |v: &Vec<(u32, [f32; 5])>| -> Vec<f32> { v.iter().flat_map(|d| d.1).collect() };
            close(
                &format!("case {i} image {b} detections"),
                &flat(g),
                &flat(w),
            );
        }
        if i == 1 {
            assert!(got.iter().all(|g| g.len() == 7), "top_k caps the count");
        }
    }
    assert_clean(exec.engine());
}

#[test]
fn memory_budget_is_checked_before_allocating() {
    use crate::format::RecordLayout;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::graph::ModelGraph;
    let arch = Arch::new(&ModelConfig::named("det-s", 2).unwrap());
    let layout = RecordLayout::new(128, 128, 3, 8).unwrap();
    let g = ModelGraph::build(&arch, 8, &layout, &GraphOptions::default()).unwrap();
    let needed = VulkanExec::needed_bytes(&g.recording).unwrap();
    let separate = crate::compute::storage::StoragePlan::separate(&g.recording).bytes();
    assert!(needed < separate, "intermediate tensors share buffers");
    let Some(engine) = engine("memory_budget") else {
        return;
    };
    let e = VulkanExec::new(engine, &g.recording, false, Some(needed - 1)).unwrap_err();
    assert!(
        matches!(e, super::exec::ExecError::OverBudget { needed: n, budget: b, .. }
            if n == needed && b == needed - 1),
        "{e}"
    );
    let e = e.to_string();
    assert!(e.contains(&format!("needs {needed} bytes")), "{e}");
    assert!(e.contains("over the memory budget"), "{e}");
    assert!(e.contains("the largest tensors: "), "{e}");
    assert!(
        e.contains("a batch of at most about 7 would fit (it is 8)"),
        "{e}"
    );
    let engine = super::testing::engine("memory_budget").unwrap();
    let e = VulkanExec::new(engine, &g.recording, false, Some(1000)).unwrap_err();
    assert!(e.to_string().contains("no batch fits"), "{e}");
    let engine = super::testing::engine("memory_budget").unwrap();
    let exec = VulkanExec::new(engine, &g.recording, false, Some(needed)).unwrap();
    assert_eq!(exec.bytes(), needed);
    let report = exec.engine().allocation_report();
    assert!(report.get("scratch.conv-partial").is_some());
    // The plan's buffers (tensors sharing where they may) and the two scratch buffers.
    let plan = VulkanExec::memory_plan(&g.recording).unwrap();
    assert_eq!(plan.total(), needed);
    let buffers = crate::compute::storage::StoragePlan::shared(&g.recording, &|e| {
        super::lower::joined_steps(&g.recording, e)
    });
    assert!(buffers.buffers.len() < g.recording.tensors.len());
    assert_eq!(report.buffers.len(), buffers.buffers.len() + 2);
    assert_clean(exec.engine());
}

/// Tolerance of the whole-model comparison: the [`TOL`] metric, looser because rounding
/// differences of ~100 kernels in a row (forward, backward through 19 convolutions, AdamW)
/// add up; measured worst on lavapipe about 1e-4 (the stem's weight gradient, a sum of
/// 8192 terms at the end of the chain).
const MODEL_TOL: f64 = 5e-4;
/// Gradients flow through ReLU masks: where a pre-activation is within rounding of 0, one
/// engine keeps the pixel and the other cuts it, and the gradients that pixel feeds differ
/// by its whole term: a few elements by much, sums over pixels (bias gradients) by a little.
/// Measured on an NVIDIA H200 (det-s at step 3, from the same state on both engines): one
/// element of grad.b5.dw.from102 off by 2.8e-2, three of grad.b5.dw.bias's 64 by up to
/// 1.4e-3, one of grad.b5.pw.weight by 8.8e-4, and AdamW's moments, which sum gradients,
/// by 1.1e-3. So gradients and optimizer state are held to GRAD_TOL, except
/// TIE_FRACTION of the elements (at least two), each within TIE_TOL; a wrong kernel is off
/// almost everywhere.
const GRAD_TOL: f64 = 4.0 * MODEL_TOL;
const TIE_FRACTION: f64 = 0.01;
const TIE_TOL: f64 = 0.1;

/// Compares every `f32` tensor `keep` selects; returns how many.
fn compare_tensors(
    what: &str,
    rec: &Recording,
    exec: &mut VulkanExec,
    cpu: &mut CpuExec,
    keep: impl Fn(&crate::compute::recording::Tensor) -> bool,
    tol: f64,
) -> usize {
    let mut compared = 0;
    for (i, t) in rec.tensors.iter().enumerate() {
        if t.elem != Elem::F32 || !keep(t) {
            continue;
        }
        let id = TensorId(i as u32);
        let got = read(exec, id, t.len);
        let want: Vec<f64> = cpu_read(cpu, id, t.len)
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let name = format!("{what}: {}", t.name);
        // Gradients, the optimizer state that sums them and the weights they update (a
        // gradient's ReLU tie moves its weight's AdamW step too).
        if t.name.starts_with("grad.") || matches!(t.role, Role::State | Role::Param) {
            assert_close_past_relu_ties(&name, &got, &want, tol.max(GRAD_TOL));
        } else {
            assert_close(&name, &got, &want, tol);
        }
        compared += 1;
    }
    compared
}

/// [`assert_close`]'s metric, allowing [`TIE_FRACTION`] of the elements (at least two) up
/// to [`TIE_TOL`].
fn assert_close_past_relu_ties(name: &str, got: &[f32], want: &[f64], tol: f64) {
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let floor = (1e-2 * scale).max(f64::MIN_POSITIVE);
    let errors: Vec<f64> = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(floor))
        .map(|e| if e.is_nan() { f64::INFINITY } else { e })
        .collect();
    let over = errors.iter().filter(|&&e| e > tol).count();
    let worst = errors.iter().copied().fold(0.0, f64::max);
    let allowed = ((got.len() as f64 * TIE_FRACTION) as usize).max(2);
    assert!(
        over <= allowed && worst <= TIE_TOL,
        "{name}: {over} of {} elements beyond {tol:.0e} (at most {allowed}, each within \
         {TIE_TOL}), worst {worst:.3e}",
        got.len()
    );
}

/// Copies every parameter and optimizer state tensor (weights, AdamW moments, the weight
/// average) from the GPU into the CPU engine.
fn sync_trained_state(rec: &Recording, exec: &mut VulkanExec, cpu: &mut CpuExec) {
    for (i, t) in rec.tensors.iter().enumerate() {
        if matches!(t.role, Role::Param | Role::State) {
            let id = TensorId(i as u32);
            cpu.write_f32(id, &read(exec, id, t.len)).unwrap();
        }
    }
}

#[test]
fn det_s_train_steps_match_the_cpu() {
    train_steps_match_the_cpu("det-s", |u| u * 64.0, GraphOptions::default());
}

/// Three output levels (strides 8, 16, 32 over 128 px), the levels gathered into one output
/// and the gradient scattered back; boxes of every size, so every level trains. With the
/// gradients' norm clipped (at a limit the first steps exceed) and the box regression
/// trained at the centres' neighbours too (three cells out, at most eight in full).
#[test]
fn det_m_train_steps_match_the_cpu() {
    let options = GraphOptions {
        clip_norm: Some(15.0),
        neighbour_weight: 0.5,
        neighbour_radius: 3,
        neighbour_cells: 8,
        ..GraphOptions::default()
    };
    train_steps_match_the_cpu("det-m", |u| u * u * 120.0, options);
}

/// Fine-tuning with the backbone frozen: the GPU's step of the neck and heads matches the
/// CPU's, and the backbone's weights stay as they were.
#[test]
fn det_m_train_steps_with_a_frozen_backbone_match_the_cpu() {
    let options = GraphOptions {
        freeze: crate::model::Freeze::Backbone,
        ..GraphOptions::default()
    };
    train_steps_match_the_cpu("det-m", |u| u * u * 120.0, options);
}

/// Fine-tuning with the stride-8 blocks frozen (`early`): the deeper blocks train on the
/// output of frozen ones, which get no input gradient, and the GPU's step matches the CPU's.
#[test]
fn det_m_train_steps_with_the_early_blocks_frozen_match_the_cpu() {
    let options = GraphOptions {
        freeze: crate::model::Freeze::Early,
        ..GraphOptions::default()
    };
    train_steps_match_the_cpu("det-m", |u| u * u * 120.0, options);
}

/// The same with the frozen backbone's biases training: its layers' bias gradients alone
/// (`conv_grad_bias`) and input gradients through them match the CPU's, and their weights
/// stay as they were.
#[test]
fn det_m_train_steps_with_the_biases_of_a_frozen_backbone_match_the_cpu() {
    let options = GraphOptions {
        freeze: crate::model::Freeze::Backbone,
        train_biases: true,
        ..GraphOptions::default()
    };
    train_steps_match_the_cpu("det-m", |u| u * u * 120.0, options);
}

/// The tensors entry `entry` never writes on the GPU: the outputs of pointwise convs and
/// upsamplings whose add is in their store, and the normalised input a stem reading the
/// records skips.
fn unwritten_by_fusion(rec: &Recording, entry: usize) -> Vec<&str> {
    let stems = super::lower::normalized_stems(rec, entry);
    crate::compute::fusion::residual_adds(rec, entry)
        .iter()
        .zip(stems)
        .zip(&rec.entries[entry].steps)
        .filter_map(|((add, stem), step)| match (add, stem, step) {
            (Some(_), _, Step::ConvForward { y, .. } | Step::UpsampleForward { y, .. })
            | (_, true, Step::Normalize { out: y, .. }) => Some(rec.get(*y).name.as_str()),
            _ => None,
        })
        .collect()
}

/// Three training steps of `model` at 128 px, batch 2, on the GPU (a buffer per tensor and
/// shared buffers) and the CPU: every tensor matches; then evaluation, inference, decode.
/// With a gradient-norm limit in `options`, every step must reach it.
fn train_steps_match_the_cpu(model: &str, box_size: impl Fn(f32) -> f32, options: GraphOptions) {
    use crate::format::RecordLayout;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::graph::{ModelGraph, ENTRY_EVAL, ENTRY_INFER, ENTRY_TRAIN};
    use crate::model::init::init_params;
    let arch = Arch::new(&ModelConfig::named_at(model, 2, 128).unwrap());
    let layout = RecordLayout::new(128, 128, 3, 8).unwrap();
    let clip = options.clip_norm;
    let g = ModelGraph::build(&arch, 2, &layout, &options).unwrap();
    let rec = &g.recording;
    let test = format!("{model}_train_steps");
    let Some(mut exec) = gpu(&test, rec) else {
        return;
    };
    // The same on the engine as it trains: intermediate tensors sharing buffers.
    let mut shared = VulkanExec::new(engine(&test).unwrap(), rec, false, None).unwrap();
    assert!(shared.bytes() < exec.bytes() * 2 / 3, "buffers are shared");
    let mut cpu = cpu(rec);
    for (p, v) in g.params.iter().zip(init_params(&arch, 7)) {
        for t in [Some(p.value), p.ema].into_iter().flatten() {
            exec.write_f32(t, &v).unwrap();
            shared.write_f32(t, &v).unwrap();
            cpu.write_f32(t, &v).unwrap();
        }
    }
    let mut rng = SplitMix64::new(15);
    let records = records_with_boxes_sized(&mut rng, 2, 128, 2, &layout, box_size);
    exec.write_bytes(g.records, &records).unwrap();
    shared.write_bytes(g.records, &records).unwrap();
    cpu.write_bytes(g.records, &records).unwrap();
    let train = g.entry(ENTRY_TRAIN);
    // The neck's upsampling takes the add after it into its store, in training too (its
    // backward pass does not read its output), so its own output is never written; nor is
    // the normalised input, which the stem reads from the records (the backward pass
    // normalises again, into a tensor of its own).
    let trained_past = unwritten_by_fusion(rec, train);
    // Every layer's activations are read by the backward pass (or the frozen ones' too,
    // where their biases train).
    let backward_through_all = options.freeze == crate::model::Freeze::None || options.train_biases;
    if backward_through_all {
        assert_eq!(trained_past, ["input", "neck.up"]);
    } else {
        // A frozen backbone runs as inference does: a residual block's pointwise conv
        // takes the add after it into its store, as the backward pass reads neither.
        let (backbone, rest): (Vec<&str>, Vec<&str>) =
            trained_past.iter().partition(|n| n.starts_with('b'));
        assert_eq!(rest, ["input", "neck.up"]);
        assert!(
            backbone.len() >= 3 && backbone.iter().all(|n| n.ends_with(".pw")),
            "{backbone:?}"
        );
    }
    // The input gradients the GPU masks in their store (the layer before has a ReLU), and
    // the tensor each is masked by.
    let (stores, _) = super::lower::gradient_masks(rec, train);
    let masked: Vec<(TensorId, TensorId)> = rec.entries[train]
        .steps
        .iter()
        .zip(&stores)
        .filter_map(|(step, store)| match (step, store) {
            (&Step::ConvBackward { x, gx: Some(g), .. }, Some(_)) => Some((g, x)),
            _ => None,
        })
        .collect();
    // (Those are the backbone's: none where it is frozen.)
    let least = if backward_through_all { 3 } else { 0 };
    assert!(masked.len() >= least, "{}", masked.len());
    let mut losses = Vec::new();
    for step in 1..=3u32 {
        // Each step starts the CPU from the GPU's weights, moments and average, so each
        // comparison is of one step's kernels. Left to train apart, the engines' rounding
        // compounds: AdamW's early updates are about ±lr whatever a gradient's size, so a
        // tiny gradient rounded to the other sign moves its weight 2·lr away (an NVIDIA H200
        // measured 2.8e-2 on a gradient at step 3 that way).
        sync_trained_state(rec, &mut exec, &mut cpu);
        let adam = AdamW {
            len: 1,
            lr: 1e-3,
            beta1: options.beta1,
            beta2: options.beta2,
            eps: options.eps,
            weight_decay: options.weight_decay,
            step,
        };
        let hyper = adam.hyper();
        exec.write_f32(g.hyper, &hyper).unwrap();
        shared.write_f32(g.hyper, &hyper).unwrap();
        cpu.write_f32(g.hyper, &hyper).unwrap();
        exec.run(train).unwrap();
        shared.run(train).unwrap();
        cpu.run(train).unwrap();
        let loss = read(&mut exec, g.loss, LOSS_LEN);
        let want = cpu_read(&mut cpu, g.loss, LOSS_LEN);
        close(&format!("loss of step {step}"), &loss, &want);
        losses.push(loss[0]);
        if let Some(sums) = g.grad_norm {
            // [norm, scale, ...]: the comparison below covers them; the limit must bite.
            let [norm, scale] = read(&mut exec, sums, 2 + g.params.len())[..2] else {
                unreachable!()
            };
            assert!(
                norm > clip.unwrap() && scale < 1.0,
                "step {step}: {norm} {scale}"
            );
        }
        // Sharing buffers changes no number: the same kernels in the same order.
        assert_eq!(read(&mut shared, g.loss, LOSS_LEN), loss, "step {step}");
        for (i, t) in rec.tensors.iter().enumerate() {
            if matches!(t.role, Role::Param | Role::State) {
                let id = TensorId(i as u32);
                assert_eq!(
                    read(&mut shared, id, t.len),
                    read(&mut exec, id, t.len),
                    "{} after step {step}",
                    t.name
                );
            }
        }
        // Every activation, target and gradient of the step, then the updated parameters
        // and AdamW moments.
        let what = format!("step {step}");
        let written = |t: &crate::compute::recording::Tensor| {
            !trained_past.contains(&t.name.as_str())
                && !masked.iter().any(|&(g, _)| rec.get(g).name == t.name)
        };
        let n = compare_tensors(&what, rec, &mut exec, &mut cpu, written, MODEL_TOL);
        assert_eq!(
            n,
            rec.tensors.len() - 3 - trained_past.len() - masked.len(),
            "all but records, detections, counts, what a fused dispatch skips and the \
             gradients masked in their store"
        );
        // Those against the CPU's (which runs every step alone) as the next layer masks them.
        for &(g, by) in &masked {
            let len = rec.get(g).len;
            let by = cpu_read(&mut cpu, by, len);
            let want: Vec<f64> = cpu_read(&mut cpu, g, len)
                .iter()
                .zip(&by)
                .map(|(&v, &b)| if b > 0.0 { f64::from(v) } else { 0.0 })
                .collect();
            let name = format!("{what}: {} (masked)", rec.get(g).name);
            assert_close_past_relu_ties(&name, &read(&mut exec, g, len), &want, GRAD_TOL);
        }
    }
    assert!(
        losses[2] < losses[0],
        "three steps on one batch lower its loss: {losses:?}"
    );

    // Evaluation and inference on the trained weights: the loss and the network output,
    // and the detections as the CPU decodes the GPU's own output (decode compares logits
    // exactly, so it is fed the same numbers).
    sync_trained_state(rec, &mut exec, &mut cpu);
    let eval = g.entry(ENTRY_EVAL);
    exec.run(eval).unwrap();
    cpu.run(eval).unwrap();
    let want = cpu_read(&mut cpu, g.loss, LOSS_LEN);
    close("eval loss", &read(&mut exec, g.loss, LOSS_LEN), &want);
    let infer = g.entry(ENTRY_INFER);
    exec.run(infer).unwrap();
    cpu.run(infer).unwrap();
    let unwritten = unwritten_by_fusion(rec, infer);
    assert!(!unwritten.is_empty(), "inference folds residual adds");
    let outputs = |t: &crate::compute::recording::Tensor| {
        t.role != Role::Param
            && t.role != Role::State
            && !t.name.starts_with("grad.")
            && !unwritten.contains(&t.name.as_str())
    };
    let n = compare_tensors("infer", rec, &mut exec, &mut cpu, outputs, MODEL_TOL);
    assert!(n > 20, "{n} tensors compared");
    let pred = read(&mut exec, g.pred, rec.get(g.pred).len);
    let (mut want_d, mut want_c) = (
        vec![0u8; rec.get(g.dets).len],
        vec![0u8; rec.get(g.counts).len],
    );
    let mut scratch = Vec::with_capacity(cpu::decode::scratch_len(&g.decode));
    cpu::decode::decode_into_bytes(&g.decode, &pred, &mut scratch, &mut want_d, &mut want_c);
    let (mut d, mut c) = (vec![0u8; want_d.len()], vec![0u8; want_c.len()]);
    exec.read_bytes(g.dets, &mut d).unwrap();
    exec.read_bytes(g.counts, &mut c).unwrap();
    let got = detections(&d, &c, &g.decode);
    let want = detections(&want_d, &want_c, &g.decode);
    for (b, (got, want)) in got.iter().zip(&want).enumerate() {
        assert!(!got.is_empty(), "image {b}: detections");
        let classes = |v: &Vec<(u32, [f32; 5])>| v.iter().map(|d| d.0).collect::<Vec<_>>();
        assert_eq!(classes(got), classes(want), "image {b}: classes in order");
        let flat = |v: &Vec<(u32, [f32; 5])>| v.iter().flat_map(|d| d.1).collect::<Vec<_>>();
        close(&format!("image {b} detections"), &flat(got), &flat(want));
    }
    assert_clean(exec.engine());
    // Shared buffers are where a barrier left out wrongly would show (synchronization
    // validation is on): a tensor's buffer reused by a later one.
    assert_clean(shared.engine());
}

/// Tolerance of the finite-difference checks: `compute::cpu::gradcheck`'s loose check of an
/// `f32` kernel against central differences of itself (`h = 1e-2`), `1e-2` relative.
const FD_TOL: f64 = 1e-2;
const FD_STEP: f32 = 1e-2;

#[test]
fn conv_and_upsample_gradients_match_central_differences_on_the_gpu() {
    use crate::compute::cpu::gradcheck::numeric_grad_f32;
    let mut rng = SplitMix64::new(16);
    // Small shapes (every coordinate costs two GPU runs); no ReLU, whose kinks a 1e-2 step
    // would cross (the mask is checked against the CPU twin above).
    let convs = [
        Conv2d::dense(1, 2, 5, 4, 3, 3, 2, false),
        Conv2d {
            groups: 2,
            ..Conv2d::dense(1, 4, 4, 3, 2, 3, 1, false)
        },
        Conv2d::pointwise(2, 3, 3, 2, 4, false),
        Conv2d::depthwise(1, 2, 5, 5, 3, 2, false),
    ];
    let up = Upsample2x {
        n: 1,
        c: 2,
        h: 3,
        w: 2,
    };
    let mut rec = Recording::new();
    let mut ids = Vec::new();
    for (i, &op) in convs.iter().enumerate() {
        let t =
            |rec: &mut Recording, name: &str, len, role| rec.f32(&format!("{name}{i}"), len, role);
        let (x, w) = (
            t(&mut rec, "x", op.input_len(), Role::Input),
            t(&mut rec, "w", op.weight_len(), Role::Input),
        );
        let b = t(&mut rec, "b", op.bias_len(), Role::Input);
        let y = t(&mut rec, "y", op.output_len(), Role::Output);
        let gy = t(&mut rec, "gy", op.output_len(), Role::Input);
        let (gx, gw, gb) = (
            t(&mut rec, "gx", op.input_len(), Role::Output),
            t(&mut rec, "gw", op.weight_len(), Role::Output),
            t(&mut rec, "gb", op.bias_len(), Role::Output),
        );
        let fwd = rec.entry(
            &format!("fwd{i}"),
            vec![Step::ConvForward { op, x, w, b, y }],
        );
        let bwd = rec.entry(
            &format!("bwd{i}"),
            vec![Step::ConvBackward {
                op,
                x,
                w,
                y,
                gy,
                gx: Some(gx),
                gw: Some(gw),
                gb,
            }],
        );
        ids.push((op, [x, w, b], [gx, gw, gb], y, gy, fwd, bwd));
    }
    let (ux, uy) = (
        rec.f32("ux", up.input_len(), Role::Input),
        rec.f32("uy", up.output_len(), Role::Output),
    );
    let (ugy, ugx) = (
        rec.f32("ugy", up.output_len(), Role::Input),
        rec.f32("ugx", up.input_len(), Role::Output),
    );
    let up_fwd = rec.entry(
        "up",
        vec![Step::UpsampleForward {
            op: up,
            x: ux,
            y: uy,
        }],
    );
    let up_bwd = rec.entry(
        "up-bwd",
        vec![Step::UpsampleBackward {
            op: up,
            gy: ugy,
            gx: ugx,
        }],
    );
    let Some(mut exec) = gpu("gradients_match_central_differences", &rec) else {
        return;
    };
    // L = Σ r·y for a fixed random r: dL/dy = r, the output gradient fed to the backward pass.
    let dot = |a: &[f32], b: &[f32]| -> f64 {
        a.iter()
            .zip(b)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum()
    };
    for (op, inputs, grads, y, gy, fwd, bwd) in ids {
        let values: Vec<Vec<f32>> = inputs
            .iter()
            .map(|&t| random_vec(&mut rng, rec.get(t).len, -1.0, 1.0))
            .collect();
        for (&t, v) in inputs.iter().zip(&values) {
            exec.write_f32(t, v).unwrap();
        }
        let r = random_vec(&mut rng, op.output_len(), -1.0, 1.0);
        exec.write_f32(gy, &r).unwrap();
        exec.run(bwd).unwrap();
        for (k, (&t, v)) in inputs.iter().zip(&values).enumerate() {
            let analytic = read(&mut exec, grads[k], v.len());
            let numeric = numeric_grad_f32(v, FD_STEP, |p| {
                exec.write_f32(t, p).unwrap();
                exec.run(fwd).unwrap();
                dot(&r, &read(&mut exec, y, op.output_len()))
            });
            exec.write_f32(t, v).unwrap();
            let name = ["gx", "gw", "gb"][k];
            assert_close(&format!("{name} of {op:?}"), &analytic, &numeric, FD_TOL);
        }
    }
    let x = random_vec(&mut rng, up.input_len(), -1.0, 1.0);
    let r = random_vec(&mut rng, up.output_len(), -1.0, 1.0);
    exec.write_f32(ugy, &r).unwrap();
    exec.run(up_bwd).unwrap();
    let analytic = read(&mut exec, ugx, x.len());
    let numeric = numeric_grad_f32(&x, FD_STEP, |p| {
        exec.write_f32(ux, p).unwrap();
        exec.run(up_fwd).unwrap();
        dot(&r, &read(&mut exec, uy, up.output_len()))
    });
    assert_close("upsample gx", &analytic, &numeric, FD_TOL);
    assert_clean(exec.engine());
}

#[test]
fn loss_gradient_matches_central_differences_on_the_gpu() {
    use crate::compute::cpu::gradcheck::numeric_grad_f32;
    let mut rng = SplitMix64::new(17);
    let op = CenterLoss {
        offset_weight: 0.7,
        size_weight: 1.3,
        giou_weight: 2.2,
        ..CenterLoss::det_s(2, 2, 4, 5)
    };
    let plane = (op.grid_h * op.grid_w) as usize;
    let k = op.classes as usize;
    let mut rec = Recording::new();
    let pred = rec.f32("pred", op.pred_len(), Role::Input);
    let target = rec.f32("target", op.target_len(), Role::Input);
    let loss = rec.f32("loss", LOSS_LEN, Role::Output);
    let grad = rec.f32("grad", op.pred_len(), Role::Output);
    let fwd = rec.entry(
        "fwd",
        vec![Step::LossForward {
            op,
            pred,
            target,
            loss,
        }],
    );
    let bwd = rec.entry(
        "bwd",
        vec![
            Step::LossForward {
                op,
                pred,
                target,
                loss,
            },
            Step::LossBackward {
                op,
                pred,
                target,
                loss,
                grad,
            },
        ],
    );
    let Some(mut exec) = gpu("loss_gradient_matches_central_differences", &rec) else {
        return;
    };
    // Targets: heat in [0, 1) with some cells exactly 1 (their centres, mask 1), offsets and
    // log sizes; predictions whose regression values stay 0.3–0.7 away from their targets
    // (no L1 kink within a step), drawn again until no box edge is within 0.1 of its target's
    // and the boxes overlap by more than that (no GIoU kink within a step either).
    let edges = |r: [f32; 4]| {
        let (w, h) = (r[2].exp(), r[3].exp());
        [
            r[0] - w / 2.0,
            r[1] - h / 2.0,
            r[0] + w / 2.0,
            r[1] + h / 2.0,
        ]
    };
    let clear_of_kinks = |p: [f32; 4], t: [f32; 4]| {
        let (a, b) = (edges(p), edges(t));
        let overlap = |lo: usize| a[lo + 2].min(b[lo + 2]) - a[lo].max(b[lo]);
        (0..4).all(|e| (a[e] - b[e]).abs() > 0.1) && overlap(0) > 0.1 && overlap(1) > 0.1
    };
    let mut t = random_vec(&mut rng, op.target_len(), 0.0, 0.9);
    let mut p = random_vec(&mut rng, op.pred_len(), -3.0, 3.0);
    for b in 0..op.n as usize {
        let (tb, pb) = (b * (k + 5) * plane, b * (k + 4) * plane);
        for cell in 0..plane {
            let centre = cell % 4 == b;
            t[tb + (k + 4) * plane + cell] = if centre { 1.0 } else { 0.0 };
            if centre {
                t[tb + (cell % k) * plane + cell] = 1.0;
            }
            let target: [f32; 4] = std::array::from_fn(|c| t[tb + (k + c) * plane + cell]);
            let mut draw = || {
                target.map(|v| {
                    let away = 0.3 + 0.4 * rng.next_f32();
                    v + if rng.next_f32() < 0.5 { -away } else { away }
                })
            };
            let guess = (0..1000)
                .map(|_| draw())
                .find(|&g| !centre || clear_of_kinks(g, target))
                .expect("a prediction clear of kinks");
            for (c, v) in guess.into_iter().enumerate() {
                p[pb + (k + c) * plane + cell] = v;
            }
        }
    }
    exec.write_f32(target, &t).unwrap();
    exec.write_f32(pred, &p).unwrap();
    exec.run(bwd).unwrap();
    let analytic = read(&mut exec, grad, p.len());
    // A wider step than FD_STEP: the loss is an f32 sum of several units, and the smallest
    // heat-map gradients need a difference above its rounding.
    let numeric = numeric_grad_f32(&p, 3.0 * FD_STEP, |q| {
        exec.write_f32(pred, q).unwrap();
        exec.run(fwd).unwrap();
        f64::from(read(&mut exec, loss, LOSS_LEN)[0])
    });
    assert_close("loss gradient", &analytic, &numeric, FD_TOL);
    assert_clean(exec.engine());
}

/// One entry per conv of `cases` (forward only) (`case{i}`: input, weight, bias, output).
fn conv_forward_entries(cases: &[Conv2d]) -> (Recording, Vec<[TensorId; 4]>) {
    let mut rec = Recording::new();
    let mut ids = Vec::new();
    for (i, op) in cases.iter().enumerate() {
        let t =
            |rec: &mut Recording, name: &str, len, role| rec.f32(&format!("{name}{i}"), len, role);
        let (x, w, b, y) = (
            t(&mut rec, "x", op.input_len(), Role::Input),
            t(&mut rec, "w", op.weight_len(), Role::Param),
            t(&mut rec, "b", op.bias_len(), Role::Param),
            t(&mut rec, "y", op.output_len(), Role::Output),
        );
        let step = Step::ConvForward {
            op: *op,
            x,
            w,
            b,
            y,
        };
        rec.entry(&format!("case{i}"), vec![step]);
        ids.push([x, w, b, y]);
    }
    (rec, ids)
}

/// Runs entry `i` ([`conv_forward_entries`]) on random inputs: the GPU's output and the CPU
/// twin's.
fn run_conv_forward_case(
    exec: &mut VulkanExec,
    rng: &mut SplitMix64,
    op: &Conv2d,
    [x_id, w_id, b_id, y_id]: [TensorId; 4],
    i: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut scratch = Scratch::new(2);
    scratch.reserve(cpu::conv2d_forward_scratch_len(op));
    let x = random_vec(rng, op.input_len(), -1.0, 1.0);
    let w = random_vec(rng, op.weight_len(), -1.0, 1.0);
    let b = random_vec(rng, op.bias_len(), -0.5, 0.5);
    let mut want = vec![0.0; op.output_len()];
    cpu::conv2d_forward(op, &x, &w, &b, &mut want, &mut scratch);
    for (t, v) in [(x_id, &x), (w_id, &w), (b_id, &b)] {
        exec.write_f32(t, v).unwrap();
    }
    exec.run(i).unwrap();
    (read(exec, y_id, want.len()), want)
}

/// The tolerance of the fp16 variants against the f32 CPU twin, relative to the output's
/// largest value: rounding each operand and product to f16 costs at most 2⁻¹¹ relative each,
/// and the sums (up to 125 products of values in [-1, 1] here) stay f32.
const FP16_TOL: f64 = 4e-3;

/// Checks an fp16 variant's output against the f32 result: within [`FP16_TOL`] of the
/// largest value, and different from it somewhere, or the variant was not in use.
fn assert_f16_close(name: &str, got: &[f32], want: &[f32]) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() as f64)
        .fold(0.0, f64::max);
    assert!(
        worst <= FP16_TOL * scale,
        "{name}: worst error {worst:e} over {FP16_TOL} × max|y| = {scale}"
    );
    assert!(worst > 1e-6 * scale, "{name}: no f16 rounding seen");
    eprintln!("{name}: worst error {:.1e} × max|y|", worst / scale);
}

/// A validated engine with the fp16 variants, or `None` (skipped) without Vulkan or, unless
/// Vulkan is required, without `shaderFloat16`.
fn fp16_engine(test: &str) -> Option<super::Engine> {
    let options = super::Options {
        fp16: true,
        ..super::testing::options()
    };
    let engine = super::testing::engine_with_options(test, &options)?;
    if !engine.fp16() {
        assert!(
            !super::testing::required(),
            "FULCRUM_REQUIRE_VULKAN=1: {} has no shaderFloat16 for the fp16 variants",
            engine.info().label()
        );
        eprintln!(
            "SKIP: {test}: {} has no shaderFloat16",
            engine.info().label()
        );
        return None;
    }
    Some(engine)
}

/// Every fp16 variant of a forward conv (f16 operands and products, f32 sums;
/// [`super::kernels::Kernel::fp16_variant`]) against the f32 CPU twin: the tiled and thin
/// pointwise kernels, the depthwise kernel (3×3 at strides 1 and 2, 5×5, unpadded) and the
/// dense conv's one- and four-pixel kernels. The GPUs' kernels, which have the variants, run
/// on every device (CPU-type ones included) when fp16 is asked for.
#[test]
fn fp16_variants_match_the_cpu_twin_within_f16_rounding() {
    let cases = [
        Conv2d::pointwise(3, 33, 5, 7, 65, true),
        Conv2d::pointwise(2, 64, 16, 16, 48, false),
        // More tiles than THIN_MAX_TILES: the tiled kernel.
        Conv2d::pointwise(2, 24, 32, 32, 64, true),
        Conv2d::depthwise(2, 5, 9, 7, 3, 2, true),
        Conv2d::depthwise(2, 2, 48, 49, 3, 1, true),
        Conv2d::depthwise(1, 3, 6, 11, 5, 1, false),
        Conv2d {
            pad: 0,
            ..Conv2d::depthwise(2, 4, 7, 7, 3, 1, true)
        },
        Conv2d::dense(2, 3, 13, 11, 16, 3, 2, true),
        Conv2d::dense(1, 5, 9, 6, 7, 5, 1, false),
        Conv2d::dense(16, 3, 128, 128, 16, 3, 2, true),
    ];
    let (rec, ids) = conv_forward_entries(&cases);
    let Some(engine) = fp16_engine("fp16_variants") else {
        return;
    };
    let mut exec = VulkanExec::new(engine, &rec, false, None).unwrap();
    let mut rng = SplitMix64::new(5);
    for (i, (op, &ids)) in cases.iter().zip(&ids).enumerate() {
        let f32_kernel = match op.kind() {
            ConvKind::Pointwise => pointwise_kernel(op, false),
            ConvKind::Depthwise => "depthwise",
            ConvKind::Dense | ConvKind::Grouped => dense_kernel(op, false),
        };
        let kernel = format!("{f32_kernel}_f16");
        assert_eq!(
            exec.kernels(i)[0].0,
            kernel,
            "case {i}: the variant is lowered"
        );
        let (got, want) = run_conv_forward_case(&mut exec, &mut rng, op, ids, i);
        assert_f16_close(&format!("{kernel} case {i}"), &got, &want);
    }
    assert_clean(exec.engine());
}

/// The pointwise conv's tiled and direct kernels, each forced whatever the device's own
/// choice ([`super::Options::direct`]), against the CPU twin: shapes that fill no tile,
/// several tiles, and more images than one; with and without ReLU.
#[test]
fn pointwise_tiled_and_direct_kernels_match_the_cpu_twin() {
    let cases = [
        Conv2d::pointwise(3, 33, 5, 7, 65, true),
        Conv2d::pointwise(2, 64, 16, 16, 48, false),
        Conv2d::pointwise(1, 16, 1, 3, 7, true),
        Conv2d::pointwise(2, 20, 30, 31, 40, false),
        // In vec4s on the direct path: a ragged last workgroup of pixels and of channels.
        Conv2d::pointwise(3, 8, 5, 4, 37, true),
    ];
    let (rec, ids) = conv_forward_entries(&cases);
    for direct in [false, true] {
        let options = super::Options {
            direct: Some(direct),
            ..super::testing::options()
        };
        let test = format!("pointwise, direct {direct}");
        let Some(engine) = super::testing::engine_with_options(&test, &options) else {
            return;
        };
        let mut exec = VulkanExec::new(engine, &rec, false, None).unwrap();
        let mut rng = SplitMix64::new(9);
        for (i, (op, &ids)) in cases.iter().zip(&ids).enumerate() {
            let kernel = pointwise_kernel(op, direct);
            assert_eq!(exec.kernels(i)[0].0, kernel, "the variant is lowered");
            let (got, want) = run_conv_forward_case(&mut exec, &mut rng, op, ids, i);
            close(&format!("{kernel} case {i}"), &got, &want);
        }
        assert_clean(exec.engine());
    }
}

/// A depthwise conv's input gradient with a residual's gradient added and masked for the ReLU
/// pointwise conv before it (`masked_add_assign`, and `_direct4` on the direct path), and
/// that conv's backward pass taking it as masked, against the CPU engine running every step
/// on its own.
#[test]
fn masked_gradient_adds_match_the_cpu_twin() {
    for direct in [false, true] {
        let mut rng = SplitMix64::new(17);
        let mut rec = Recording::new();
        let pw = Conv2d::pointwise(2, 8, 6, 6, 8, true);
        let dw = Conv2d::depthwise(2, 8, 6, 6, 3, 1, true);
        let mut t = |name: &str, len: usize, role| rec.f32(name, len, role);
        let x = t("x", pw.input_len(), Role::Input);
        let a = t("a", pw.output_len(), Role::Input);
        let b = t("b", dw.output_len(), Role::Input);
        let g_b = t("g_b", dw.output_len(), Role::Input);
        let skip = t("skip", dw.input_len(), Role::Input);
        let g_a = t("g_a", dw.input_len(), Role::Activation);
        let g_x = t("g_x", pw.input_len(), Role::Output);
        let (w_dw, w_pw) = (
            t("w_dw", dw.weight_len(), Role::Param),
            t("w_pw", pw.weight_len(), Role::Param),
        );
        let grads = [
            t("gw_dw", dw.weight_len(), Role::Output),
            t("gb_dw", dw.bias_len(), Role::Output),
            t("gw_pw", pw.weight_len(), Role::Output),
            t("gb_pw", pw.bias_len(), Role::Output),
        ];
        rec.entry(
            "backward",
            vec![
                Step::ConvBackward {
                    op: dw,
                    x: a,
                    w: w_dw,
                    y: b,
                    gy: g_b,
                    gx: Some(g_a),
                    gw: Some(grads[0]),
                    gb: grads[1],
                },
                Step::AddAssign {
                    op: Add {
                        len: dw.input_len() as u32,
                    },
                    dst: g_a,
                    src: skip,
                },
                Step::ConvBackward {
                    op: pw,
                    x,
                    w: w_pw,
                    y: a,
                    gy: g_a,
                    gx: Some(g_x),
                    gw: Some(grads[2]),
                    gb: grads[3],
                },
            ],
        );
        let options = super::Options {
            direct: Some(direct),
            ..super::testing::options()
        };
        let Some(engine) = super::testing::engine_with_options("masked_gradient_adds", &options)
        else {
            return;
        };
        let mut exec = VulkanExec::separate(engine, &rec, false).unwrap();
        let want = if direct {
            "masked_add_assign_direct4"
        } else {
            "masked_add_assign"
        };
        let kernels: Vec<_> = exec.kernels(0).iter().map(|k| k.0).collect();
        assert!(kernels.contains(&want), "{kernels:?}");
        assert!(
            !kernels.iter().any(|k| k.starts_with("add_assign")),
            "{kernels:?}"
        );
        let mut cpu = cpu(&rec);
        for id in [x, a, b, g_b, skip, w_dw, w_pw] {
            let mut v = random_vec(&mut rng, rec.get(id).len, -1.0, 1.0);
            if [a, b].contains(&id) {
                // ReLU outputs: about half of them 0.
                v.iter_mut().for_each(|e| *e = e.max(0.0));
            }
            exec.write_f32(id, &v).unwrap();
            cpu.write_f32(id, &v).unwrap();
        }
        exec.run(0).unwrap();
        cpu.run(0).unwrap();
        for id in grads.into_iter().chain([g_x]) {
            let len = rec.get(id).len;
            let name = format!("{}, direct {direct}", rec.get(id).name);
            close(
                &name,
                &read(&mut exec, id, len),
                &cpu_read(&mut cpu, id, len),
            );
        }
        // The GPU's g_a is masked where a is 0; the CPU's, with every step on its own, not.
        let len = rec.get(g_a).len;
        let mask = cpu_read(&mut cpu, a, len);
        let masked: Vec<f32> = cpu_read(&mut cpu, g_a, len)
            .iter()
            .zip(&mask)
            .map(|(&g, &m)| if m > 0.0 { g } else { 0.0 })
            .collect();
        close("g_a masked", &read(&mut exec, g_a, len), &masked);
        assert!(masked.contains(&0.0) && masked.iter().any(|&v| v != 0.0));
        assert_clean(exec.engine());
    }
}
