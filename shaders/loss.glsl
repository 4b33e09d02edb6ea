// Shared by the loss kernels (ops::CenterLoss): push constants and the numerically safe
// pieces of the focal loss.

layout(push_constant) uniform Push {
    uint n;
    uint classes;
    uint grid_h;
    uint grid_w;
    float alpha;
    float beta;
    float offset_weight;
    float size_weight;
    float giou_weight;
    uint parts;          // loss_partial: workgroups of the first pass
    uint cells_per_part; // loss_partial: grid cells each of them sums
} pc;

// ln(1 + e) for e ≥ 0, accurate for tiny e too (GLSL has no log1p): the classic
// log(u)·e/(u − 1) with u = 1 + e rounded, exact to a few ulp.
float log1p_pos(float e) {
    precise float u = 1.0 + e;
    if (u == 1.0) {
        return e;
    }
    precise float d = u - 1.0;
    return log(u) * (e / d);
}

// softplus(x) = ln(1 + eˣ), finite for every x.
float softplus(float x) {
    return max(x, 0.0) + log1p_pos(exp(-abs(x)));
}

// x^e, by multiplication for small whole exponents (CenterNet's 2 and 4: exact, and no
// pow(0, e) edge case), pow otherwise.
float pow_e(float x, float e) {
    if (e == floor(e) && e >= 0.0 && e <= 8.0) {
        float r = 1.0;
        for (int i = 0; i < int(e); i++) {
            r *= x;
        }
        return r;
    }
    return pow(x, e);
}

// 1 / (1 + e^−x), and 1 − that computed as 1 / (1 + eˣ) (no cancellation near 1).
float sigmoid(float x) {
    return 1.0 / (1.0 + exp(-x));
}

// 1 − GIoU of a predicted and a target box, each (centre x, centre y, log w, log h), and its
// gradient with respect to the prediction in `grad`: a transcription of ops::giou (see
// there; keep the two in step), ties resolved the same way.
const float GIOU_MAX_LOG_SIZE = 15.0;

float giou(vec4 p, vec4 t, out vec4 grad) {
    vec2 ps = exp(clamp(p.zw, -GIOU_MAX_LOG_SIZE, GIOU_MAX_LOG_SIZE));
    vec2 ts = exp(clamp(t.zw, -GIOU_MAX_LOG_SIZE, GIOU_MAX_LOG_SIZE));
    vec2 p0 = p.xy - ps / 2.0, p1 = p.xy + ps / 2.0;
    vec2 t0 = t.xy - ts / 2.0, t1 = t.xy + ts / 2.0;
    bvec2 i_lo = greaterThan(p0, t0), i_hi = lessThan(p1, t1);
    bvec2 e_lo = lessThan(p0, t0), e_hi = greaterThan(p1, t1);
    vec2 inter = mix(t1, p1, i_hi) - mix(t0, p0, i_lo);
    vec2 encl = mix(t1, p1, e_hi) - mix(t0, p0, e_lo);
    vec2 ip = max(inter, vec2(0.0));
    float i_area = ip.x * ip.y;
    float area = ps.x * ps.y;
    float u = area + ts.x * ts.y - i_area;
    float c = encl.x * encl.y;
    float d_inter = -(u + i_area) / (u * u) + 1.0 / c;
    float d_area = i_area / (u * u) - 1.0 / c;
    float d_encl = u / (c * c);
    // Per axis, ∂L/∂(low edge) and ∂L/∂(high edge); the other axis's extents multiply.
    vec2 di = mix(vec2(0.0), d_inter * ip.yx, greaterThan(inter, vec2(0.0)));
    vec2 de = d_encl * encl.yx;
    vec2 g_lo = -mix(vec2(0.0), di, i_lo) - mix(vec2(0.0), de, e_lo);
    vec2 g_hi = mix(vec2(0.0), di, i_hi) + mix(vec2(0.0), de, e_hi);
    grad = vec4(g_lo + g_hi, (g_hi - g_lo) * ps / 2.0 + d_area * area);
    return 2.0 - i_area / u - u / c;
}


#ifndef LOSS_GRAD
// Writes the loss tensor from the sums (focal, offset L1, size L1, centres) and 1 − GIoU.
void write_loss(vec4 t, float g) {
    float norm = max(1.0, t.w);
    float focal = t.x / norm;
    float off = pc.offset_weight * t.y / norm;
    float size = pc.size_weight * t.z / norm;
    float box = pc.giou_weight * g / norm;
    loss[0] = focal + off + size + box;
    loss[1] = focal;
    loss[2] = off;
    loss[3] = size;
    loss[4] = t.w;
    loss[5] = box;
}

#ifdef LOSS_PARTS
// Adds the first passes' `parts` partial sums (two vec4s a part: PARTIAL(k), defined by the
// includer, reads vec4 k) in part order and writes the loss tensor from them: loss_finish,
// and loss_grad_finish's first invocation.
void finish_loss() {
    vec4 s = vec4(0.0);
    float g = 0.0;
    for (uint i = 0u; i < pc.parts; i++) {
        s += PARTIAL(2u * i);
        g += PARTIAL(2u * i + 1u).x;
    }
    write_loss(s, g);
}
#endif
#endif
