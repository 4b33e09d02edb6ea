//! The steps that read packed records (bytes): the network's input and the training targets.

use super::{Normalize, StepOp, Targets, Use};
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::cpu::{normalize, targets};
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::{Bytes, F32};
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{linear_groups, words, Slot, StepDispatches, StepError};

impl StepOp for Normalize {
    fn name(&self) -> &'static str {
        "normalize"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let Normalize { op, records, out } = *self;
        op.validate()?;
        Ok(vec![
            (records, op.input_bytes(), Bytes, false),
            (out, op.output_len(), F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, input: Option<Input<'_>>) {
        let Normalize { op, records, out } = *self;
        let mut o = cpu.take(out);
        let pool = cpu.pool();
        normalize::normalize(&op, cpu.bytes_of(records, input), &mut o, pool.as_deref());
        cpu.put(out, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let Normalize { op, records, out } = *self;
        dispatches.add(
            Kernel::Normalize,
            vec![T(records), T(out)],
            words(&[op.n, op.h, op.w, op.record_stride, u32::from(op.flip)]),
            linear_groups(op.output_len() as u64),
        );
        Ok(())
    }
}

impl StepOp for Targets {
    fn name(&self) -> &'static str {
        "targets"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let Targets { op, records, out } = *self;
        op.validate()?;
        Ok(vec![
            (records, op.input_bytes(), Bytes, false),
            (out, op.output_len(), F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, input: Option<Input<'_>>) {
        let Targets { op, records, out } = *self;
        let mut o = cpu.take(out);
        targets::render_targets(&op, cpu.bytes_of(records, input), &mut o);
        cpu.put(out, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let Targets { op, records, out } = *self;
        dispatches.add(
            Kernel::Targets,
            vec![T(records), T(out)],
            words(
                &[
                    &[op.n, op.classes][..],
                    &op.levels.words(),
                    &[
                        op.max_boxes,
                        op.record_stride,
                        op.meta_offset,
                        op.min_overlap.to_bits(),
                        u32::from(op.flip),
                        op.neighbour_weight.to_bits(),
                        op.neighbour_radius,
                        op.neighbour_cells,
                    ],
                ]
                .concat(),
            ),
            linear_groups(u64::from(op.n) * op.levels.total_cells() as u64),
        );
        Ok(())
    }
}
