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

// One definition for each type (GLSL has no generics): FN(T v) sums v over the workgroup
// through the shared array ARR.
#ifdef SUBGROUPS
#define WORKGROUP_SUM(T, FN, ARR)                                                           \
    shared T ARR[WG_SIZE];                                                                  \
    T FN(T v) {                                                                             \
        T s = subgroupAdd(v);                                                               \
        if (subgroupElect()) {                                                              \
            ARR[gl_SubgroupID] = s;                                                         \
        }                                                                                   \
        barrier();                                                                          \
        T total = T(0.0);                                                                   \
        if (gl_SubgroupID == 0u) {                                                          \
            T t = T(0.0);                                                                   \
            for (uint i = gl_SubgroupInvocationID; i < gl_NumSubgroups;                     \
                 i += gl_SubgroupSize) {                                                    \
                t += ARR[i];                                                                \
            }                                                                               \
            total = subgroupAdd(t);                                                         \
        }                                                                                   \
        return total;                                                                       \
    }
#else
#define WORKGROUP_SUM(T, FN, ARR)                                                           \
    shared T ARR[WG_SIZE];                                                                  \
    T FN(T v) {                                                                             \
        uint lane = gl_LocalInvocationIndex;                                                \
        ARR[lane] = v;                                                                      \
        barrier();                                                                          \
        for (uint half_ = WG_SIZE / 2u; half_ > 0u; half_ >>= 1) {                          \
            if (lane < half_) {                                                             \
                ARR[lane] += ARR[lane + half_];                                             \
            }                                                                               \
            barrier();                                                                      \
        }                                                                                   \
        return ARR[0];                                                                      \
    }
#endif

WORKGROUP_SUM(float, workgroup_sum, wg_sum1)
WORKGROUP_SUM(vec4, workgroup_sum4, wg_sum4)
