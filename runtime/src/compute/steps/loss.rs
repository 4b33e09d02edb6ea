//! The CenterNet loss and its gradient with respect to the prediction.

use super::Access::{Read, Write};
use super::{LossBackward, LossForward, StepOp, Use};
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::cpu::loss;
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::F32;
use crate::compute::recording::LOSS_LEN;
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{
    linear_groups, loss_partial, loss_push, Slot, StepDispatches, StepError,
};

impl StepOp for LossForward {
    fn name(&self) -> &'static str {
        "loss"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        Ok(vec![
            (self.pred, self.op.pred_len(), F32, Read),
            (self.target, self.op.target_len(), F32, Read),
            (self.loss, LOSS_LEN, F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut o = cpu.take(self.loss);
        let (pool, threads) = (cpu.pool(), cpu.threads());
        let parts = loss::center_loss_split(
            &self.op,
            cpu.f32s(self.pred),
            cpu.f32s(self.target),
            pool.as_deref(),
            threads,
        );
        o.copy_from_slice(&parts.to_array());
        cpu.put(self.loss, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let (first, parts, lp) = loss_partial(
            &self.op,
            [self.pred, self.target, self.loss],
            dispatches.step,
            dispatches.lowered,
        );
        dispatches.add(first.kernel, first.bindings, first.push, first.groups);
        if parts > 1 {
            dispatches.add(
                Kernel::LossFinish,
                vec![Slot::LossPartial, T(self.loss)],
                lp,
                [1, 1, 1],
            );
        }
        Ok(())
    }
}

impl StepOp for LossBackward {
    fn name(&self) -> &'static str {
        "loss-backward"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        Ok(vec![
            (self.pred, self.op.pred_len(), F32, Read),
            (self.target, self.op.target_len(), F32, Read),
            (self.loss, LOSS_LEN, F32, Read),
            (self.grad, self.op.pred_len(), F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut g = cpu.take(self.grad);
        let centres = cpu.f32s(self.loss)[4];
        let (pool, threads) = (cpu.pool(), cpu.threads());
        loss::center_loss_backward_split(
            &self.op,
            cpu.f32s(self.pred),
            cpu.f32s(self.target),
            centres,
            &mut g,
            pool.as_deref(),
            threads,
        );
        cpu.put(self.grad, g);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::LossGrad,
            vec![T(self.pred), T(self.target), T(self.loss), T(self.grad)],
            loss_push(&self.op, 1, 0),
            linear_groups(self.op.pred_len() as u64),
        );
        Ok(())
    }
}
