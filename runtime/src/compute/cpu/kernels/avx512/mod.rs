//! The AVX-512 set (x86-64 CPUs with AVX-512F: Intel since Skylake-SP, AMD since Zen 4).
//!
//! Its own kernels are the ones where 16 lanes and 32 registers paid: the fused GEMM's
//! register tiles (8 rows × 16 columns, one accumulator a row, the A element broadcast from
//! memory inside the FMA, ragged edges under a lane mask: det-s's weight-gradient shapes
//! 5–13 % faster than the AVX2 tiles on a Zen 4 core; 8 rows × 32 columns where B's panels
//! come in pairs, det-s's forward pass 0.85× the time of the 16-column tiles on a Sapphire
//! Rapids core) and the stem's tap split. The rest is the AVX2 set's: the dot kernel of the
//! weight gradients ran no faster in 16 lanes, even in the 4×4 tiles the registers allow
//! (14.0 µs against 13.9 for a 32×1024×16 product; Zen 4 executes a 512-bit FMA as two
//! 256-bit halves). The stride-1 3×3 depthwise plane is its own (16 columns a vector, the
//! border by lane masks: det-s's forward 0.96–0.97× the time with the AVX2 plane on a
//! Sapphire Rapids core), and so is the stride-2 one (its forward 0.98–0.99× the time with
//! the AVX2 plane), and so is the byte-to-float row of the stem's RGB input (channels
//! gathered by lane permutations, 0.98×). Every CPU with AVX-512F has AVX2 and FMA (checked
//! with it), so calling the AVX2 kernels is sound.

mod dw3x3;
mod elementwise;
mod frame;
mod gemm;

use super::avx2;
use super::{KernelSet, Kernels};

static KERNELS: Kernels = Kernels {
    set: KernelSet::Avx512,
    gemm_fused: Some(gemm::fused),
    gemm_accumulate: avx2::gemm::accumulate,
    dw3x3_conv: avx2::dw3x3::conv,
    dw3x3_same: Some(dw3x3::same),
    dw3x3_half: Some(dw3x3::half),
    dense3x3_half: Some(gemm::dense3x3_half),
    dw3x3_weight_grad: avx2::dw3x3::weight_grad,
    dw3x3_input_grad_s2: avx2::dw3x3::input_grad_s2,
    rgb_row: elementwise::rgb_row,
    weighted_rows: frame::weighted_rows,
    gather_taps: Some(frame::gather_taps),
};

/// The set, where the CPU has AVX-512F and also AVX2 and FMA (the kernels it shares with
/// that set).
pub(super) fn kernels() -> Option<&'static Kernels> {
    let here = std::arch::is_x86_feature_detected!("avx512f") && avx2::kernels().is_some();
    here.then_some(&KERNELS)
}
