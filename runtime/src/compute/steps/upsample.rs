//! Nearest-neighbour upsampling by two (the neck), forward and backward.

use super::{StepOp, UpsampleBackward, UpsampleForward, Use};
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::cpu::upsample;
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::F32;
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{linear_groups, words, Slot, StepDispatches, StepError};

impl StepOp for UpsampleForward {
    fn name(&self) -> &'static str {
        "upsample"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let UpsampleForward { op, x, y } = *self;
        op.validate()?;
        Ok(vec![
            (x, op.input_len(), F32, false),
            (y, op.output_len(), F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let UpsampleForward { op, x, y } = *self;
        let mut o = cpu.take(y);
        upsample::upsample2x_forward(&op, cpu.f32s(x), &mut o);
        cpu.put(y, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let UpsampleForward { op, x, y } = *self;
        // Binding 2 is the residual the store adds; unread (x stands in) without.
        let add = dispatches.add_after;
        let (out, skip) = add.map_or((y, x), |a| (a.out, a.residual));
        dispatches.add(
            Kernel::Upsample,
            vec![T(x), T(out), T(skip)],
            words(&[op.n, op.c, op.h, op.w, u32::from(add.is_some())]),
            linear_groups(op.output_len() as u64),
        );
        Ok(())
    }
}

impl StepOp for UpsampleBackward {
    fn name(&self) -> &'static str {
        "upsample-backward"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn flops(&self) -> u64 {
        self.op.output_len() as u64
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let UpsampleBackward { op, gy, gx } = *self;
        op.validate()?;
        Ok(vec![
            (gy, op.output_len(), F32, false),
            (gx, op.input_len(), F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let UpsampleBackward { op, gy, gx } = *self;
        let mut o = cpu.take(gx);
        upsample::upsample2x_backward(&op, cpu.f32s(gy), &mut o);
        cpu.put(gx, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let UpsampleBackward { op, gy, gx } = *self;
        dispatches.add(
            Kernel::UpsampleGrad,
            vec![T(gy), T(gx)],
            words(&[op.n, op.c, op.h, op.w]),
            linear_groups(op.input_len() as u64),
        );
        Ok(())
    }
}
