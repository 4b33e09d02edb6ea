#version 450
#extension GL_GOOGLE_include_directive : require
// decode: detections from the model output (ops::Decode), one workgroup per image.
//
// A heat-map cell is a candidate when its logit is the maximum of its 3×3 neighbourhood on
// its class channel and level (cells outside the level's grid ignored) and sigmoid(logit) ≥
// threshold. The best top_k are kept, ordered by score, ties by (class, level, y, x) — which
// is the cell's index in the image's output, c·cells + offset(level) + y·w + x, so a key is
// (score bits, index): scores are ≥ 0, so their bits order like the floats.
//
// Selection in shared memory: slots [0, kept) hold the best so far (kept ≤ top_k), and each
// round appends the candidates among the next 1024 − top_k cells after them (a shared
// counter hands out slots), then a bitonic sort of the smallest power of two of slots that
// holds them all puts the best first. Usually few cells are candidates, so the sort is a few
// steps rather than the 55 of all 1024 slots. The slots a candidate gets depend on timing,
// but keys are unique (the index), so the sorted order, and everything written, is a fixed
// function of the data (deterministic). 8 KiB of shared memory; top_k ≤ 512 (the lowering
// refuses more).
//
// Output: counts[b] = detections found (≤ top_k); detection j of image b at words
// 6·(b·top_k + j): class, score, x0, y0, x1, y1 (ops::Detection), centre
// ((x + offset_x)·stride, (y + offset_y)·stride), size (e^log_w·stride, e^log_h·stride),
// stride the cell's level's.
// Unused slots are zeroed.

layout(local_size_x = 256) in;

layout(std430, set = 0, binding = 0) readonly buffer Pred { float pred[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dets { uint dets[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Counts { uint counts[]; };

layout(push_constant) uniform Push {
    uint n;
    uint classes;
    uint level_count;
    uint strides[3];
    uint input_h;
    uint input_w;
    float threshold;
    uint top_k;
} pc;

#include "levels.glsl"

#define CAP 1024u
#define EMPTY 0xffffffffu

shared uint key_score[CAP];
shared uint key_index[CAP];
// Slots [0, filled) hold keys: the kept best, then this round's candidates.
shared uint filled;

// Whether key a ranks before key b: higher score, then lower index. The empty key (score
// bits 0, index EMPTY) ranks after every candidate.
bool before(uint sa, uint ia, uint sb, uint ib) {
    return sa > sb || (sa == sb && ia < ib);
}

void main() {
    uint b = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint plane = total_cells();
    uint cells = pc.classes * plane;
    uint base = b * (pc.classes + 4u) * plane;
    uint window = CAP - pc.top_k;
    uint kept = 0u;
    for (uint r0 = 0u; r0 < cells; r0 += window) {
        barrier();
        if (tid == 0u) {
            filled = kept;
        }
        // Past the kept best (the last round's sort put any others after them): empty.
        for (uint s = kept + tid; s < CAP; s += 256u) {
            key_score[s] = 0u;
            key_index[s] = EMPTY;
        }
        barrier();
        for (uint s = tid; s < window; s += 256u) {
            uint cell = r0 + s;
            if (cell >= cells) {
                break;
            }
            uint c = cell / plane;
            uint q = cell - c * plane;
            uint offset;
            uint level = level_of_cell(q, offset);
            uint gw = level_grid_w(level);
            uint gh = pc.input_h / pc.strides[level];
            int y = int((q - offset) / gw);
            int x = int((q - offset) % gw);
            float l = pred[base + cell];
            bool peak = true;
            for (int dy = -1; dy <= 1; dy++) {
                for (int dx = -1; dx <= 1; dx++) {
                    int yy = y + dy;
                    int xx = x + dx;
                    if (yy >= 0 && yy < int(gh) && xx >= 0 && xx < int(gw)
                        && pred[base + c * plane + offset + uint(yy) * gw + uint(xx)] > l) {
                        peak = false;
                    }
                }
            }
            float score = 1.0 / (1.0 + exp(-l));
            if (peak && score >= pc.threshold) {
                uint at = atomicAdd(filled, 1u);
                key_score[at] = floatBitsToUint(score);
                key_index[at] = cell;
            }
        }
        barrier();
        // The same count in every invocation: the sort's bounds, and so its barriers, are
        // uniform.
        uint count = filled;
        uint span = 2u;
        while (span < count) {
            span <<= 1;
        }
        // Bitonic sort of slots [0, span), best first.
        for (uint k = 2u; k <= span; k <<= 1) {
            for (uint j = k >> 1; j > 0u; j >>= 1) {
                barrier();
                for (uint i = tid; i < span; i += 256u) {
                    uint l = i ^ j;
                    if (l > i) {
                        uint si = key_score[i];
                        uint ii = key_index[i];
                        uint sl = key_score[l];
                        uint il = key_index[l];
                        bool swap = (i & k) == 0u ? before(sl, il, si, ii) : before(si, ii, sl, il);
                        if (swap) {
                            key_score[i] = sl;
                            key_index[i] = il;
                            key_score[l] = si;
                            key_index[l] = ii;
                        }
                    }
                }
            }
        }
        kept = min(count, pc.top_k);
    }
    barrier();
    // The sorted prefix: count the filled slots and write the detections.
    for (uint j = tid; j < pc.top_k; j += 256u) {
        uint cell = key_index[j];
        uint at = 6u * (b * pc.top_k + j);
        bool filled = cell != EMPTY;
        if (filled && (j + 1u == pc.top_k || key_index[j + 1u] == EMPTY)) {
            counts[b] = j + 1u;
        }
        if (j == 0u && !filled) {
            counts[b] = 0u;
        }
        if (!filled) {
            for (uint w = 0u; w < 6u; w++) {
                dets[at + w] = 0u;
            }
            continue;
        }
        uint c = cell / plane;
        uint q = cell - c * plane;
        uint offset;
        uint level = level_of_cell(q, offset);
        uint gw = level_grid_w(level);
        float y = float((q - offset) / gw);
        float x = float((q - offset) % gw);
        float stride = float(pc.strides[level]);
        float cx = (x + pred[base + pc.classes * plane + q]) * stride;
        float cy = (y + pred[base + (pc.classes + 1u) * plane + q]) * stride;
        float bw = exp(pred[base + (pc.classes + 2u) * plane + q]) * stride;
        float bh = exp(pred[base + (pc.classes + 3u) * plane + q]) * stride;
        dets[at] = c;
        dets[at + 1u] = key_score[j];
        dets[at + 2u] = floatBitsToUint(cx - bw / 2.0);
        dets[at + 3u] = floatBitsToUint(cy - bh / 2.0);
        dets[at + 4u] = floatBitsToUint(cx + bw / 2.0);
        dets[at + 5u] = floatBitsToUint(cy + bh / 2.0);
    }
}
