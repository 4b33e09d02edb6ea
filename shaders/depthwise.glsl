// The body of depthwise.comp and depthwise_direct.comp, which declare the bindings, how
// a value is read (`NAME_AT(i)`: a storage-buffer element, or a texel) and an output stored
// (`Y_STORE(i, v)`; with Y_VEC4 defined, `y4` is the output as vec4s), and may set OX, the
// outputs of a row an invocation computes (4 unless they do, a multiple of 4 with Y_VEC4).
#ifndef OX
#define OX 4u
#endif

// The 3×3 sums of outputs ox0 .. ox0 + OX − 1 of row oy, stride 1 or 2, into s: each input
// row's window (stride·(OX − 1) + 3 values, zero outside the input) loaded once. The taps
// are added in the generic loop's order.
void window3(uint xbase, uint wbase, uint oy, uint ox0, inout float s[OX]) {
    uint ix0 = ox0 * pc.stride - pc.pad; // wraps when negative
    uint span = pc.stride * (OX - 1u) + 3u;
    for (uint ky = 0u; ky < 3u; ky++) {
        uint iy = oy * pc.stride + ky - pc.pad;
        if (iy >= pc.h) {
            continue;
        }
        uint xrow = xbase + iy * pc.w;
        float win[2u * OX + 1u];
        for (uint t = 0u; t < 2u * OX + 1u; t++) {
            uint ix = ix0 + t;
            win[t] = (ix < pc.w && t < span) ? X_AT(xrow + ix) : 0.0;
        }
        float w0 = WT_AT(wbase + ky * 3u);
        float w1 = WT_AT(wbase + ky * 3u + 1u);
        float w2 = WT_AT(wbase + ky * 3u + 2u);
        if (pc.stride == 1u) {
            for (uint j = 0u; j < OX; j++) {
                s[j] += w0 * win[j];
                s[j] += w1 * win[j + 1u];
                s[j] += w2 * win[j + 2u];
            }
        } else {
            for (uint j = 0u; j < OX; j++) {
                s[j] += w0 * win[2u * j];
                s[j] += w1 * win[2u * j + 1u];
                s[j] += w2 * win[2u * j + 2u];
            }
        }
    }
}

void main() {
    uint quads = (pc.out_w + OX - 1u) / OX; // blocks of OX outputs along a row
    uint rows = pc.n * pc.c_out * pc.out_h;
    uint len = rows * quads;
    uint step = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < len; i += step) {
        uint row = i / quads; // (b·c + c)·out_h + oy
        uint ox0 = (i - row * quads) * OX;
        uint bc = row / pc.out_h;
        uint oy = row - bc * pc.out_h;
        uint c = bc % pc.c_out;
        uint xbase = bc * pc.h * pc.w;
        uint wbase = c * pc.k * pc.k;
        float s[OX];
        for (uint j = 0u; j < OX; j++) {
            s[j] = 0.0;
        }
        if (pc.k == 3u && pc.stride <= 2u) {
            window3(xbase, wbase, oy, ox0, s);
        } else for (uint ky = 0u; ky < pc.k; ky++) {
            uint iy = oy * pc.stride + ky - pc.pad; // wraps when negative
            if (iy >= pc.h) {
                continue;
            }
            uint xrow = xbase + iy * pc.w;
            for (uint kx = 0u; kx < pc.k; kx++) {
                float wv = WT_AT(wbase + ky * pc.k + kx);
                for (uint j = 0u; j < OX; j++) {
                    uint ix = (ox0 + j) * pc.stride + kx - pc.pad;
                    if (ix < pc.w) {
                        s[j] += wv * X_AT(xrow + ix);
                    }
                }
            }
        }
        float b = BIAS_AT(c);
        uint out_row = row * pc.out_w;
#ifdef Y_VEC4
        // Rows of whole blocks: a vec4 store for four outputs (on llvmpipe a storage-buffer
        // store walks the lanes one by one; det-s's forward layers all qualify).
        if (pc.out_w % OX == 0u) {
            for (uint j = 0u; j < OX; j += 4u) {
                vec4 v = vec4(s[j], s[j + 1u], s[j + 2u], s[j + 3u]) + b;
                if (pc.relu != 0u) {
                    v = max(v, vec4(0.0));
                }
                y4[(out_row + ox0 + j) / 4u] = v;
            }
            continue;
        }
#endif
        for (uint j = 0u; j < OX; j++) {
            if (ox0 + j < pc.out_w) {
                float v = s[j] + b;
                if (pc.relu != 0u) {
                    v = max(v, 0.0);
                }
                Y_STORE(out_row + ox0 + j, v);
            }
        }
    }
}
