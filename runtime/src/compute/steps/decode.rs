//! Detections from the prediction maps: each image's best cells over a threshold, as boxes.

use super::Access::{Read, Write};
use super::{Decode, StepOp, Use};
use crate::compute::cpu::decode;
use crate::compute::cpu::exec::{CpuExec, Input};
use crate::compute::ops::OpError;
use crate::compute::recording::Elem::{Bytes, F32};
use crate::compute::recording::DETECTION_BYTES;
use crate::compute::vulkan::kernels::{Kernel, DECODE_SLOTS};
use crate::compute::vulkan::lower::{checked, words, Slot, StepDispatches, StepError};

impl StepOp for Decode {
    fn name(&self) -> &'static str {
        "decode"
    }

    fn batch(&self) -> u32 {
        self.op.n
    }

    fn uses(&self) -> Result<Vec<Use>, OpError> {
        self.op.validate()?;
        Ok(vec![
            (self.pred, self.op.input_len(), F32, Read),
            (
                self.dets,
                self.op.output_len() * DETECTION_BYTES,
                Bytes,
                Write,
            ),
            (self.counts, 4 * self.op.n as usize, Bytes, Write),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let mut d = cpu.take_bytes(self.dets);
        let mut c = cpu.take_bytes(self.counts);
        let mut scratch = cpu.take_decode_scratch();
        decode::decode_into_bytes(&self.op, cpu.f32s(self.pred), &mut scratch, &mut d, &mut c);
        cpu.put_decode_scratch(scratch);
        cpu.put_bytes(self.dets, d);
        cpu.put_bytes(self.counts, c);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        if self.op.top_k > DECODE_SLOTS / 2 {
            return Err(StepError::DecodeTopK {
                top_k: self.op.top_k,
                kept: DECODE_SLOTS / 2,
            });
        }
        let grid = checked([u64::from(self.op.n), 1, 1], "decode")?;
        dispatches.add(
            Kernel::Decode,
            vec![T(self.pred), T(self.dets), T(self.counts)],
            words(
                &[
                    &[self.op.n, self.op.classes][..],
                    &self.op.levels.words(),
                    &[self.op.threshold.to_bits(), self.op.top_k],
                ]
                .concat(),
            ),
            grid,
        );
        Ok(())
    }
}
