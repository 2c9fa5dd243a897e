/* YUV 4:2:0 planes as the resampler's rows (see yuvrows.h). */
#include "yuvrows.h"

#include <stddef.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

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

#if defined(__x86_64__) && defined(__GNUC__)
#define AVX2 __attribute__((target("avx2")))

/* column_sums and upsample, 16 columns a step in 16-bit lanes (a sum is at most 4 x 255, and
 * 4 sums + 8 fit 16 bits): the same integers, byte for byte. */
AVX2 static void column_sums_avx2(const uint8_t *near, const uint8_t *far, unsigned c0,
                                  unsigned c1, unsigned cw, uint16_t *sum) {
    const size_t n = c1 - c0;
    const uint8_t *a = near + c0, *b = far + c0;
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(a + k)));
        __m256i y = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + k)));
        __m256i v = _mm256_add_epi16(_mm256_add_epi16(x, _mm256_add_epi16(x, x)), y);
        _mm256_storeu_si256((__m256i *)(void *)(sum + 1 + k), v);
    }
    for (; k < n; k++) sum[k + 1] = (uint16_t)(3 * a[k] + b[k]);
    sum[0] = c0 > 0 ? (uint16_t)(3 * near[c0 - 1] + far[c0 - 1]) : sum[1];
    sum[n + 1] = c1 < cw ? (uint16_t)(3 * near[c1] + far[c1]) : sum[n];
}

AVX2 static void upsample_avx2(const uint16_t *sum, size_t n, uint8_t *up) {
    const __m256i eight = _mm256_set1_epi16(8), seven = _mm256_set1_epi16(7);
    size_t k = 0;
    for (; k + 16 <= n; k += 16) {
        __m256i s0 = _mm256_loadu_si256((const __m256i *)(const void *)(sum + k));
        __m256i s1 = _mm256_loadu_si256((const __m256i *)(const void *)(sum + k + 1));
        __m256i s2 = _mm256_loadu_si256((const __m256i *)(const void *)(sum + k + 2));
        __m256i here = _mm256_add_epi16(s1, _mm256_add_epi16(s1, s1));
        __m256i even = _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(here, s0), eight), 4);
        __m256i odd = _mm256_srli_epi16(_mm256_add_epi16(_mm256_add_epi16(here, s2), seven), 4);
        _mm256_storeu_si256((__m256i *)(void *)(up + 2 * k),
                            _mm256_or_si256(even, _mm256_slli_epi16(odd, 8)));
    }
    upsample(sum + k, n - k, up + 2 * k);
}
#endif

/* The row's chroma upsampled into s->up_b and s->up_r (from column x0 & ~1), with the AVX2
 * loops when ``simd``; the Y row. */
INLINE const uint8_t *chroma_row(const YuvRows *s, int64_t yp, const int simd) {
    const RawImage *im = s->img;
    const unsigned y = s->y0 + (unsigned)yp, cw = im->chroma_width, ch = im->chroma_height;
    const unsigned c = y >> 1;
    const unsigned far = y & 1 ? (c + 1 < ch ? c + 1 : c) : (c > 0 ? c - 1 : 0);
    const unsigned c0 = s->x0 >> 1, c1 = ((s->x0 + s->width - 1) >> 1) + 1;
    const size_t near_at = (size_t)c * cw, far_at = (size_t)far * cw;
    if (cw <= 2) {
        replicate(im->cb + near_at, c0, c1 - c0, s->up_b);
        replicate(im->cr + near_at, c0, c1 - c0, s->up_r);
#if defined(__x86_64__) && defined(__GNUC__)
    } else if (simd) {
        column_sums_avx2(im->cb + near_at, im->cb + far_at, c0, c1, cw, s->sum_b);
        column_sums_avx2(im->cr + near_at, im->cr + far_at, c0, c1, cw, s->sum_r);
        upsample_avx2(s->sum_b, c1 - c0, s->up_b);
        upsample_avx2(s->sum_r, c1 - c0, s->up_r);
#endif
    } else {
        column_sums(im->cb + near_at, im->cb + far_at, c0, c1, cw, s->sum_b);
        column_sums(im->cr + near_at, im->cr + far_at, c0, c1, cw, s->sum_r);
        upsample(s->sum_b, c1 - c0, s->up_b);
        upsample(s->sum_r, c1 - c0, s->up_r);
    }
    return im->pixels + (size_t)y * im->width + s->x0;
}

static void row_portable(const rs_rows *self, int64_t y, uint8_t *dst) {
    const YuvRows *s = (const YuvRows *)(const void *)self;
    const uint8_t *luma = chroma_row(s, y, 0);
    const unsigned skip = s->x0 & 1;
    to_rgbx(luma, s->up_b + skip, s->up_r + skip, s->width, dst);
}

