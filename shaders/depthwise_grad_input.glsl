// The body of depthwise_grad_input.comp and depthwise_grad_input_direct.comp, which declare
// the bindings, how a value is read (`NAME_AT(i)`: a storage-buffer element, or a texel) and
// how a gradient is stored (block_store.glsl), and may set OX, the inputs of a row an
// invocation computes (4 unless they do, a multiple of 4 with STORE4), and OY, the rows it
// computes them for (1 unless they do).
#ifndef OX
#define OX 4u
#endif
#ifndef OY
#define OY 1u
#endif
#include "block_store.glsl"
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

// The masked output gradient at (row start grow, column s), or 0 where s is off the stride
// grid or outside the row.
float grad_at(uint grow, uint s) {
    uint ox = on_grid(s, pc.out_w);
    if (ox >= pc.out_w) {
        return 0.0;
    }
    float g = GY_AT(grow + ox);
    if (pc.relu != 0u && !(Y_AT(grow + ox) > 0.0)) {
        g = 0.0;
    }
    return g;
}

// The 3×3 sums of inputs ix0 .. ix0 + OX − 1 of rows iy0 .. iy0 + OY − 1, stride 1 or 2,
// into s: each output-gradient row's window (the OX + 2 columns ix0 + pad − 2 ..
// ix0 + pad + OX − 1 reach, of which stride 2 keeps the even ones) loaded once for every
// input row it serves, and the nine weights once, where the generic loop loads a value per
// tap and input. The taps are added in the generic loop's order (a window's zeros add
// nothing).
void window3(uint gbase, uint c, uint iy0, uint ix0, inout float s[OY][OX]) {
    uint base = ix0 + pc.pad - 2u; // wraps when negative: off the grid or the row
    float w[9];
    for (uint t = 0u; t < 9u; t++) {
        w[t] = WT_AT(c * 9u + t);
    }
    // Rows iy0 + pad − 2 + t of the stride grid (t < OY + 2) reach the block's inputs;
    // row t reaches input row iy0 + dy through tap ky = dy + 2 − t. Descending t is ascending
    // ky, the generic loop's order.
    for (uint u = 0u; u < OY + 2u; u++) {
        uint t = OY + 1u - u;
        uint oy = on_grid(iy0 + pc.pad - 2u + t, pc.out_h);
        if (oy >= pc.out_h) {
            continue;
        }
        uint grow = gbase + oy * pc.out_w;
        float win[OX + 2u];
        for (uint v = 0u; v < OX + 2u; v++) {
            win[v] = grad_at(grow, base + v);
        }
        for (uint dy = 0u; dy < OY; dy++) {
            uint ky = dy + 2u - t; // wraps when t > dy + 2
            if (ky >= 3u || iy0 + dy >= pc.h) {
                continue;
            }
            for (uint j = 0u; j < OX; j++) {
                // Input ix0 + j takes column ix0 + j + pad − kx: window slot j + 2 − kx.
                s[dy][j] += w[ky * 3u] * win[j + 2u];
                s[dy][j] += w[ky * 3u + 1u] * win[j + 1u];
                s[dy][j] += w[ky * 3u + 2u] * win[j];
            }
        }
    }
}

void main() {
    uint quads = (pc.w + OX - 1u) / OX; // blocks of OX inputs along a row
    uint row_blocks = (pc.h + OY - 1u) / OY; // blocks of OY rows in a plane
    uint len = pc.n * pc.c_in * row_blocks * quads;
    uint taps = pc.k * pc.k;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint block = i / quads; // (b·c + c)·row_blocks + iy0 / OY
        uint ix0 = (i - block * quads) * OX;
        uint bc = block / row_blocks;
        uint iy0 = (block - bc * row_blocks) * OY;
        uint c = bc % pc.c_in;
        uint gbase = bc * pc.out_h * pc.out_w;
        float s[OY][OX];
        for (uint dy = 0u; dy < OY; dy++) {
            for (uint j = 0u; j < OX; j++) {
                s[dy][j] = 0.0;
            }
        }
        if (pc.k == 3u && pc.stride <= 2u) {
            window3(gbase, c, iy0, ix0, s);
        } else for (uint dy = 0u; dy < OY; dy++) {
            for (uint ky = 0u; ky < pc.k; ky++) {
                uint oy = on_grid(iy0 + dy + pc.pad - ky, pc.out_h);
                if (oy >= pc.out_h) {
                    continue;
                }
                uint grow = gbase + oy * pc.out_w;
                for (uint kx = 0u; kx < pc.k; kx++) {
                    float wv = WT_AT(c * taps + ky * pc.k + kx);
                    for (uint j = 0u; j < OX; j++) {
                        uint ox = on_grid(ix0 + j + pc.pad - kx, pc.out_w);
                        if (ox < pc.out_w) {
                            uint idx = grow + ox;
                            float g = GY_AT(idx);
                            if (pc.relu == 0u || Y_AT(idx) > 0.0) {
                                s[dy][j] += wv * g;
                            }
                        }
                    }
                }
            }
        }
        store_block(s, bc * pc.h, pc.h, pc.w, iy0, ix0, false, 0.0, false);
    }
}
