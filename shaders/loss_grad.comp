#version 450
#extension GL_GOOGLE_include_directive : require
// loss_grad: gradient of the loss (ops::CenterLoss) with respect to the predictions
// (loss_grad.glsl), N = max(1, centres) from the loss tensor a loss pass earlier in the entry
// wrote.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Pred { float pred[]; };
layout(std430, set = 0, binding = 1) readonly buffer Target { float target[]; };
layout(std430, set = 0, binding = 2) readonly buffer Loss { float loss[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Grad { float grad[]; };

#define LOSS_GRAD
#include "loss.glsl"
#include "loss_grad.glsl"

void main() {
    loss_gradients(1.0 / max(1.0, loss[4]));
}
