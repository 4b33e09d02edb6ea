// How depthwise.glsl and depthwise_grad_input.glsl store an invocation's block of OY rows of
// OX values. The includer defines STORE(i, v), which stores one value at element i and, where
// its output is declared as vec4s, STORE4(q, v), which stores four at vec4 q.

// Stores s at rows r0 .. r0 + OY − 1 (those below `rows`) and columns c0 .. c0 + OX − 1
// (those below `cols`) of the plane whose first row is row `row0` of the output: each value
// plus `bias` where add_bias, and at least 0 where relu.
void store_block(float s[OY][OX], uint row0, uint rows, uint cols, uint r0, uint c0,
                 bool add_bias, float bias, bool relu) {
    for (uint dy = 0u; dy < OY; dy++) {
        uint r = r0 + dy;
        if (r >= rows) {
            break;
        }
        uint at = (row0 + r) * cols + c0;
#ifdef STORE4
        // Rows of whole blocks: a vec4 store for four values (on llvmpipe a storage-buffer
        // store walks the lanes one by one; det-s's layers all qualify).
        if (cols % OX == 0u) {
            for (uint j = 0u; j < OX; j += 4u) {
                vec4 v = vec4(s[dy][j], s[dy][j + 1u], s[dy][j + 2u], s[dy][j + 3u]);
                if (add_bias) {
                    v += bias;
                }
                if (relu) {
                    v = max(v, vec4(0.0));
                }
                STORE4((at + j) / 4u, v);
            }
            continue;
        }
#endif
        for (uint j = 0u; j < OX; j++) {
            if (c0 + j < cols) {
                float v = s[dy][j];
                if (add_bias) {
                    v += bias;
                }
                if (relu) {
                    v = max(v, 0.0);
                }
                STORE(at + j, v);
            }
        }
    }
}
