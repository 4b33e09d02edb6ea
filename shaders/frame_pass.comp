#version 450
// frame_pass: a camera frame's bytes to the letterboxed 8-bit RGB image at the start of a record,
// the frame pass of runtime/src/pixels on the GPU. The host plans the filter windows
// (pixels/window.rs, the CPU pass's own) and the colour matrix; this kernel sums each output
// sample's window of every plane, converts YUV to RGB at the output's size and writes the pad
// colour around the content. One invocation writes four pixels of an output row: twelve bytes,
// three whole words (the output side is a multiple of four), so no two invocations share a word
// and no 8-bit storage is needed.

layout(local_size_x = 16, local_size_y = 4) in;

// The frame's bytes as they came from the camera (planes, strides and all), four to a word.
layout(std430, set = 0, binding = 0) readonly buffer Frame { uint frame[]; };
// The windows of four axes: a header of (starts offset, weights offset, taps) per axis, in the
// order pixels across, chroma samples across, pixel rows, chroma rows; then each axis's first
// sample per output and its weights (float bits), `taps` per output.
layout(std430, set = 0, binding = 1) readonly buffer Windows { uint win[]; };
// The record: its first size·size·3 bytes are written.
layout(std430, set = 0, binding = 2) writeonly buffer Records { uint records[]; };

layout(push_constant) uniform Push {
    uint kind;       // 0: packed RGB (3 or 4 bytes a pixel), 1: grey, 2: YUYV, 3: NV12
    uint step;       // bytes a pixel of packed RGB
    uint blue_first; // BGR and BGRA
    uint stride;     // bytes a row (both planes of NV12)
    uint chroma;     // NV12: byte offset of the chroma plane
    uint size;       // output side, pixels
    uint pad_x;      // the content's place in the output
    uint pad_y;
    uint width;
    uint height;
    uint pad;        // pad colour, 0x00BBGGRR
    float ys;        // YUV → RGB (pixels/colour.rs, YuvToRgb)
    float y0;
    float rv;
    float gu;
    float gv;
    float bu;
} pc;

const uint AXIS_X = 0u;
const uint AXIS_X_CHROMA = 1u;
const uint AXIS_Y = 2u;
const uint AXIS_Y_CHROMA = 3u;

float byte_at(uint i) {
    return float((frame[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu);
}

// The window sum of output sample (i, j) over up to three channels of a plane whose rows start
// at byte `base`, `pc.stride` apart, sample k of a row at byte k·step + offs[c].
vec3 window_sum(uint base, uint step, uvec3 offs, uint channels, uint ax, uint ay, uint i, uint j) {
    uint xt = win[3u * ax + 2u];
    uint xs = win[win[3u * ax] + i];
    uint xw = win[3u * ax + 1u] + i * xt;
    uint yt = win[3u * ay + 2u];
    uint ys = win[win[3u * ay] + j];
    uint yw = win[3u * ay + 1u] + j * yt;
    vec3 acc = vec3(0.0);
    for (uint ty = 0u; ty < yt; ++ty) {
        float wy = uintBitsToFloat(win[yw + ty]);
        uint row = base + (ys + ty) * pc.stride;
        vec3 across = vec3(0.0);
        for (uint tx = 0u; tx < xt; ++tx) {
            float wx = uintBitsToFloat(win[xw + tx]);
            uint at = row + (xs + tx) * step;
            across.x += wx * byte_at(at + offs.x);
            if (channels > 1u) {
                across.y += wx * byte_at(at + offs.y);
            }
            if (channels > 2u) {
                across.z += wx * byte_at(at + offs.z);
            }
        }
        acc += wy * across;
    }
    return acc;
}

// Content pixel (i, j), RGB in 0..255, unclipped.
vec3 content(uint i, uint j) {
    if (pc.kind == 0u) {
        uvec3 offs = pc.blue_first != 0u ? uvec3(2u, 1u, 0u) : uvec3(0u, 1u, 2u);
        return window_sum(0u, pc.step, offs, 3u, AXIS_X, AXIS_Y, i, j);
    }
    if (pc.kind == 1u) {
        return vec3(window_sum(0u, 1u, uvec3(0u), 1u, AXIS_X, AXIS_Y, i, j).x);
    }
    float y;
    vec2 uv;
    if (pc.kind == 2u) {
        // Y0 U Y1 V: luma every two bytes, chroma pairs every four.
        y = window_sum(0u, 2u, uvec3(0u), 1u, AXIS_X, AXIS_Y, i, j).x;
        uv = window_sum(0u, 4u, uvec3(1u, 3u, 0u), 2u, AXIS_X_CHROMA, AXIS_Y, i, j).xy;
    } else {
        y = window_sum(0u, 1u, uvec3(0u), 1u, AXIS_X, AXIS_Y, i, j).x;
        uv = window_sum(pc.chroma, 2u, uvec3(0u, 1u, 0u), 2u, AXIS_X_CHROMA, AXIS_Y_CHROMA, i, j).xy;
    }
    float l = pc.ys * (y - pc.y0);
    float d = uv.x - 128.0;
    float e = uv.y - 128.0;
    return vec3(l + pc.rv * e, l - pc.gu * d - pc.gv * e, l + pc.bu * d);
}

// Rounded to nearest, ties to even, as the CPU pass's bytes.
uvec3 bytes_of(vec3 rgb) {
    return uvec3(roundEven(clamp(rgb, 0.0, 255.0)));
}

void main() {
    uint quad = gl_GlobalInvocationID.x;
    uint oy = gl_GlobalInvocationID.y;
    uint n = pc.size;
    if (quad * 4u >= n || oy >= n) {
        return;
    }
    uvec3 pad = uvec3(pc.pad & 0xFFu, (pc.pad >> 8) & 0xFFu, (pc.pad >> 16) & 0xFFu);
    bool row_inside = oy >= pc.pad_y && oy < pc.pad_y + pc.height;
    uint words[3] = uint[3](0u, 0u, 0u);
    for (uint p = 0u; p < 4u; ++p) {
        uint ox = quad * 4u + p;
        uvec3 rgb = pad;
        if (row_inside && ox >= pc.pad_x && ox < pc.pad_x + pc.width) {
            rgb = bytes_of(content(ox - pc.pad_x, oy - pc.pad_y));
        }
        for (uint c = 0u; c < 3u; ++c) {
            uint k = 3u * p + c;
            words[k >> 2] |= rgb[c] << ((k & 3u) * 8u);
        }
    }
    uint first = (oy * n * 3u) / 4u + quad * 3u;
    records[first] = words[0];
    records[first + 1u] = words[1];
    records[first + 2u] = words[2];
}
