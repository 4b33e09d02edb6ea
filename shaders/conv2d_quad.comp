#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_quad: dense and grouped convolutions, four output pixels of a row an invocation
// (conv2d.glsl): each weight loaded serves four pixels. For CPU-type devices (lavapipe), where
// the loads bound the kernel (det-s's stem at batch 32 on 2 cores: 290 ms a dispatch with one
// pixel an invocation, 103 ms with four), and on every device for batches with many pixels
// (lower.rs: QUAD_MIN_PIXELS).

#define PX 4u
#include "conv2d.glsl"
