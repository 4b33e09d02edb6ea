//! Rows of one tensor into another (a detection level's rows into the joined prediction).

use super::{RowCopy, StepOp, Use};
use crate::compute::cpu::copy;
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::F32;
use crate::compute::recording::TensorId;
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{linear_groups, words, Slot, StepDispatches, StepError};

impl StepOp for RowCopy {
    fn name(&self) -> &'static str {
        "copy"
    }

    /// A copy into part of `dst` keeps the rest of it.
    fn reads_before_writing(&self, tensor: TensorId) -> bool {
        self.dst == tensor && !self.op.writes_whole()
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        let RowCopy { op, src, dst } = *self;
        op.validate()?;
        if src == dst {
            return Err(OpError::Invalid(
                "copy: src and dst are the same tensor".into(),
            ));
        }
        Ok(vec![
            (src, op.src_len(), F32, false),
            (dst, op.dst_len(), F32, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let RowCopy { op, src, dst } = *self;
        let mut o = cpu.take(dst);
        copy::row_copy(&op, cpu.f32s(src), &mut o);
        cpu.put(dst, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let RowCopy { op, src, dst } = *self;
        dispatches.add(
            Kernel::RowCopy,
            vec![T(src), T(dst)],
            words(&[
                op.rows,
                op.len,
                op.src_stride,
                op.src_offset,
                op.dst_stride,
                op.dst_offset,
            ]),
            linear_groups(u64::from(op.rows) * u64::from(op.len)),
        );
        Ok(())
    }
}