#if defined(__x86_64__) && defined(__GNUC__)
/* to_rgbx, 16 pixels a step in 16-bit lanes: each product of the tables split as
 * k x = 65536 m x + k' x with |k'| < 2^15 (91881 = 65536 + 26345, 116130 = 131072 - 14942,
 * -46802 = -65536 + 18734), so that floor((k x + c) / 65536) = m x + floor((k' x + c) /
 * 65536) exactly, and k' x + c is one vpmaddwd of (x, 2) by (k', c / 2): the same integers
 * as the portable loop, byte for byte. */
AVX2 static void to_rgbx_avx2(const uint8_t *y, const uint8_t *cb, const uint8_t *cr,
                              size_t n, uint8_t *dst) {
    const __m256i c128 = _mm256_set1_epi16(128), two = _mm256_set1_epi16(2);
    const __m256i kr = _mm256_set1_epi32((int)(16384u << 16 | 26345u));
    const __m256i kb = _mm256_set1_epi32((int)(16384u << 16 | (uint16_t)-14942));
    const __m256i kg = _mm256_set1_epi32((int)(18734u << 16 | (uint16_t)-22554));
    const __m256i half = _mm256_set1_epi32(HALF), zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i l = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(y + i)));
        __m256i b = _mm256_sub_epi16(_mm256_cvtepu8_epi16(
            _mm_loadu_si128((const __m128i *)(const void *)(cb + i))), c128);
        __m256i r = _mm256_sub_epi16(_mm256_cvtepu8_epi16(
            _mm_loadu_si128((const __m128i *)(const void *)(cr + i))), c128);
#define FRACTION(x, w, k, add) _mm256_packs_epi32( \
        _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi16(x, w), k), \
                                           add), 16), \
        _mm256_srai_epi32(_mm256_add_epi32(_mm256_madd_epi16(_mm256_unpackhi_epi16(x, w), k), \
                                           add), 16))
        __m256i R = _mm256_add_epi16(_mm256_add_epi16(l, r), FRACTION(r, two, kr, zero));
        __m256i G = _mm256_add_epi16(_mm256_sub_epi16(l, r), FRACTION(b, r, kg, half));
        __m256i B = _mm256_add_epi16(_mm256_add_epi16(l, _mm256_add_epi16(b, b)),
                                     FRACTION(b, two, kb, zero));
#undef FRACTION
        __m256i rg = _mm256_unpacklo_epi8(_mm256_packus_epi16(R, zero),
                                          _mm256_packus_epi16(G, zero));
        __m256i bx = _mm256_unpacklo_epi8(_mm256_packus_epi16(B, zero), zero);
        __m256i lo = _mm256_unpacklo_epi16(rg, bx), hi = _mm256_unpackhi_epi16(rg, bx);
        _mm256_storeu_si256((__m256i *)(void *)(dst + 4 * i),
                            _mm256_permute2x128_si256(lo, hi, 0x20));
        _mm256_storeu_si256((__m256i *)(void *)(dst + 4 * i + 32),
                            _mm256_permute2x128_si256(lo, hi, 0x31));
    }
    to_rgbx(y + i, cb + i, cr + i, n - i, dst + 4 * i);
}

AVX2 static void row_avx2(const rs_rows *self, int64_t y, uint8_t *dst) {
    const YuvRows *s = (const YuvRows *)(const void *)self;
    const uint8_t *luma = chroma_row(s, y, 1);
    const unsigned skip = s->x0 & 1;
    to_rgbx_avx2(luma, s->up_b + skip, s->up_r + skip, s->width, dst);
}
#endif

int yuv_rows_init(YuvRows *s, const RawImage *img, unsigned x0, unsigned y0, unsigned width,
                  int64_t kernel, Scratch *mem) {
    const size_t sums = ((size_t)width / 2 + 4) * sizeof(uint16_t);
    /* a multiple of 16, so that up_r is as aligned as up_b: upsample stores 16-bit pairs */
    const size_t ups = ((size_t)width + 4 + 15) & ~(size_t)15;
    unsigned char *b = scratch_reserve(mem, 2 * sums + 2 * ups);
    if (b == NULL) return -1;
    *s = (YuvRows){.base = {.row = row_portable}, .img = img, .x0 = x0, .y0 = y0,
                   .width = width, .sum_b = (uint16_t *)(void *)b,
                   .sum_r = (uint16_t *)(void *)(b + sums), .up_b = b + 2 * sums,
                   .up_r = b + 2 * sums + ups};
#if defined(__x86_64__) && defined(__GNUC__)
    if (rs_resolve_kernel(kernel) >= RS_AVX2) s->base.row = row_avx2;
#endif
    return 0;
}
