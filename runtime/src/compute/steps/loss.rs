//! The CenterNet loss and its gradient with respect to the prediction.

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
        let LossForward {
            op,
            pred,
            target,
            loss,
        } = *self;
        op.validate()?;
        Ok(vec![
            (pred, op.pred_len(), F32, false),
            (target, op.target_len(), F32, false),
            (loss, LOSS_LEN, F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let LossForward {
            op,
            pred,
            target,
            loss: l,
        } = *self;
        let mut o = cpu.take(l);
        let parts = loss::center_loss(&op, cpu.f32s(pred), cpu.f32s(target));
        o.copy_from_slice(&parts.to_array());
        cpu.put(l, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let LossForward {
            op,
            pred,
            target,
            loss,
        } = *self;
        let (first, parts, lp) = loss_partial(
            &op,
            [pred, target, loss],
            dispatches.step,
            dispatches.lowered,
        );
        dispatches.add(first.kernel, first.bindings, first.push, first.groups);
        if parts > 1 {
            dispatches.add(
                Kernel::LossFinish,
                vec![Slot::LossPartial, T(loss)],
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
        let LossBackward {
            op,
            pred,
            target,
            loss,
            grad,
        } = *self;
        op.validate()?;
        Ok(vec![
            (pred, op.pred_len(), F32, false),
            (target, op.target_len(), F32, false),
            (loss, LOSS_LEN, F32, false),
            (grad, op.pred_len(), F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let LossBackward {
            op,
            pred,
            target,
            loss: l,
            grad,
        } = *self;
        let mut g = cpu.take(grad);
        let centres = cpu.f32s(l)[4];
        loss::center_loss_backward(&op, cpu.f32s(pred), cpu.f32s(target), centres, &mut g);
        cpu.put(grad, g);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let LossBackward {
            op,
            pred,
            target,
            loss,
            grad,
        } = *self;
        dispatches.add(
            Kernel::LossGrad,
            vec![T(pred), T(target), T(loss), T(grad)],
            loss_push(&op, 1, 0),
            linear_groups(op.pred_len() as u64),
        );
        Ok(())
    }
}
