/* What the resampler's driver (resample.c) and its kernels (resample_avx2.c,
 * resample_avx512.c) share; not an interface of its own.
 *
 * A horizontal kernel makes one intermediate row: for each output pixel j of the window (in
 * the order written: mirrored already when flipping), for each channel c < 3,
 *     clamp((sum_{t < taps} coef[j][t] * src[offset[j] + t * channels + c]
 *            + 2^(precision-1)) >> precision, 0, 255)
 * in 32-bit integers that wrap, written packed (3 bytes a pixel) or planar (channel c at
 * dst + c * plane). A vertical kernel makes n bytes of an output row from ``taps`` rows,
 * byte by byte with the same formula. Every kernel computes exactly these numbers.
 */
#ifndef IMGPREP_RESAMPLE_IMPL_H
#define IMGPREP_RESAMPLE_IMPL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t n;          /* output pixels of the row */
    int32_t padded;     /* n rounded up to whole groups; the kernel writes that many */
    int32_t taps;       /* taps per output pixel, even */
    int32_t precision;  /* fraction bits of the weights */
    int32_t channels;   /* bytes a source pixel: 3 or 4 */
    int32_t window;     /* 1: each group's taps come from one load of the row (see perm) */
    const int32_t *offset;  /* per output (padded): byte offset of its first tap's pixel */
    const int16_t *coef;    /* per output (padded): taps weights */
    const int32_t *wide;    /* SIMD: per group, per pair of taps, per output: the pair x 4 */
    const int32_t *base;    /* SIMD window mode: per group, byte offset of its window */
    const int32_t *perm;    /* SIMD window mode: per group, 2 * group pixel indices into it */
} rs_hplan;

typedef void (*rs_hrow_fn)(const rs_hplan *h, const uint8_t *src, uint8_t *dst, size_t plane,
                           int planar);
typedef void (*rs_vrow_fn)(const uint8_t *const *rows, size_t offset, const int16_t *coef,
                           int taps, int precision, uint8_t *dst, size_t n);

typedef struct {
    const char *name;
    int group;        /* output pixels a horizontal step makes */
    int window_span;  /* pixels one window load holds (0: no window mode) */
    rs_hrow_fn hrow;
    rs_vrow_fn vrow;
} rs_kernel_desc;

extern const rs_kernel_desc rs_portable_kernel;
#if defined(__x86_64__) && defined(__GNUC__)
#define RS_X86 1
extern const rs_kernel_desc rs_avx2_kernel;
extern const rs_kernel_desc rs_avx512_kernel;
#endif

/* The sum's rounding term and the clamp, shared by the scalar code of every kernel. */
static inline uint8_t rs_clamp(uint32_t acc, int precision) {
    int32_t s = (int32_t)acc >> precision;  /* GCC: wraps, and shifts arithmetically */
    return (uint8_t)(s < 0 ? 0 : s > 255 ? 255 : s);
}

static inline uint32_t rs_bias(int precision) {
    return precision > 0 ? (uint32_t)1 << (precision - 1) : 0;
}

#endif
