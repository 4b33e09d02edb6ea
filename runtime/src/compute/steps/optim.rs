//! The optimizer's updates of one parameter tensor (AdamW, SGD with momentum) and the weight
//! average after them. Their per-step scalars come from the `hyper` tensor the host writes
//! before every run ([`crate::compute::recording::HYPER_LEN`]).

use super::Access::{Read, Update};
use super::{AdamW, Ema, Sgd, StepOp, Use};
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::cpu::optim;
use crate::compute::ops::{OpError, SgdMomentum};
use crate::compute::recording::Elem::F32;
use crate::compute::recording::{HYPER_EMA_DECAY, HYPER_GRAD_SCALE, HYPER_LEN};
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{
    adamw_push, linear_groups, words, Slot, StepDispatches, StepError,
};

impl StepOp for AdamW {
    fn name(&self) -> &'static str {
        "adamw"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        let n = self.op.len as usize;
        Ok(vec![
            (self.grad, n, F32, Read),
            (self.hyper, HYPER_LEN, F32, Read),
            (self.param, n, F32, Update),
            (self.m, n, F32, Update),
            (self.v, n, F32, Update),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let h: [f32; HYPER_LEN] = cpu.f32s(self.hyper).try_into().expect("validated length");
        let (mut p, mut mv, mut vv) = (cpu.take(self.param), cpu.take(self.m), cpu.take(self.v));
        optim::adamw_with(&self.op, &h, &mut p, cpu.f32s(self.grad), &mut mv, &mut vv);
        cpu.put(self.param, p);
        cpu.put(self.m, mv);
        cpu.put(self.v, vv);
    }

    /// Alone; the lowering joins it with the weight average right after it.
    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::AdamW,
            vec![
                T(self.param),
                T(self.grad),
                T(self.m),
                T(self.v),
                T(self.hyper),
            ],
            adamw_push(&self.op),
            linear_groups(u64::from(self.op.len)),
        );
        Ok(())
    }
}

impl StepOp for Ema {
    fn name(&self) -> &'static str {
        "ema"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        let n = self.op.len as usize;
        Ok(vec![
            (self.param, n, F32, Read),
            (self.hyper, HYPER_LEN, F32, Read),
            (self.ema, n, F32, Update),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let decay = cpu.f32s(self.hyper)[HYPER_EMA_DECAY];
        let mut e = cpu.take(self.ema);
        optim::ema(&self.op, decay, cpu.f32s(self.param), &mut e);
        cpu.put(self.ema, e);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::Ema,
            vec![T(self.ema), T(self.param), T(self.hyper)],
            words(&[self.op.len]),
            linear_groups(u64::from(self.op.len)),
        );
        Ok(())
    }
}

impl StepOp for Sgd {
    fn name(&self) -> &'static str {
        "sgd"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        let n = self.op.len as usize;
        Ok(vec![
            (self.grad, n, F32, Read),
            (self.hyper, HYPER_LEN, F32, Read),
            (self.param, n, F32, Update),
            (self.velocity, n, F32, Update),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        // The learning rate of this step, from `hyper`.
        let op = SgdMomentum {
            lr: cpu.f32s(self.hyper)[0],
            ..self.op
        };
        let scale = cpu.f32s(self.hyper)[HYPER_GRAD_SCALE];
        let (mut p, mut vel) = (cpu.take(self.param), cpu.take(self.velocity));
        optim::sgd_momentum(&op, scale, &mut p, cpu.f32s(self.grad), &mut vel);
        cpu.put(self.param, p);
        cpu.put(self.velocity, vel);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::Sgd,
            vec![T(self.param), T(self.grad), T(self.velocity), T(self.hyper)],
            words(&[
                self.op.len,
                self.op.momentum.to_bits(),
                self.op.weight_decay.to_bits(),
            ]),
            linear_groups(u64::from(self.op.len)),
        );
        Ok(())
    }
}
