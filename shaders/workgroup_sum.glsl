// The sum over a workgroup of one value an invocation, in a fixed order (deterministic, no
// float atomics), for kernels whose invocations each sum a strided subset first. Every
// invocation calls it, in uniform control flow (it holds barriers), and the sum is what
// invocation 0 gets back. Each function's shared memory is its own and is not fenced for a
// second call: a kernel calls each at most once.
//
// Plain: a tree in shared memory, log2(WG_SIZE) barriers. Where the includer defines
// SUBGROUPS (its `_subgroup` variant, used where the device's subgroups have arithmetic in
// compute shaders: kernels.rs, KernelInfo::subgroups): each subgroup adds its lanes
// (subgroupAdd), then the first subgroup adds the subgroups' sums, with one barrier. Nothing
// assumes a subgroup size or full subgroups.
//
// The includer defines WG_SIZE, its workgroup's invocations (a power of two).

shared float wg_sum1[WG_SIZE];
shared vec4 wg_sum4[WG_SIZE];

#ifdef SUBGROUPS
float workgroup_sum(float v) {
    float s = subgroupAdd(v);
    if (subgroupElect()) {
        wg_sum1[gl_SubgroupID] = s;
    }
    barrier();
    float total = 0.0;
    if (gl_SubgroupID == 0u) {
        float t = 0.0;
        for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) {
            t += wg_sum1[i];
        }
        total = subgroupAdd(t);
    }
    return total;
}

vec4 workgroup_sum4(vec4 v) {
    vec4 s = subgroupAdd(v);
    if (subgroupElect()) {
        wg_sum4[gl_SubgroupID] = s;
    }
    barrier();
    vec4 total = vec4(0.0);
    if (gl_SubgroupID == 0u) {
        vec4 t = vec4(0.0);
        for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups; i += gl_SubgroupSize) {
            t += wg_sum4[i];
        }
        total = subgroupAdd(t);
    }
    return total;
}
#else
float workgroup_sum(float v) {
    uint lane = gl_LocalInvocationIndex;
    wg_sum1[lane] = v;
    barrier();
    for (uint half_ = WG_SIZE / 2u; half_ > 0u; half_ >>= 1) {
        if (lane < half_) {
            wg_sum1[lane] += wg_sum1[lane + half_];
        }
        barrier();
    }
    return wg_sum1[0];
}

vec4 workgroup_sum4(vec4 v) {
    uint lane = gl_LocalInvocationIndex;
    wg_sum4[lane] = v;
    barrier();
    for (uint half_ = WG_SIZE / 2u; half_ > 0u; half_ >>= 1) {
        if (lane < half_) {
            wg_sum4[lane] += wg_sum4[lane + half_];
        }
        barrier();
    }
    return wg_sum4[0];
}
#endif
