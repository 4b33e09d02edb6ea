//! Detections from the prediction maps: each image's best cells over a threshold, as boxes.

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
        let Decode {
            op,
            pred,
            dets,
            counts,
        } = *self;
        op.validate()?;
        Ok(vec![
            (pred, op.input_len(), F32, false),
            (dets, op.output_len() * DETECTION_BYTES, Bytes, true),
            (counts, 4 * op.n as usize, Bytes, true),
        ])
    }

    fn run_cpu(&self, cpu: &mut CpuExec, _thread_split: bool, _input: Option<Input<'_>>) {
        let Decode {
            op,
            pred,
            dets,
            counts,
        } = *self;
        let mut d = cpu.take_bytes(dets);
        let mut c = cpu.take_bytes(counts);
        let mut scratch = cpu.take_decode_scratch();
        decode::decode_into_bytes(&op, cpu.f32s(pred), &mut scratch, &mut d, &mut c);
        cpu.put_decode_scratch(scratch);
        cpu.put_bytes(dets, d);
        cpu.put_bytes(counts, c);
    }

    fn lower(&self, dispatches: &mut StepDispatches<'_>) -> Result<(), StepError> {
        use Slot::Tensor as T;
        let Decode {
            op,
            pred,
            dets,
            counts,
        } = *self;
        if op.top_k > DECODE_SLOTS / 2 {
            return Err(StepError::DecodeTopK {
                top_k: op.top_k,
                kept: DECODE_SLOTS / 2,
            });
        }
        let grid = checked([u64::from(op.n), 1, 1], "decode")?;
        dispatches.add(
            Kernel::Decode,
            vec![T(pred), T(dets), T(counts)],
            words(
                &[
                    &[op.n, op.classes][..],
                    &op.levels.words(),
                    &[op.threshold.to_bits(), op.top_k],
                ]
                .concat(),
            ),
            grid,
        );
        Ok(())
    }
}
