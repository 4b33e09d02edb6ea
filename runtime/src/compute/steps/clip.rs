//! Gradient-norm clipping: each gradient's sum of squares, then the norm and the scale the
//! optimizer steps read.

use super::Access::{Read, Update};
use super::{ClipGrad, StepOp, SumSquares, Use};
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::cpu::optim;
use crate::compute::ops::{OpError, CLIP_SUMS};
use crate::compute::recording::Elem::F32;
use crate::compute::recording::HYPER_LEN;
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{sum_squares, words, Slot, StepDispatches, StepError};

impl StepOp for SumSquares {
    fn name(&self) -> &'static str {
        "sum-squares"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        if self.op.slot >= self.op.tensors {
            return Err(OpError::Invalid(format!(
                "sum-squares: slot {} of {} sums",
                self.op.slot, self.op.tensors
            )));
        }
        Ok(vec![
            (self.x, self.op.len as usize, F32, Read),
            (self.sums, CLIP_SUMS + self.op.tensors as usize, F32, Update),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let sum = optim::sum_squares(&cpu.f32s(self.x)[..self.op.len as usize]);
        let mut s = cpu.take(self.sums);
        s[CLIP_SUMS + self.op.slot as usize] = sum;
        cpu.put(self.sums, s);
    }

    /// A sum alone; the lowering joins up to four consecutive sums in one dispatch.
    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        let d = sum_squares(&[(self.x, self.op)], self.sums, dispatches.step);
        dispatches.add(d.kernel, d.bindings, d.push, d.groups);
        Ok(())
    }
}

impl StepOp for ClipGrad {
    fn name(&self) -> &'static str {
        "clip"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        Ok(vec![
            (self.sums, self.op.sums_len(), F32, Update),
            (self.hyper, HYPER_LEN, F32, Update),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let (mut s, mut h) = (cpu.take(self.sums), cpu.take(self.hyper));
        optim::clip_grad(&self.op, &mut s, &mut h);
        cpu.put(self.sums, s);
        cpu.put(self.hyper, h);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::ClipGrad,
            vec![T(self.sums), T(self.hyper)],
            words(&[self.op.tensors, self.op.max_norm.to_bits()]),
            [1, 1, 1],
        );
        Ok(())
    }
}
