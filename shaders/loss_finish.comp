#version 450
#extension GL_GOOGLE_include_directive : require
// loss_finish: second pass of the loss (see loss_partial): one invocation adds the `parts`
// partial sums in order (finish_loss in loss.glsl; at most 512 parts, four for det-s at
// batch 32) and writes [total, focal, offset, size, centres, giou].

layout(local_size_x = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Partial { vec4 partial[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Loss { float loss[]; };

#define LOSS_PARTS
#define PARTIAL(k) partial[k]
#include "loss.glsl"

void main() {
    finish_loss();
}
