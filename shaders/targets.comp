#version 450
#extension GL_GOOGLE_include_directive : require
// targets: CenterNet training targets rendered from the boxes inside the records
// (ops::Targets; the same arithmetic as the CPU twin, compute/cpu/targets.rs, so a centre
// lands in the same cell on both). One invocation per output cell (image b, cell (gx, gy) of
// one level's grid) writes all classes + 5 channels of that cell, looping over the image's
// boxes in order and taking those whose size assigns them to the cell's level: heat maps
// combine by maximum (so every cell's value is independent of the others: no atomics), and
// where two boxes share a centre cell the later box's offset and size win. With a neighbour
// weight, a cell within neighbour_radius of a box's centre cell and inside the box also gets
// that box's regression, with mask neighbour_weight (shared out as w·(K/C) where the box has
// C > K = neighbour_cells such cells), unless a centre or an earlier box's neighbour holds it
// (mask already at least this box's).
//
// A record's metadata is read as little-endian 32-bit words (meta_offset and record_stride
// are multiples of 4): box count (u16) in the low half of word meta_offset + 4, box i at
// meta_offset + 40 + 20·i as class: u32, x0, y0, x1, y1: f32.

layout(local_size_x = 256) in;
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Records { uint words[]; };
layout(std430, set = 0, binding = 1) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint n;
    uint classes;
    uint level_count;
    uint strides[3];
    uint input_h;
    uint input_w;
    uint max_boxes;
    uint record_stride;
    uint meta_offset;
    float min_overlap;
    uint flip;
    float neighbour_weight;
    uint neighbour_radius;
    uint neighbour_cells;
} pc;

#include "levels.glsl"

// CenterNet's gaussian_radius (as published, including its use of (b + √d)/2 for the first
// two roots), for a box of height h and width w in grid cells.
float gaussian_radius(float h, float w, float overlap) {
    float b1 = h + w;
    float c1 = w * h * (1.0 - overlap) / (1.0 + overlap);
    float r1 = (b1 + sqrt(max(b1 * b1 - 4.0 * c1, 0.0))) / 2.0;
    float a2 = 4.0;
    float b2 = 2.0 * (h + w);
    float c2 = (1.0 - overlap) * w * h;
    float r2 = (b2 + sqrt(max(b2 * b2 - 4.0 * a2 * c2, 0.0))) / 2.0;
    float a3 = 4.0 * overlap;
    float b3 = -2.0 * overlap * (h + w);
    float c3 = (overlap - 1.0) * w * h;
    float r3 = (b3 + sqrt(max(b3 * b3 - 4.0 * a3 * c3, 0.0))) / 2.0;
    return min(r1, min(r2, r3));
}

// How many cells of [centre − reach, centre + reach] (within 0..cells) have their centres
// strictly inside a box centred at c, `size` cells across: the CPU twin's test, one axis.
int inside_along(int centre, float c, float size, int cells) {
    int reach = int(pc.neighbour_radius);
    int count = 0;
    for (int x = max(centre - reach, 0); x <= min(centre + reach, cells - 1); x++) {
        if (abs(c - float(x) - 0.5) < size / 2.0) {
            count++;
        }
    }
    return count;
}

// The mask of a box's neighbour cells: the weight, shared out above neighbour_cells of them.
float neighbour_mask(int ccx, int ccy, float cx, float cy, float bw, float bh, int gw, int gh) {
    if (pc.neighbour_cells == 0u) {
        return pc.neighbour_weight;
    }
    bool centre_inside = abs(cx - float(ccx) - 0.5) < bw / 2.0
        && abs(cy - float(ccy) - 0.5) < bh / 2.0;
    int count = inside_along(ccx, cx, bw, gw) * inside_along(ccy, cy, bh, gh)
        - (centre_inside ? 1 : 0);
    if (count <= int(pc.neighbour_cells)) {
        return pc.neighbour_weight;
    }
    return pc.neighbour_weight * (float(pc.neighbour_cells) / float(count));
}

