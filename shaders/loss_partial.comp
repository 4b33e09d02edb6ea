#version 450
#extension GL_GOOGLE_include_directive : require
// loss_partial: see loss_partial.glsl.
#include "loss_partial.glsl"
