//! Convolutions, forward and backward: dense, grouped, depthwise and pointwise (the op's
//! [`ConvKind`] picks the kernels).

use super::Access::{Read, Write};
use super::{ConvBackward, ConvForward, Step, StepOp, Use};
use crate::compute::cpu::conv;
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::fusion::GradStore;
use crate::compute::ops::{ConvKind, OpError};
use crate::compute::recording::Elem::F32;
use crate::compute::vulkan::kernels::{
    pointwise_direct4_fits, Kernel, CONV_CHANNEL_BLOCK, CONV_GRAD_REDUCE_BLOCK,
    CONV_GRAD_WEIGHT_DIRECT4_TILE, CONV_GRAD_WEIGHT_DIRECT_TILE, DEPTHWISE_DIRECT_MAX_TAPS,
    DEPTHWISE_DIRECT_OUTPUTS, DEPTHWISE_DIRECT_ROWS, GEMM_TILE, POINTWISE_DIRECT_PIXELS,
    POINTWISE_THIN_GROUP,
};
use crate::compute::vulkan::lower::{
    checked, conv_push, linear_groups, split, with_skip, Slot, StepDispatches, StepError,
    DIRECT_SPLIT, LINEAR_WORKGROUP, MAX_GROUPS, QUAD_MIN_PIXELS, THIN_MAX_TILES, TILED_SPLIT,
};

