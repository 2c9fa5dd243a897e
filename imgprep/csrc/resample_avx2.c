/* The resampler's AVX2 kernels (resample_impl.h says what they compute), compiled for AVX2
 * by a target attribute, so the file needs no flags of its own; resample.c runs them only on
 * a CPU that has AVX2.
 *
 * Horizontal: four output pixels a step. For each pair of taps, the two source pixels of each
 * output (8 bytes: one load per output, or, when the four outputs' taps lie within 8 pixels,
 * one 32-byte load and a permute) are spread to 16 bits, channel by channel, and multiplied
 * by the pair of weights with vpmaddwd: 32-bit sums per output and channel. Lane l of the
 * vector holds outputs l and l + 2, so the shuffles that follow put them back in order.
 * Vertical: 32 bytes a step; the bytes of two rows interleaved, spread to 16 bits and
 * multiplied by the pair of weights, as pillow-simd does.
 */
#include "resample_impl.h"

#ifdef RS_X86
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2")))

static inline int64_t load64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The pair of pixels of the lane's first (lo) or second (hi) output as 16-bit (p0, p1)
 * pairs per channel; RGB pixels are 3 bytes, their 4th channel left at zero. */
AVX2 static inline __m256i lane_mask(int channels, int hi) {
    const int o = hi ? 8 : 0, b = channels == 4 ? 4 : 3, x = channels == 4 ? o + 3 : -1;
    return _mm256_setr_epi8(
        (char)o, -1, (char)(o + b), -1, (char)(o + 1), -1, (char)(o + b + 1), -1,
        (char)(o + 2), -1, (char)(o + b + 2), -1, (char)x, -1, (char)(x < 0 ? -1 : x + b), -1,
        (char)o, -1, (char)(o + b), -1, (char)(o + 1), -1, (char)(o + b + 1), -1,
        (char)(o + 2), -1, (char)(o + b + 2), -1, (char)x, -1, (char)(x < 0 ? -1 : x + b), -1);
}

#define INLINE static inline __attribute__((always_inline))

/* The horizontal row, specialised by the callers below for the window mode, one pair of
 * taps (``pairs`` 1: a bilinear upscale, the common case) and the layout. */
AVX2 INLINE void hrow_body(const rs_hplan *h, const uint8_t *src, uint8_t *dst, size_t plane,
                           const int planar, const int window, const int pairs) {
    const __m256i mlo = lane_mask(h->channels, 0), mhi = lane_mask(h->channels, 1);
    const __m256i bias = _mm256_set1_epi32((int)rs_bias(h->precision));
    const __m128i shift = _mm_cvtsi32_si128(h->precision);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m128i rgb = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m128i planes = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1,
                                         -1);
    const int32_t groups = h->padded / 4, *off = h->offset, *base = h->base;
    const int step = 2 * h->channels;
    const __m256i *k = (const __m256i *)(const void *)h->wide;
    const __m256i *perm = (const __m256i *)(const void *)h->perm;
    uint8_t *d0 = dst, *d1 = dst + plane, *d2 = dst + 2 * plane;
    for (int32_t g = 0; g < groups; g++, off += 4) {
        __m256i a = bias, b = bias, idx = window ? _mm256_loadu_si256(perm + g) : bias;
        const uint8_t *w = src + (window ? base[g] : 0);
        for (int t = 0; t < pairs; t++, k += 2) {
            __m256i v;
            if (window) {
                v = _mm256_permutevar8x32_epi32(
                    _mm256_loadu_si256((const __m256i *)(const void *)(w + t * step)), idx);
            } else {
                const uint8_t *s = src + t * step;
                __m128i lo = _mm_set_epi64x(load64(s + off[2]), load64(s + off[0]));
                __m128i hi = _mm_set_epi64x(load64(s + off[3]), load64(s + off[1]));
                v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
            }
            a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_shuffle_epi8(v, mlo),
                                                      _mm256_loadu_si256(k)));
            b = _mm256_add_epi32(b, _mm256_madd_epi16(_mm256_shuffle_epi8(v, mhi),
                                                      _mm256_loadu_si256(k + 1)));
        }
        a = _mm256_sra_epi32(a, shift);
        b = _mm256_sra_epi32(b, shift);
        __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(a, b), _mm256_setzero_si256());
        __m128i px = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(bytes, order));
        if (planar) {
            __m128i p = _mm_shuffle_epi8(px, planes);
            int32_t r = _mm_cvtsi128_si32(p), gr = _mm_extract_epi32(p, 1),
                    bl = _mm_extract_epi32(p, 2);
            memcpy(d0 + 4 * g, &r, 4);
            memcpy(d1 + 4 * g, &gr, 4);
            memcpy(d2 + 4 * g, &bl, 4);
        } else {
            _mm_storeu_si128((__m128i *)(void *)(dst + 12 * g), _mm_shuffle_epi8(px, rgb));
        }
    }
}

