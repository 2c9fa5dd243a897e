/* The CPU's SIMD level, probed once per process (GCC's __builtin_cpu_supports) and kept. */
#include "simd.h"

int simd_level(void) {
    static int level = -1;
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = SIMD_NONE;
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2")) l = SIMD_AVX2;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl"))
            l = SIMD_AVX512;
#endif
        __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    }
    return l;
}
