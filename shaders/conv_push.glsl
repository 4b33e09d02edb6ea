// Push constants shared by every convolution kernel (compute/vulkan/lower.rs: conv_push).
// The op's integer fields (ops::Conv2d) plus what the lowering derives: the output size, and
// for the weight-gradient kernels the split of the reduction (splits × chunk), and for the
// kernels that read the records (conv2d.glsl with RGB_INPUT) the normalisation's record layout.
//
// Kernels read them through `pc`, which takes them from specialisation constants instead
// where constant 1 (SHAPE_SPECIALISED) is set: word i of the block is constant 2 + i
// (lower.rs: shape_constants; one pipeline per kernel and shape). The compiler then folds
// the shape into the code: index divisions by constants, loop bounds, the stride's branches.
// The dispatch pushes the same block either way.
layout(push_constant) uniform Push {
    uint n;
    uint c_in;
    uint h;
    uint w;
    uint c_out;
    uint k;       // kernel side
    uint stride;
    uint pad;
    uint groups;
    uint relu;    // 1: ReLU after the conv (backward: mask by y > 0)
    uint out_h;
    uint out_w;
    uint splits;  // weight gradient: parts of the batch·pixel sum (1: write gw, gb directly)
    uint chunk;   // weight gradient: batch·pixel terms per part (a multiple of GEMM_BK)
    uint skip;    // pointwise forward: 1 adds binding 4 (a residual, shaped as y) after the ReLU
    uint pad_;
    uint record_stride; // RGB input: bytes from one record to the next (ops::Normalize)
    uint flip;          // RGB input: 1 mirrors the images horizontally
} push_;

layout(constant_id = 1) const bool SHAPE_SPECIALISED = false;
layout(constant_id = 2) const uint SHAPE_N = 0u;
layout(constant_id = 3) const uint SHAPE_C_IN = 0u;
layout(constant_id = 4) const uint SHAPE_H = 0u;
layout(constant_id = 5) const uint SHAPE_W = 0u;
layout(constant_id = 6) const uint SHAPE_C_OUT = 0u;
layout(constant_id = 7) const uint SHAPE_K = 0u;
layout(constant_id = 8) const uint SHAPE_STRIDE = 0u;
layout(constant_id = 9) const uint SHAPE_PAD = 0u;
layout(constant_id = 10) const uint SHAPE_GROUPS = 0u;
layout(constant_id = 11) const uint SHAPE_RELU = 0u;
layout(constant_id = 12) const uint SHAPE_OUT_H = 0u;
layout(constant_id = 13) const uint SHAPE_OUT_W = 0u;
layout(constant_id = 14) const uint SHAPE_SPLITS = 0u;
layout(constant_id = 15) const uint SHAPE_CHUNK = 0u;
layout(constant_id = 16) const uint SHAPE_SKIP = 0u;
layout(constant_id = 17) const uint SHAPE_PAD_ = 0u;
layout(constant_id = 18) const uint SHAPE_RECORD_STRIDE = 0u;
layout(constant_id = 19) const uint SHAPE_FLIP = 0u;

struct ConvShape {
    uint n;
    uint c_in;
    uint h;
    uint w;
    uint c_out;
    uint k;
    uint stride;
    uint pad;
    uint groups;
    uint relu;
    uint out_h;
    uint out_w;
    uint splits;
    uint chunk;
    uint skip;
    uint pad_;
    uint record_stride;
    uint flip;
};

// Read once, at the start of main (a global with an initializer).
ConvShape pc = ConvShape(
    SHAPE_SPECIALISED ? SHAPE_N : push_.n,
    SHAPE_SPECIALISED ? SHAPE_C_IN : push_.c_in,
    SHAPE_SPECIALISED ? SHAPE_H : push_.h,
    SHAPE_SPECIALISED ? SHAPE_W : push_.w,
    SHAPE_SPECIALISED ? SHAPE_C_OUT : push_.c_out,
    SHAPE_SPECIALISED ? SHAPE_K : push_.k,
    SHAPE_SPECIALISED ? SHAPE_STRIDE : push_.stride,
    SHAPE_SPECIALISED ? SHAPE_PAD : push_.pad,
    SHAPE_SPECIALISED ? SHAPE_GROUPS : push_.groups,
    SHAPE_SPECIALISED ? SHAPE_RELU : push_.relu,
    SHAPE_SPECIALISED ? SHAPE_OUT_H : push_.out_h,
    SHAPE_SPECIALISED ? SHAPE_OUT_W : push_.out_w,
    SHAPE_SPECIALISED ? SHAPE_SPLITS : push_.splits,
    SHAPE_SPECIALISED ? SHAPE_CHUNK : push_.chunk,
    SHAPE_SPECIALISED ? SHAPE_SKIP : push_.skip,
    SHAPE_SPECIALISED ? SHAPE_PAD_ : push_.pad_,
    SHAPE_SPECIALISED ? SHAPE_RECORD_STRIDE : push_.record_stride,
    SHAPE_SPECIALISED ? SHAPE_FLIP : push_.flip
);
