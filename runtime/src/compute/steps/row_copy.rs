//! Rows of one tensor into another (a detection level's rows into the joined prediction).

use super::Access::{Read, Update, Write};
use super::{RowCopy, StepOp, Use};
use crate::compute::cpu::copy;
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::F32;
use crate::compute::vulkan::kernels::Kernel;
use crate::compute::vulkan::lower::{linear_groups, words, Slot, StepDispatches, StepError};

impl StepOp for RowCopy {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        if self.src == self.dst {
            return Err(OpError::Invalid(
                "copy: src and dst are the same tensor".into(),
            ));
        }
        Ok(vec![
            (self.src, self.op.src_len(), F32, Read),
            (
                self.dst,
                self.op.dst_len(),
                F32,
                // A copy into part of `dst` keeps the rest of it.
                if self.op.writes_whole() {
                    Write
                } else {
                    Update
                },
            ),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut o = cpu.take(self.dst);
        copy::row_copy(&self.op, cpu.f32s(self.src), &mut o);
        cpu.put(self.dst, o);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        dispatches.add(
            Kernel::RowCopy,
            vec![T(self.src), T(self.dst)],
            words(&[
                self.op.rows,
                self.op.len,
                self.op.src_stride,
                self.op.src_offset,
                self.op.dst_stride,
                self.op.dst_offset,
            ]),
            linear_groups(u64::from(self.op.rows) * u64::from(self.op.len)),
        );
        Ok(())
    }
}
