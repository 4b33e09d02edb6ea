//! Where a command buffer needs a barrier between two dispatches, and no more.
//!
//! A compute→compute memory barrier between every two dispatches is always correct, but each
//! one drains the GPU: the next dispatch waits until the last workgroup of the previous one
//! has finished, even when the two touch different buffers (the optimizer's updates of
//! different tensors, a conv's input and weight gradients). A barrier is needed before a
//! dispatch only where it reads or writes a buffer written since the last barrier, or writes a
//! buffer read since then. Tensors that share a buffer share a `vk::Buffer`, so comparing
//! whole buffers is exact for the engine's bindings (every binding is a whole buffer).
//!
//! Which bindings a kernel writes comes from its SPIR-V: GLSL's `readonly` is SPIR-V's
//! `NonWritable` decoration, so a kernel's table entry cannot disagree with its shader. The
//! validation layer's synchronization validation (on whenever validation is) reports any
//! barrier this leaves out that was needed.

use std::collections::HashSet;
use std::sync::OnceLock;

use super::kernels::Kernel;

/// Bit `b` set: the kernel may write binding `b` (set 0).
pub fn written_bindings(kernel: Kernel) -> u32 {
    static MASKS: OnceLock<Vec<u32>> = OnceLock::new();
    let masks = MASKS.get_or_init(|| {
        Kernel::ALL
            .iter()
            .map(|k| {
                writable_bindings(k.info().spirv)
                    .unwrap_or_else(|e| panic!("embedded SPIR-V of {k}: {e}"))
            })
            .collect()
    });
    let index = Kernel::ALL.iter().position(|&k| k == kernel);
    masks[index.expect("every kernel is in Kernel::ALL")]
}

/// For each of `dispatches` (the buffers it binds, in binding order, and its written-binding
/// mask), whether a barrier must come before it. The first needs none: the command buffer's
/// opening barrier orders it after earlier submissions.
pub fn needed<B: Copy + Eq + std::hash::Hash>(dispatches: &[(Vec<B>, u32)]) -> Vec<bool> {
    let mut read: HashSet<B> = HashSet::new();
    let mut written: HashSet<B> = HashSet::new();
    let mut out = Vec::with_capacity(dispatches.len());
    for (buffers, writes) in dispatches {
        let writes_binding = |i: usize| i < 32 && writes & (1 << i) != 0;
        let hazard = buffers
            .iter()
            .enumerate()
            .any(|(i, b)| written.contains(b) || (writes_binding(i) && read.contains(b)));
        if hazard {
            read.clear();
            written.clear();
        }
        out.push(hazard);
        for (i, &b) in buffers.iter().enumerate() {
            if writes_binding(i) {
                written.insert(b);
            } else {
                read.insert(b);
            }
        }
    }
    out
}

const OP_TYPE_INT: u32 = 21;
const OP_TYPE_IMAGE: u32 = 25;
const OP_TYPE_SAMPLED_IMAGE: u32 = 27;
const OP_TYPE_POINTER: u32 = 32;
const OP_VARIABLE: u32 = 59;
const OP_DECORATE: u32 = 71;
const OP_MEMBER_DECORATE: u32 = 72;
const DECORATION_NON_WRITABLE: u32 = 24;
const DECORATION_BINDING: u32 = 33;
const DECORATION_DESCRIPTOR_SET: u32 = 34;
const SPIRV_MAGIC: u32 = 0x0723_0203;

/// The bindings of descriptor set 0 that `spirv` does not mark `NonWritable` (on the
/// variable or on every member of its block), as a mask.
pub fn writable_bindings(spirv: &[u8]) -> Result<u32, SpirvError> {
    reflect_bindings(spirv).map(|b| b.writable)
}

