//! Elementwise adds: a residual connection's `out = a + b`, and `dst += src` where a tensor's
//! gradient has two consumers.

use super::Access::{Read, Update, Write};
use super::{Add, AddAssign, StepOp, Use};
use crate::compute::cpu::add;
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::F32;
use crate::compute::vulkan::kernels::{add_direct4_fits, Kernel};
use crate::compute::vulkan::lower::{linear_groups, words, Slot, StepDispatches, StepError};

impl StepOp for Add {
    fn name(&self) -> &'static str {
        "add"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        if self.out == self.a || self.out == self.b {
            return Err(OpError::Invalid(
                "add: out must differ from a and b (use AddAssign)".into(),
            ));
        }
        let n = self.op.len as usize;
        Ok(vec![
            (self.a, n, F32, Read),
            (self.b, n, F32, Read),
            (self.out, n, F32, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut o = cpu.take(self.out);
        let pool = cpu.pool();
        add::add(
            &self.op,
            cpu.f32s(self.a),
            cpu.f32s(self.b),
            &mut o,
            pool.as_deref(),
        );
        cpu.put(self.out, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let (kernel, groups) = if dispatches.variants.direct && add_direct4_fits(self.op.len) {
            (
                Kernel::AddDirect4,
                linear_groups(u64::from(self.op.len / 4)),
            )
        } else {
            (Kernel::Add, linear_groups(u64::from(self.op.len)))
        };
        dispatches.add(
            kernel,
            vec![T(self.a), T(self.b), T(self.out)],
            words(&[self.op.len]),
            groups,
        );
        Ok(())
    }
}

impl StepOp for AddAssign {
    fn name(&self) -> &'static str {
        "add-assign"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        if self.dst == self.src {
            return Err(OpError::Invalid(
                "add-assign: dst and src are the same tensor".into(),
            ));
        }
        let n = self.op.len as usize;
        Ok(vec![(self.src, n, F32, Read), (self.dst, n, F32, Update)])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut d = cpu.take(self.dst);
        let pool = cpu.pool();
        add::add_assign(&self.op, &mut d, cpu.f32s(self.src), pool.as_deref());
        cpu.put(self.dst, d);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let push = words(&[self.op.len]);
        if dispatches.variants.direct && add_direct4_fits(self.op.len) {
            // The direct kernel's third binding is its output: `dst` again.
            let groups = linear_groups(u64::from(self.op.len / 4));
            dispatches.add(
                Kernel::AddAssignDirect4,
                vec![T(self.dst), T(self.src), T(self.dst)],
                push,
                groups,
            );
        } else {
            let groups = linear_groups(u64::from(self.op.len));
            dispatches.add(
                Kernel::AddAssign,
                vec![T(self.dst), T(self.src)],
                push,
                groups,
            );
        }
        Ok(())
    }
}
