/* YUV 4:2:0 planes as the resampler's rows (see yuvrows.h). */
#include "yuvrows.h"

#include <stddef.h>
#include <string.h>

/* libjpeg-turbo's jdcolor.c: the tables' factors in 16-bit fixed point (FIX(1.40200) ...). */
enum { CR_R = 91881, CB_B = 116130, CB_G = 22554, CR_G = 46802, HALF = 1 << 15 };

#define INLINE static inline __attribute__((always_inline))

/* The column sums of chroma row pair (near, far) for chroma columns [c0 - 1, c1 + 1], each
 * clamped into the plane (libjpeg replicates the edge columns), at sum[0 .. c1 - c0 + 2). */
INLINE void column_sums(const uint8_t *restrict near, const uint8_t *restrict far,
                        unsigned c0, unsigned c1, unsigned cw, uint16_t *restrict sum) {
    const size_t n = c1 - c0;
    const uint8_t *restrict a = near + c0, *restrict b = far + c0;
    uint16_t *restrict s = sum + 1;
    for (size_t k = 0; k < n; k++) s[k] = (uint16_t)(3 * a[k] + b[k]);
    sum[0] = c0 > 0 ? (uint16_t)(3 * near[c0 - 1] + far[c0 - 1]) : sum[1];
    sum[n + 1] = c1 < cw ? (uint16_t)(3 * near[c1] + far[c1]) : sum[n];
}

/* libjpeg-turbo's h2v2_fancy_upsample along a row: output column 2c from (3 s[c] + s[c - 1]
 * + 8) >> 4, 2c + 1 from (3 s[c] + s[c + 1] + 7) >> 4; both at once, as one 16-bit store
 * (the loop the compiler vectorises). */
INLINE void upsample(const uint16_t *restrict sum, size_t n, uint8_t *restrict up) {
    uint16_t *restrict pairs = (uint16_t *)(void *)up;
    for (size_t k = 0; k < n; k++) {
        unsigned here = 3u * sum[k + 1];
        unsigned even = (here + sum[k] + 8) >> 4, odd = (here + sum[k + 2] + 7) >> 4;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        pairs[k] = (uint16_t)(even << 8 | odd);
#else
        pairs[k] = (uint16_t)(even | odd << 8);
#endif
    }
}

/* Narrow chroma (2 columns or fewer): libjpeg-turbo replicates each sample instead. */
INLINE void replicate(const uint8_t *row, unsigned c0, unsigned n, uint8_t *up) {
    for (unsigned k = 0; k < n; k++) up[2 * k] = up[2 * k + 1] = row[c0 + k];
}

INLINE uint32_t clamp255(int32_t v) { return (uint32_t)(v < 0 ? 0 : v > 255 ? 255 : v); }

/* jdcolor.c's ycc_rgb_convert: R = y + Cr_r[cr], G = y + ((Cb_g[cb] + Cr_g[cr]) >> 16),
 * B = y + Cb_b[cb], clamped; written as RGBX with X = 0. */
INLINE void to_rgbx(const uint8_t *restrict y, const uint8_t *restrict cb,
                    const uint8_t *restrict cr, unsigned n, uint8_t *restrict dst) {
    uint32_t *out = (uint32_t *)(void *)dst;
    for (size_t i = 0; i < n; i++) {
        int32_t l = y[i], b = (int32_t)cb[i] - 128, r = (int32_t)cr[i] - 128;
        uint32_t R = clamp255(l + ((CR_R * r + HALF) >> 16));
        uint32_t G = clamp255(l + ((HALF - CB_G * b - CR_G * r) >> 16));
        uint32_t B = clamp255(l + ((CB_B * b + HALF) >> 16));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        out[i] = R << 24 | G << 16 | B << 8;
#else
        out[i] = R | G << 8 | B << 16;
#endif
    }
}

INLINE void row_body(const YuvRows *s, int64_t yp, uint8_t *dst) {
    const RawImage *im = s->img;
    const unsigned y = s->y0 + (unsigned)yp, cw = im->chroma_width, ch = im->chroma_height;
    const unsigned c = y >> 1;
    const unsigned far = y & 1 ? (c + 1 < ch ? c + 1 : c) : (c > 0 ? c - 1 : 0);
    const unsigned c0 = s->x0 >> 1, c1 = ((s->x0 + s->width - 1) >> 1) + 1;
    const size_t near_at = (size_t)c * cw, far_at = (size_t)far * cw;
    if (cw > 2) {
        column_sums(im->cb + near_at, im->cb + far_at, c0, c1, cw, s->sum_b);
        column_sums(im->cr + near_at, im->cr + far_at, c0, c1, cw, s->sum_r);
        upsample(s->sum_b, c1 - c0, s->up_b);
        upsample(s->sum_r, c1 - c0, s->up_r);
    } else {
        replicate(im->cb + near_at, c0, c1 - c0, s->up_b);
        replicate(im->cr + near_at, c0, c1 - c0, s->up_r);
    }
    const unsigned skip = s->x0 & 1;
    to_rgbx(im->pixels + (size_t)y * im->width + s->x0, s->up_b + skip, s->up_r + skip,
            s->width, dst);
}

static void row_portable(const rs_rows *self, int64_t y, uint8_t *dst) {
    row_body((const YuvRows *)(const void *)self, y, dst);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void row_avx2(const rs_rows *self, int64_t y,
                                                     uint8_t *dst) {
    row_body((const YuvRows *)(const void *)self, y, dst);
}
#endif

int yuv_rows_init(YuvRows *s, const RawImage *img, unsigned x0, unsigned y0, unsigned width,
                  Scratch *mem) {
    const size_t sums = ((size_t)width / 2 + 4) * sizeof(uint16_t);
    const size_t ups = (size_t)width + 4;
    unsigned char *b = scratch_reserve(mem, 2 * sums + 2 * ups);
    if (b == NULL) return -1;
    *s = (YuvRows){.base = {.row = row_portable}, .img = img, .x0 = x0, .y0 = y0,
                   .width = width, .sum_b = (uint16_t *)(void *)b,
                   .sum_r = (uint16_t *)(void *)(b + sums), .up_b = b + 2 * sums,
                   .up_r = b + 2 * sums + ups};
#if defined(__x86_64__) && defined(__GNUC__)
    if (rs_resolve_kernel(RS_AVX2) == RS_AVX2) s->base.row = row_avx2;
#endif
    return 0;
}
