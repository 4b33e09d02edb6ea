// Push constants shared by every convolution kernel (compute/vulkan/lower.rs: conv_push).
// The op's integer fields (ops::Conv2d) plus what the lowering derives: the output size, and
// for the weight-gradient kernels the split of the reduction (splits × chunk), and for the
// kernels that read the records (conv2d.glsl with RGB_INPUT) the normalisation's record layout.
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
} pc;
