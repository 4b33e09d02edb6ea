// The body of depthwise.comp and depthwise_direct.comp, which declare the bindings, how
// a value is read (`NAME_AT(i)`: a storage-buffer element, or a texel) and how an output is
// stored (block_store.glsl), and may set OX, the outputs of a row an invocation computes (4
// unless they do, a multiple of 4 with STORE4), and OY, the rows it computes them for (1
// unless they do).
#ifndef OX
#define OX 4u
#endif
#ifndef OY
#define OY 1u
#endif
#include "block_store.glsl"
#include "f16.glsl"

// The 3×3 sums of outputs ox0 .. ox0 + OX − 1 of rows oy0 .. oy0 + OY − 1, stride 1 or 2,
// into s: each input row's window (stride·(OX − 1) + 3 values, zero outside the input)
// loaded once for every output row it serves, and the nine weights once. The taps are added
// in the generic loop's order. With F16 the window and the weights are f16 (f16.glsl).
void window3(uint xbase, uint wbase, uint oy0, uint ox0, inout float s[OY][OX]) {
    uint ix0 = ox0 * pc.stride - pc.pad; // wraps when negative
    uint span = pc.stride * (OX - 1u) + 3u;
    OPERAND w[9];
    for (uint t = 0u; t < 9u; t++) {
        w[t] = OPERAND(WT_AT(wbase + t));
    }
    // Input rows oy0·stride − pad + r: (OY − 1)·stride + 3 of them.
    for (uint r = 0u; r < 2u * (OY - 1u) + 3u; r++) {
        uint iy = oy0 * pc.stride + r - pc.pad;
        if (r >= pc.stride * (OY - 1u) + 3u || iy >= pc.h) {
            continue;
        }
        uint xrow = xbase + iy * pc.w;
        OPERAND win[2u * OX + 1u];
        for (uint t = 0u; t < 2u * OX + 1u; t++) {
            uint ix = ix0 + t;
            win[t] = OPERAND((ix < pc.w && t < span) ? X_AT(xrow + ix) : 0.0);
        }
        for (uint dy = 0u; dy < OY; dy++) {
            uint ky = r - dy * pc.stride; // wraps when r < dy·stride
            if (ky >= 3u) {
                continue;
            }
            for (uint j = 0u; j < OX; j++) {
                uint at = j * pc.stride;
                s[dy][j] += float(w[ky * 3u] * win[at]);
                s[dy][j] += float(w[ky * 3u + 1u] * win[at + 1u]);
                s[dy][j] += float(w[ky * 3u + 2u] * win[at + 2u]);
            }
        }
    }
}

void main() {
    uint quads = (pc.out_w + OX - 1u) / OX; // blocks of OX outputs along a row
    uint row_blocks = (pc.out_h + OY - 1u) / OY; // blocks of OY rows in a plane
    uint len = pc.n * pc.c_out * row_blocks * quads;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint block = i / quads; // (b·c + c)·row_blocks + oy0 / OY
        uint ox0 = (i - block * quads) * OX;
        uint bc = block / row_blocks;
        uint oy0 = (block - bc * row_blocks) * OY;
        uint c = bc % pc.c_out;
        uint xbase = bc * pc.h * pc.w;
        uint wbase = c * pc.k * pc.k;
        float s[OY][OX];
        for (uint dy = 0u; dy < OY; dy++) {
            for (uint j = 0u; j < OX; j++) {
                s[dy][j] = 0.0;
            }
        }
        if (pc.k == 3u && pc.stride <= 2u) {
            window3(xbase, wbase, oy0, ox0, s);
        } else for (uint dy = 0u; dy < OY; dy++) {
            for (uint ky = 0u; ky < pc.k; ky++) {
                uint iy = (oy0 + dy) * pc.stride + ky - pc.pad; // wraps when negative
                if (iy >= pc.h) {
                    continue;
                }
                uint xrow = xbase + iy * pc.w;
                for (uint kx = 0u; kx < pc.k; kx++) {
                    OPERAND wv = OPERAND(WT_AT(wbase + ky * pc.k + kx));
                    for (uint j = 0u; j < OX; j++) {
                        uint ix = (ox0 + j) * pc.stride + kx - pc.pad;
                        if (ix < pc.w) {
                            s[dy][j] += float(wv * OPERAND(X_AT(xrow + ix)));
                        }
                    }
                }
            }
        }
        store_block(s, bc * pc.out_h, pc.out_h, pc.out_w, oy0, ox0, true, BIAS_AT(c),
                    pc.relu != 0u);
    }
}