AVX2 static void hrow_avx2(const rs_hplan *h, const uint8_t *src, uint8_t *dst, size_t plane,
                           int planar) {
    const int pairs = h->taps / 2;
#define RS_CALL(pl, win) \
    (pairs == 1 ? hrow_body(h, src, dst, plane, pl, win, 1) \
                : hrow_body(h, src, dst, plane, pl, win, pairs))
    if (planar) {
        if (h->window) RS_CALL(1, 1); else RS_CALL(1, 0);
    } else {
        if (h->window) RS_CALL(0, 1); else RS_CALL(0, 0);
    }
#undef RS_CALL
}

/* 32 output bytes from ``taps`` rows at ``at``. */
AVX2 static inline __m256i vblock(const uint8_t *const *rows, size_t at, const int16_t *coef,
                                 int taps, __m256i bias, __m128i shift) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i s0 = bias, s1 = bias, s2 = bias, s3 = bias;
    for (int t = 0; t < taps; t += 2) {
        int pair = t + 1 < taps;
        uint32_t kk = (uint32_t)(uint16_t)coef[t] |
                      (pair ? (uint32_t)(uint16_t)coef[t + 1] << 16 : 0);
        __m256i k = _mm256_set1_epi32((int32_t)kk);
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(rows[t] + at));
        __m256i y = pair ? _mm256_loadu_si256((const __m256i *)(const void *)(rows[t + 1] + at))
                         : zero;
        __m256i lo = _mm256_unpacklo_epi8(x, y), hi = _mm256_unpackhi_epi8(x, y);
        s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), k));
        s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), k));
        s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), k));
        s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), k));
    }
    s0 = _mm256_sra_epi32(s0, shift);
    s1 = _mm256_sra_epi32(s1, shift);
    s2 = _mm256_sra_epi32(s2, shift);
    s3 = _mm256_sra_epi32(s3, shift);
    return _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
}

AVX2 static void vrow_avx2(const uint8_t *const *rows, size_t offset, const int16_t *coef,
                           int taps, int precision, uint8_t *dst, size_t n) {
    const __m256i bias = _mm256_set1_epi32((int)rs_bias(precision));
    const __m128i shift = _mm_cvtsi32_si128(precision);
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                            vblock(rows, offset + i, coef, taps, bias, shift));
    if (i == n) return;
    if (n >= 32) {  /* the last 32 bytes again: the same values */
        _mm256_storeu_si256((__m256i *)(void *)(dst + n - 32),
                            vblock(rows, offset + n - 32, coef, taps, bias, shift));
    } else {  /* ring rows are readable 64 bytes past the end */
        uint8_t tmp[32];
        _mm256_storeu_si256((__m256i *)(void *)tmp, vblock(rows, offset, coef, taps, bias,
                                                           shift));
        memcpy(dst, tmp, n);
    }
}

const rs_kernel_desc rs_avx2_kernel = {"avx2", 4, 8, hrow_avx2, vrow_avx2};

#endif
