// The body of depthwise_grad_input.comp and depthwise_grad_input_direct.comp, which declare the bindings and how
// a value is read (`NAME_AT(i)`: a storage-buffer element, or a texel).
// s / stride where s is a multiple of the stride, else a value ≥ limit (no term); s wraps
// to a huge value when the difference it came from is negative. Strides 1 and 2 (det-s's)
// avoid the integer division, slow on GPUs and worse on CPU SIMD.
uint on_grid(uint s, uint limit) {
    if (pc.stride == 1u) {
        return s;
    }
    if (pc.stride == 2u) {
        return (s & 1u) == 0u ? s >> 1 : limit;
    }
    uint d = s / pc.stride;
    return d * pc.stride == s ? d : limit;
}

void main() {
    uint quads = (pc.w + 3u) / 4u; // blocks of four inputs along a row
    uint rows = pc.n * pc.c_in * pc.h;
    uint len = rows * quads;
    uint taps = pc.k * pc.k;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint row = i / quads; // (b·c + c)·h + iy
        uint ix0 = (i - row * quads) * 4u;
        uint bc = row / pc.h;
        uint iy = row - bc * pc.h;
        uint c = bc % pc.c_in;
        uint gbase = bc * pc.out_h * pc.out_w;
        vec4 s = vec4(0.0);
        for (uint ky = 0u; ky < pc.k; ky++) {
            uint oy = on_grid(iy + pc.pad - ky, pc.out_h);
            if (oy >= pc.out_h) {
                continue;
            }
            uint grow = gbase + oy * pc.out_w;
            for (uint kx = 0u; kx < pc.k; kx++) {
                float wv = WT_AT(c * taps + ky * pc.k + kx);
                for (uint j = 0u; j < 4u; j++) {
                    uint ox = on_grid(ix0 + j + pc.pad - kx, pc.out_w);
                    if (ox < pc.out_w) {
                        uint idx = grow + ox;
                        float g = GY_AT(idx);
                        if (pc.relu == 0u || Y_AT(idx) > 0.0) {
                            s[j] += wv * g;
                        }
                    }
                }
            }
        }
        uint in_row = row * pc.w;
        for (uint j = 0u; j < 4u; j++) {
            if (ix0 + j < pc.w) {
                gx[in_row + ix0 + j] = s[j];
            }
        }
    }
}