impl StepOp for ConvForward {
    fn name(&self) -> &'static str {
        match self.op.kind() {
            ConvKind::Pointwise => "pointwise",
            ConvKind::Depthwise => "depthwise",
            _ => "conv",
        }
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        Ok(vec![
            (self.x, self.op.input_len(), F32, Read),
            (self.w, self.op.weight_len(), F32, Read),
            (self.b, self.op.bias_len(), F32, Read),
            (self.y, self.op.output_len(), F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, thread_split: bool, _input: Option<Input<'_>>) {
        let mut out = cpu.take(self.y);
        let mut scratch = cpu.take_scratch();
        let forward = if thread_split {
            conv::conv2d_forward_split
        } else {
            conv::conv2d_forward
        };
        forward(
            &self.op,
            cpu.f32s(self.x),
            cpu.f32s(self.w),
            cpu.f32s(self.b),
            &mut out,
            &mut scratch,
        );
        cpu.put_scratch(scratch);
        cpu.put(self.y, out);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let variants = dispatches.variants;
        let [bm, bn, _] = GEMM_TILE.map(u64::from);
        let bindings = vec![T(self.x), T(self.w), T(self.b), T(self.y)];
        match self.op.kind() {
            ConvKind::Depthwise => {
                // An invocation per four outputs of a row (depthwise.glsl), on CPU-type
                // devices per eight outputs of each of two rows.
                let (kernel, outputs, rows_each) = if variants.direct && !variants.fp16 {
                    (
                        Kernel::DepthwiseDirect,
                        DEPTHWISE_DIRECT_OUTPUTS,
                        DEPTHWISE_DIRECT_ROWS,
                    )
                } else {
                    (Kernel::Depthwise, 4, 1)
                };
                let planes = u64::from(self.op.n) * u64::from(self.op.c_out);
                let rows = planes * u64::from(self.op.out_h().div_ceil(rows_each));
                let per_row = u64::from(self.op.out_w().div_ceil(outputs));
                let groups = linear_groups(rows * per_row);
                dispatches.add(kernel, bindings, conv_push(&self.op, 1, 0), groups);
            }
            ConvKind::Pointwise => {
                // Binding 4 is the residual the store adds; unread (x stands in) without.
                let (bindings, push_block) = match dispatches.add_after {
                    Some(add) => (
                        vec![T(self.x), T(self.w), T(self.b), T(add.out), T(add.residual)],
                        with_skip(conv_push(&self.op, 1, 0)),
                    ),
                    None => (
                        vec![T(self.x), T(self.w), T(self.b), T(self.y), T(self.x)],
                        conv_push(&self.op, 1, 0),
                    ),
                };
                let plane = u64::from(self.op.h) * u64::from(self.op.w);
                let grid = checked(
                    [
                        plane.div_ceil(bn),
                        u64::from(self.op.c_out).div_ceil(bm),
                        u64::from(self.op.n),
                    ],
                    "pointwise conv",
                )?;
                let tiles = grid.iter().map(|&g| u64::from(g)).product::<u64>();
                if variants.direct && !variants.fp16 {
                    let grid = checked(
                        [
                            plane.div_ceil(u64::from(POINTWISE_DIRECT_PIXELS)),
                            u64::from(self.op.c_out).div_ceil(bm),
                            u64::from(self.op.n),
                        ],
                        "pointwise conv",
                    )?;
                    let kernel = if pointwise_direct4_fits(self.op.c_in, plane) {
                        Kernel::PointwiseDirect4
                    } else {
                        Kernel::PointwiseDirect
                    };
                    dispatches.add(kernel, bindings, push_block, grid);
                } else if tiles <= THIN_MAX_TILES {
                    let [gx, gy] = POINTWISE_THIN_GROUP.map(u64::from);
                    let grid = checked(
                        [
                            plane.div_ceil(gx),
                            u64::from(self.op.c_out).div_ceil(gy),
                            u64::from(self.op.n),
                        ],
                        "pointwise conv",
                    )?;
                    dispatches.add(Kernel::PointwiseThin, bindings, push_block, grid);
                } else {
                    let (n, c_out) = (u64::from(self.op.n), u64::from(self.op.c_out));
                    let tile = dispatches.tile_for(c_out, plane, n, true);
                    let [tm, tn] = tile.map(u64::from);
                    let grid = checked(
                        [plane.div_ceil(tn), c_out.div_ceil(tm), n],
                        "pointwise conv",
                    )?;
                    dispatches.add_tiled(Kernel::Pointwise, bindings, push_block, grid, Some(tile));
                }
            }
            ConvKind::Dense | ConvKind::Grouped => {
                // An invocation per output pixel, or per four or eight of a row
                // (conv2d.glsl): eight on a CPU-type device, four where there are enough
                // pixels to keep a GPU busy with a quarter as many invocations.
                let rows = u64::from(self.op.n) * u64::from(self.op.out_h());
                let pixels = rows * u64::from(self.op.out_w());
                let (kernel, per_invocation) = if variants.direct && !variants.fp16 {
                    (Kernel::Conv2dDirect, 8)
                } else if pixels >= QUAD_MIN_PIXELS {
                    (Kernel::Conv2dQuad, 4)
                } else {
                    (Kernel::Conv2d, 1)
                };
                let invocations = rows * u64::from(self.op.out_w()).div_ceil(per_invocation);
                let grid = checked(
                    [
                        invocations.div_ceil(u64::from(LINEAR_WORKGROUP)),
                        u64::from(self.op.c_out_per_group())
                            .div_ceil(u64::from(CONV_CHANNEL_BLOCK)),
                        u64::from(self.op.groups),
                    ],
                    "conv",
                )?;
                dispatches.add(kernel, bindings, conv_push(&self.op, 1, 0), grid);
            }
        }
        Ok(())
    }
}

impl StepOp for ConvBackward {
    fn name(&self) -> &'static str {
        match self.op.kind() {
            ConvKind::Pointwise => "pointwise-backward",
            ConvKind::Depthwise => "depthwise-backward",
            _ => "conv-backward",
        }
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        let mut v = vec![
            (self.x, self.op.input_len(), F32, Read),
            (self.w, self.op.weight_len(), F32, Read),
            (self.y, self.op.output_len(), F32, Read),
            (self.gy, self.op.output_len(), F32, Read),
            (self.gb, self.op.bias_len(), F32, Write),
        ];
        if let Some(gw) = self.gw {
            v.push((gw, self.op.weight_len(), F32, Write));
        }
        if let Some(gx) = self.gx {
            v.push((gx, self.op.input_len(), F32, Write));
        }
        Ok(v)
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        self.run_cpu_with(cpu, GradStore::default(), false);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let variants = dispatches.variants;
        let [bm, bn, _] = GEMM_TILE.map(u64::from);
        let depthwise = self.op.kind() == ConvKind::Depthwise;
        if let Some(gx) = self.gx {
            let bindings = vec![T(self.w), T(self.y), T(self.gy), T(gx)];
            if depthwise {
                // An invocation per four inputs of a row (depthwise_grad_input.glsl), on
                // CPU-type devices per eight inputs of each of two rows.
                let (kernel, inputs, rows_each) = if variants.direct {
                    (
                        Kernel::DepthwiseGradInputDirect,
                        DEPTHWISE_DIRECT_OUTPUTS,
                        DEPTHWISE_DIRECT_ROWS,
                    )
                } else {
                    (Kernel::DepthwiseGradInput, 4, 1)
                };
                let planes = u64::from(self.op.n) * u64::from(self.op.c_in);
                let rows = planes * u64::from(self.op.h.div_ceil(rows_each));
                let groups = linear_groups(rows * u64::from(self.op.w.div_ceil(inputs)));
                dispatches.add(kernel, bindings, conv_push(&self.op, 1, 0), groups);
            } else {
                let plane = u64::from(self.op.h) * u64::from(self.op.w);
                let (m, depth) = (
                    u64::from(self.op.c_in_per_group()),
                    u64::from(self.op.n) * u64::from(self.op.groups),
                );
                // The direct kernels' grid is the default tile's.
                let (kernel, tile) = if variants.direct
                    && self.op.kind() == ConvKind::Pointwise
                    && pointwise_direct4_fits(self.op.c_in, plane)
                {
                    (Kernel::Conv2dGradInputDirect4, None)
                } else if variants.direct {
                    (Kernel::Conv2dGradInputDirect, None)
                } else {
                    let tile = dispatches.tile_for(m, plane, depth, true);
                    (Kernel::Conv2dGradInput, Some(tile))
                };
                let [tm, tn] = tile.map_or([bm, bn], |t| t.map(u64::from));
                let grid = checked(
                    [plane.div_ceil(tn), m.div_ceil(tm), depth],
                    "conv input gradient",
                )?;
                let push = conv_push(&self.op, 1, 0);
                dispatches.add_tiled(kernel, bindings, push, grid, tile);
            }
        }
        let Some(gw) = self.gw else {
            // A frozen weight: the bias's gradient alone, a workgroup per output channel.
            let grid = checked([u64::from(self.op.c_out), 1, 1], "conv bias gradient")?;
            let bindings = vec![T(self.y), T(self.gy), T(self.gb)];
            dispatches.add(
                Kernel::ConvGradBias,
                bindings,
                conv_push(&self.op, 1, 0),
                grid,
            );
            return Ok(());
        };
        let terms = u64::from(self.op.n) * u64::from(self.op.out_h()) * u64::from(self.op.out_w());
        // Weight columns per output channel; the partial sums keep one more, the bias.
        let red = u64::from(self.op.c_in_per_group()) * u64::from(self.op.kernel * self.op.kernel);
        let row = red + 1;
        let bindings = vec![
            T(self.x),
            T(self.y),
            T(self.gy),
            Slot::ConvPartial,
            T(gw),
            T(self.gb),
        ];
        let splits = if depthwise {
            let taps = self.op.kernel * self.op.kernel;
            // Direct: a workgroup per channel, every tap; tiled: one per channel and tap
            // (or the bias).
            let (kernel, per_channel, rule) =
                if variants.direct && taps <= DEPTHWISE_DIRECT_MAX_TAPS {
                    (Kernel::DepthwiseGradWeightDirect, 1, DIRECT_SPLIT)
                } else {
                    (
                        Kernel::DepthwiseGradWeight,
                        u64::from(taps) + 1,
                        TILED_SPLIT,
                    )
                };
            let (splits, chunk) = split(terms, u64::from(self.op.c_out) * per_channel, rule);
            let grid = checked(
                [u64::from(self.op.c_out), per_channel, u64::from(splits)],
                "depthwise weight gradient",
            )?;
            dispatches.add(kernel, bindings, conv_push(&self.op, splits, chunk), grid);
            splits
        } else {
            // `tiled`: the tiled GEMM's tile, which its dispatch carries; the direct
            // kernels' tiles are fixed.
            let (kernel, [tm, tn], tiled, rule) = if variants.direct {
                let plane = u64::from(self.op.h) * u64::from(self.op.w);
                // Pointwise over whole vec4s of pixels: four terms a fetch.
                let (kernel, tile) = if self.op.kind() == ConvKind::Pointwise && plane % 4 == 0 {
                    (
                        Kernel::Conv2dGradWeightDirect4,
                        CONV_GRAD_WEIGHT_DIRECT4_TILE,
                    )
                } else {
                    (Kernel::Conv2dGradWeightDirect, CONV_GRAD_WEIGHT_DIRECT_TILE)
                };
                (kernel, tile.map(u64::from), None, DIRECT_SPLIT)
            } else {
                // The parts fill the device. The default tile's area bounds the partial
                // sums' scratch (TARGET_GROUPS).
                let m = u64::from(self.op.c_out_per_group());
                let tile = dispatches.tile_for(m, red, 1, false);
                let sides = tile.map(u64::from);
                (Kernel::Conv2dGradWeight, sides, Some(tile), TILED_SPLIT)
            };
            let tiles = red.div_ceil(tn)
                * u64::from(self.op.c_out_per_group()).div_ceil(tm)
                * u64::from(self.op.groups);
            let (splits, chunk) = split(terms, tiles, rule);
            let grid = checked(
                [
                    red.div_ceil(tn),
                    u64::from(self.op.c_out_per_group()).div_ceil(tm),
                    u64::from(self.op.groups) * u64::from(splits),
                ],
                "conv weight gradient",
            )?;
            let push = conv_push(&self.op, splits, chunk);
            dispatches.add_tiled(kernel, bindings, push, grid, tiled);
            splits
        };
        if splits > 1 {
            let len = u64::from(self.op.c_out) * row;
            let partial = &mut dispatches.lowered.conv_partial_floats;
            *partial = (*partial).max((len * u64::from(splits)) as usize);
            let (kernel, groups) = if variants.direct {
                (Kernel::Conv2dGradReduceDirect, linear_groups(len))
            } else {
                let blocks = len.div_ceil(u64::from(CONV_GRAD_REDUCE_BLOCK));
                let blocks = blocks.min(u64::from(MAX_GROUPS)) as u32;
                (Kernel::Conv2dGradReduce, [blocks, 1, 1])
            };
            dispatches.add(
                kernel,
                vec![Slot::ConvPartial, T(gw), T(self.gb)],
                conv_push(&self.op, splits, 0),
                groups,
            );
        }
        Ok(())
    }
}

impl ConvBackward {
    /// The CPU engine's backward pass, with `store` in its input gradient's store and its
    /// output gradient masked already where `gy_masked` (the CPU schedule's fused kernels).
    pub(crate) fn run_cpu_with(&self, cpu: &mut CpuExec, store: GradStore, gy_masked: bool) {
        let mut gw_v = self.gw.map(|t| cpu.take(t));
        let mut gb_v = cpu.take(self.gb);
        let mut gx_v = self.gx.map(|t| cpu.take(t));
        let mut scratch = cpu.take_scratch();
        let extras = conv::BackwardExtras {
            add: store.add.map(|t| cpu.f32s(t)),
            relu_of_input: store.relu_of_input,
            gy_masked,
        };
        conv::conv2d_backward_with(
            &self.op,
            cpu.f32s(self.x),
            cpu.f32s(self.w),
            cpu.f32s(self.y),
            cpu.f32s(self.gy),
            gx_v.as_deref_mut(),
            gw_v.as_deref_mut(),
            &mut gb_v,
            &mut scratch,
            extras,
        );
        cpu.put_scratch(scratch);
        if let (Some(t), Some(v)) = (self.gw, gw_v) {
            cpu.put(t, v);
        }
        cpu.put(self.gb, gb_v);
        if let (Some(t), Some(v)) = (self.gx, gx_v) {
            cpu.put(t, v);
        }
    }
}

impl Step {
    /// A [`Step::ConvBackward`] as its op's struct (the CPU schedule runs it in fused
    /// kernels).
    pub(crate) fn conv_backward(&self) -> Option<ConvBackward> {
        match *self {
            Step::ConvBackward {
                op,
                x,
                w,
                y,
                gy,
                gx,
                gw,
                gb,
            } => Some(ConvBackward {
                op,
                x,
                w,
                y,
                gy,
                gx,
                gw,
                gb,
            }),
            _ => None,
        }
    }
}