void main() {
    uint plane = total_cells();
    uint cells = pc.n * plane;
    uint channels = pc.classes + 5u;
    float image_w = float(pc.input_w);
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < cells; i += step) {
        uint b = i / plane;
        uint q = i - b * plane;
        uint offset;
        uint level = level_of_cell(q, offset);
        uint grid_w = level_grid_w(level);
        uint grid_h = pc.input_h / pc.strides[level];
        float stride = float(pc.strides[level]);
        int gy = int((q - offset) / grid_w);
        int gx = int((q - offset) % grid_w);
        uint base = b * channels * plane + q;
        for (uint c = 0u; c < channels; c++) {
            o[base + c * plane] = 0.0;
        }
        uint meta = (b * pc.record_stride + pc.meta_offset) >> 2;
        uint count = min(words[meta + 1u] & 0xffffu, pc.max_boxes);
        for (uint k = 0u; k < count; k++) {
            uint at = meta + 10u + 5u * k;
            uint cls = words[at];
            float x0 = uintBitsToFloat(words[at + 1u]);
            float y0 = uintBitsToFloat(words[at + 2u]);
            float x1 = uintBitsToFloat(words[at + 3u]);
            float y1 = uintBitsToFloat(words[at + 4u]);
            if (pc.flip != 0u) {
                float t = x0;
                x0 = image_w - x1;
                x1 = image_w - t;
            }
            float pw = x1 - x0;
            float ph = y1 - y0;
            // Boxes of another class or without a positive finite size are skipped (`!(v > 0)`
            // is also true for NaN), and so are boxes of another level.
            if (cls >= pc.classes || !(pw > 0.0 && ph > 0.0) || isinf(pw) || isinf(ph)
                || level_of_side(max(pw, ph)) != level) {
                continue;
            }
            float bw = pw / stride;
            float bh = ph / stride;
            float cx = (x0 + x1) / (2.0 * stride);
            float cy = (y0 + y1) / (2.0 * stride);
            int ccx = clamp(int(floor(cx)), 0, int(grid_w) - 1);
            int ccy = clamp(int(floor(cy)), 0, int(grid_h) - 1);
            int r = int(floor(max(gaussian_radius(bh, bw, pc.min_overlap), 0.0)));
            int dx = gx - ccx;
            int dy = gy - ccy;
            if (abs(dx) <= r && abs(dy) <= r) {
                float sigma = float(2 * r + 1) / 6.0;
                // The centre is exactly 1 (the focal loss tests y == 1); exp(−0) on a GPU
                // need not be.
                float v = (dx == 0 && dy == 0)
                    ? 1.0
                    : exp(-float(dx * dx + dy * dy) / (2.0 * sigma * sigma));
                uint at_heat = base + cls * plane;
                o[at_heat] = max(o[at_heat], v);
            }
            uint at_mask = base + (pc.classes + 4u) * plane;
            float mask = 0.0;
            if (dx == 0 && dy == 0) {
                mask = 1.0;
            } else if (pc.neighbour_weight > 0.0 && abs(dx) <= int(pc.neighbour_radius)
                    && abs(dy) <= int(pc.neighbour_radius)
                    && abs(cx - float(gx) - 0.5) < bw / 2.0
                    && abs(cy - float(gy) - 0.5) < bh / 2.0) {
                float weight = neighbour_mask(ccx, ccy, cx, cy, bw, bh, int(grid_w),
                    int(grid_h));
                if (o[at_mask] < weight) {
                    mask = weight;
                }
            }
            if (mask > 0.0) {
                o[base + pc.classes * plane] = cx - float(gx);
                o[base + (pc.classes + 1u) * plane] = cy - float(gy);
                o[base + (pc.classes + 2u) * plane] = log(bw);
                o[base + (pc.classes + 3u) * plane] = log(bh);
                o[at_mask] = mask;
            }
        }
    }
}
