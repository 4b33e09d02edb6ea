#version 450
#extension GL_GOOGLE_include_directive : require
// conv2d_direct: dense and grouped convolutions for CPU-type devices (lavapipe), eight output
// pixels of a row an invocation (conv2d.glsl): each weight, a uniform load, serves eight
// pixels, and the index arithmetic is paid once for them (det-s's stem at batch 32 on 2 cores:
// 20 % less time than four pixels, conv2d_quad; two took twice as long, sixteen twice too).

#define PX 8u
#define TEXELS
#include "conv2d.glsl"
