//! Nearest-neighbour upsampling by two (the neck), forward and backward.

use super::Access::{Read, Write};
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
        self.op.validate()?;
        Ok(vec![
            (self.x, self.op.input_len(), F32, Read),
            (self.y, self.op.output_len(), F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut o = cpu.take(self.y);
        upsample::upsample2x_forward(&self.op, cpu.f32s(self.x), &mut o);
        cpu.put(self.y, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        // Binding 2 is the residual the store adds; unread (x stands in) without.
        let add = dispatches.add_after;
        let (out, skip) = add.map_or((self.y, self.x), |a| (a.out, a.residual));
        dispatches.add(
            Kernel::Upsample,
            vec![T(self.x), T(out), T(skip)],
            words(&[
                self.op.n,
                self.op.c,
                self.op.h,
                self.op.w,
                u32::from(add.is_some()),
            ]),
            linear_groups(self.op.output_len() as u64),
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

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        Ok(vec![
            (self.gy, self.op.output_len(), F32, Read),
            (self.gx, self.op.input_len(), F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut o = cpu.take(self.gx);
        upsample::upsample2x_backward(&self.op, cpu.f32s(self.gy), &mut o);
        cpu.put(self.gx, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::UpsampleGrad,
            vec![T(self.gy), T(self.gx)],
            words(&[self.op.n, self.op.c, self.op.h, self.op.w]),
            linear_groups(self.op.input_len() as u64),
        );
        Ok(())
    }
}
