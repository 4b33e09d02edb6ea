//! Elementwise adds: a residual connection's `out = a + b`, and `dst += src` where a tensor's
//! gradient has two consumers.

use super::{Add, AddAssign, StepOp, Use};
use crate::compute::cpu::add;
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::F32;
use crate::compute::recording::TensorId;
use crate::compute::vulkan::kernels::{add_direct4_fits, Kernel};
use crate::compute::vulkan::lower::{linear_groups, words, Slot, StepDispatches, StepError};

impl StepOp for Add {
    fn name(&self) -> &'static str {
        "add"
    }

    fn flops(&self) -> u64 {
        self.op.len as u64
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let Add { op, a, b, out } = *self;
        op.validate()?;
        if out == a || out == b {
            return Err(OpError::Invalid(
                "add: out must differ from a and b (use AddAssign)".into(),
            ));
        }
        let n = op.len as usize;
        Ok(vec![
            (a, n, F32, false),
            (b, n, F32, false),
            (out, n, F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let Add { op, a, b, out } = *self;
        let mut o = cpu.take(out);
        let pool = cpu.pool();
        add::add(&op, cpu.f32s(a), cpu.f32s(b), &mut o, pool.as_deref());
        cpu.put(out, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let Add { op, a, b, out } = *self;
        let (kernel, groups) = if dispatches.variants.direct && add_direct4_fits(op.len) {
            (Kernel::AddDirect4, linear_groups(u64::from(op.len / 4)))
        } else {
            (Kernel::Add, linear_groups(u64::from(op.len)))
        };
        dispatches.add(kernel, vec![T(a), T(b), T(out)], words(&[op.len]), groups);
        Ok(())
    }
}

impl StepOp for AddAssign {
    fn name(&self) -> &'static str {
        "add-assign"
    }

    fn reads_before_writing(&self, tensor: TensorId) -> bool {
        self.dst == tensor
    }

    fn flops(&self) -> u64 {
        self.op.len as u64
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let AddAssign { op, dst, src } = *self;
        op.validate()?;
        if dst == src {
            return Err(OpError::Invalid(
                "add-assign: dst and src are the same tensor".into(),
            ));
        }
        let n = op.len as usize;
        Ok(vec![(src, n, F32, false), (dst, n, F32, true)])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let AddAssign { op, dst, src } = *self;
        let mut d = cpu.take(dst);
        let pool = cpu.pool();
        add::add_assign(&op, &mut d, cpu.f32s(src), pool.as_deref());
        cpu.put(dst, d);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let AddAssign { op, dst, src } = *self;
        let push = words(&[op.len]);
        if dispatches.variants.direct && add_direct4_fits(op.len) {
            // The direct kernel's third binding is its output: `dst` again.
            let groups = linear_groups(u64::from(op.len / 4));
            dispatches.add(
                Kernel::AddAssignDirect4,
                vec![T(dst), T(src), T(dst)],
                push,
                groups,
            );
        } else {
            let groups = linear_groups(u64::from(op.len));
            dispatches.add(Kernel::AddAssign, vec![T(dst), T(src)], push, groups);
        }
        Ok(())
    }
}