/// Masks of descriptor set 0's bindings, read from a kernel's SPIR-V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShaderBindings {
    /// Bindings the shader may write.
    pub writable: u32,
    /// Bindings declared as sampled images (`samplerBuffer`: uniform texel buffers).
    pub texels: u32,
    /// The texel bindings whose texels are integers (`usamplerBuffer`, `isamplerBuffer`).
    pub int_texels: u32,
}

/// Why embedded SPIR-V could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SpirvError {
    #[error("{0} bytes is not a SPIR-V module")]
    Length(usize),
    #[error("bad SPIR-V magic")]
    Magic,
    #[error("instruction at word {at} runs past the module")]
    Truncated { at: usize },
    #[error("binding {0} is beyond the 32 this engine tracks")]
    Binding(u32),
}

/// The bindings of descriptor set 0 of `spirv`: which it may write, which are texel buffers.
pub fn reflect_bindings(spirv: &[u8]) -> Result<ShaderBindings, SpirvError> {
    if !spirv.len().is_multiple_of(4) || spirv.len() < 20 {
        return Err(SpirvError::Length(spirv.len()));
    }
    let words: Vec<u32> = spirv
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if words[0] != SPIRV_MAGIC {
        return Err(SpirvError::Magic);
    }
    let mut binding = std::collections::HashMap::new(); // variable → binding
    let mut set = std::collections::HashMap::new(); // variable → descriptor set
    let mut non_writable = HashSet::new(); // ids decorated NonWritable
    let mut members = std::collections::HashMap::<u32, (u32, u32)>::new(); // struct → (members marked, highest member + 1)
    let mut pointee = std::collections::HashMap::new(); // pointer type → pointed-to type
    let mut var_type = std::collections::HashMap::new(); // variable → its pointer type
    let mut sampled = std::collections::HashMap::new(); // sampled-image type → image type
    let mut image = std::collections::HashMap::new(); // image type → its texels' type
    let mut ints = HashSet::new(); // integer types
    let mut at = 5;
    while at < words.len() {
        let (count, op) = ((words[at] >> 16) as usize, words[at] & 0xffff);
        if count == 0 || at + count > words.len() {
            return Err(SpirvError::Truncated { at });
        }
        let w = &words[at..at + count];
        match op {
            OP_DECORATE if count >= 3 => match (w[2], w.get(3)) {
                (DECORATION_BINDING, Some(&b)) => {
                    binding.insert(w[1], b);
                }
                (DECORATION_DESCRIPTOR_SET, Some(&s)) => {
                    set.insert(w[1], s);
                }
                (DECORATION_NON_WRITABLE, _) => {
                    non_writable.insert(w[1]);
                }
                _ => {}
            },
            OP_MEMBER_DECORATE if count >= 4 => {
                let entry = members.entry(w[1]).or_default();
                entry.1 = entry.1.max(w[2] + 1);
                if w[3] == DECORATION_NON_WRITABLE {
                    entry.0 += 1;
                }
            }
            OP_TYPE_INT if count >= 2 => {
                ints.insert(w[1]);
            }
            OP_TYPE_IMAGE if count >= 3 => {
                image.insert(w[1], w[2]);
            }
            OP_TYPE_SAMPLED_IMAGE if count >= 3 => {
                sampled.insert(w[1], w[2]);
            }
            OP_TYPE_POINTER if count >= 4 => {
                pointee.insert(w[1], w[3]);
            }
            OP_VARIABLE if count >= 4 => {
                var_type.insert(w[2], w[1]);
            }
            _ => {}
        }
        at += count;
    }
    let mut found = ShaderBindings {
        writable: 0,
        texels: 0,
        int_texels: 0,
    };
    for (&var, &b) in &binding {
        if set.get(&var).copied().unwrap_or(0) != 0 {
            continue;
        }
        if b >= 32 {
            return Err(SpirvError::Binding(b));
        }
        let block = var_type.get(&var).and_then(|t| pointee.get(t));
        // Every member of a block is marked NonWritable by glslc for a `readonly` buffer; a
        // block's member count is the highest member any decoration names, plus one.
        let readonly_block = block
            .and_then(|s| members.get(s))
            .is_some_and(|&(marked, len)| marked >= len && len > 0);
        // Texel buffers (sampled images) are never written.
        if let Some(img) = block.and_then(|t| sampled.get(t)) {
            found.texels |= 1 << b;
            if image.get(img).is_some_and(|texel| ints.contains(texel)) {
                found.int_texels |= 1 << b;
            }
        } else if !(non_writable.contains(&var) || readonly_block) {
            found.writable |= 1 << b;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shaders_say_which_bindings_they_write() {
        // As the kernels' table documents them (kernels.rs): `(w)` and `(rw)` bindings.
        let cases = [
            (Kernel::Saxpy, 0b10),
            (Kernel::Pointwise, 0b1000),
            (Kernel::PointwiseDirect4, 0b1000),
            (Kernel::Conv2dGradWeight, 0b11_1000),
            (Kernel::Conv2dGradReduce, 0b110),
            (Kernel::Conv2dGradReduceDirect, 0b110),
            (Kernel::Conv2dGradWeightDirect, 0b11_1000),
            (Kernel::Conv2dGradWeightDirect4, 0b11_1000),
            (Kernel::Conv2dGradInputDirect4, 0b1000),
            (Kernel::DepthwiseDirect, 0b1000),
            (Kernel::DepthwiseGradInputDirect, 0b1000),
            (Kernel::AddAssign, 0b1),
            (Kernel::AdamW, 0b1101),
            (Kernel::AdamWEma, 0b10_1101),
            (Kernel::Ema, 0b1),
            (Kernel::Targets, 0b10),
            (Kernel::LossPartial, 0b1100),
            (Kernel::Decode, 0b110),
        ];
        for (kernel, mask) in cases {
            assert_eq!(
                written_bindings(kernel),
                mask,
                "{kernel}: {:b}",
                written_bindings(kernel)
            );
        }
        for k in Kernel::ALL {
            let mask = written_bindings(k);
            assert!(mask != 0, "{k} writes something");
            assert!(mask < 1 << k.info().bindings, "{k}: only its own bindings");
        }
    }

    #[test]
    fn malformed_spirv_is_refused() {
        assert!(writable_bindings(&[0; 7]).is_err());
        assert_eq!(writable_bindings(&[0; 20]), Err(SpirvError::Magic));
        let mut truncated = Kernel::Add.info().spirv.to_vec();
        truncated.truncate(24); // the header and the first word of a two-word instruction
        let e = writable_bindings(&truncated).unwrap_err();
        assert!(e.to_string().contains("runs past"), "{e}");
    }

    #[test]
    fn barriers_go_only_where_an_access_follows_a_write() {
        let d = |buffers: &[u32], writes: u32| (buffers.to_vec(), writes);
        let plan = needed(&[
            d(&[1, 2], 0b10),   // 0: reads 1, writes 2
            d(&[1, 3], 0b10),   // 1: reads 1 (read-read is fine), writes 3
            d(&[2, 4], 0b10),   // 2: reads 2, written by 0: barrier
            d(&[5, 6], 0b10),   // 3: independent
            d(&[7, 5], 0b01),   // 4: writes 7, reads 5 (read by 3 too): fine
            d(&[6, 8], 0b10),   // 5: reads 6, written by 3: barrier
            d(&[9, 6], 0b01),   // 6: writes 9, reads 6: fine
            d(&[6, 10], 0b01),  // 7: writes 6, read by 6 since the barrier: barrier (WAR)
            d(&[11, 11], 0b01), // 8: reads and writes 11 itself: fine
            d(&[11], 0b1),      // 9: writes 11, written by 8: barrier (WAW)
        ]);
        assert_eq!(
            plan,
            [false, false, true, false, false, true, false, true, false, true]
        );
        assert!(needed::<u32>(&[]).is_empty());
    }
}
