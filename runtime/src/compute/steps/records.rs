//! The steps that read packed records (bytes): the network's input and the training targets.

use super::Access::{Read, Write};
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
        self.op.validate()?;
        Ok(vec![
            (self.records, self.op.input_bytes(), Bytes, Read),
            (self.out, self.op.output_len(), F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, input: Option<Input<'_>>) {
        let mut o = cpu.take(self.out);
        let pool = cpu.pool();
        normalize::normalize(
            &self.op,
            cpu.bytes_of(self.records, input),
            &mut o,
            pool.as_deref(),
        );
        cpu.put(self.out, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::Normalize,
            vec![T(self.records), T(self.out)],
            words(&[
                self.op.n,
                self.op.h,
                self.op.w,
                self.op.record_stride,
                u32::from(self.op.flip),
            ]),
            linear_groups(self.op.output_len() as u64),
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
        self.op.validate()?;
        Ok(vec![
            (self.records, self.op.input_bytes(), Bytes, Read),
            (self.out, self.op.output_len(), F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, input: Option<Input<'_>>) {
        let mut o = cpu.take(self.out);
        targets::render_targets(&self.op, cpu.bytes_of(self.records, input), &mut o);
        cpu.put(self.out, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::Targets,
            vec![T(self.records), T(self.out)],
            words(
                &[
                    &[self.op.n, self.op.classes][..],
                    &self.op.levels.words(),
                    &[
                        self.op.max_boxes,
                        self.op.record_stride,
                        self.op.meta_offset,
                        self.op.min_overlap.to_bits(),
                        u32::from(self.op.flip),
                        self.op.neighbour_weight.to_bits(),
                        self.op.neighbour_radius,
                        self.op.neighbour_cells,
                    ],
                ]
                .concat(),
            ),
            linear_groups(u64::from(self.op.n) * self.op.levels.total_cells() as u64),
        );
        Ok(())
    }
}
