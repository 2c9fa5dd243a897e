/* The SIMD the CPU running this process offers, found once: where each module's choice of
 * kernel starts (resample.c, augment.c). */
#ifndef IMGPREP_SIMD_H
#define IMGPREP_SIMD_H

enum {
    SIMD_NONE = 0,
    SIMD_AVX2 = 1,
    SIMD_AVX512 = 2, /* AVX-512 F, BW and VL */
};

/* SIMD_NONE off x86-64 or without GCC's CPU probes. */
int simd_level(void);

#endif
