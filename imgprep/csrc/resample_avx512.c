/* The resampler's AVX-512 kernels (F, BW, VL: Skylake-SP, Ice Lake, Zen 4 and later), the AVX2
 * kernels' scheme at twice the width: eight output pixels a horizontal step (lane l of the
 * vector holds outputs l and l + 4; the pixel pairs come from one 64-byte load and a permute
 * when the eight outputs' taps lie within 16 pixels, else from eight loads), 64 bytes a vertical
 * step, and masked loads and stores for a row's last bytes. Compiled by a target attribute;
 * resample.c runs them only on a CPU that has all three extensions.
 */
#include "resample_impl.h"

#ifdef RS_X86
#include <immintrin.h>
#include <string.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

AVX512 static inline __m512i lane_mask(int channels, int hi) {
    const int o = hi ? 8 : 0, b = channels == 4 ? 4 : 3, x = channels == 4 ? o + 3 : -1;
    const __m128i m = _mm_setr_epi8(
        (char)o, -1, (char)(o + b), -1, (char)(o + 1), -1, (char)(o + b + 1), -1,
        (char)(o + 2), -1, (char)(o + b + 2), -1, (char)x, -1, (char)(x < 0 ? -1 : x + b), -1);
    return _mm512_broadcast_i32x4(m);
}

#define INLINE static inline __attribute__((always_inline))

static inline int64_t load64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The pixel pairs of outputs a and b (8 bytes each at s + oa, s + ob) as one 128-bit lane. */
AVX512 INLINE __m128i pair_lane(const uint8_t *s, int32_t oa, int32_t ob) {
    return _mm_set_epi64x(load64(s + ob), load64(s + oa));
}

/* The horizontal row, specialised by the callers below for the window mode, one pair of
 * taps (``pairs`` 1: a bilinear upscale, the common case) and the layout. */
AVX512 INLINE void hrow_body(const rs_hplan *h, const uint8_t *src, uint8_t *dst, size_t plane,
                             const int planar, const int window, const int pairs) {
    const __m512i mlo = lane_mask(h->channels, 0), mhi = lane_mask(h->channels, 1);
    const __m512i bias = _mm512_set1_epi32((int)rs_bias(h->precision));
    const __m512i zero = _mm512_setzero_si512();
    const __m128i shift = _mm_cvtsi32_si128(h->precision);
    const __m128i rgb = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m128i planes = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, -1, -1, -1,
                                         -1);
    const int32_t groups = h->padded / 8, *off = h->offset, *base = h->base;
    const int step = 2 * h->channels;
    const __m512i *k = (const __m512i *)(const void *)h->wide;
    const __m512i *perm = (const __m512i *)(const void *)h->perm;
    uint8_t *d0 = dst, *d1 = dst + plane, *d2 = dst + 2 * plane;
    for (int32_t g = 0; g < groups; g++, off += 8) {
        __m512i a = bias, b = bias, idx = window ? _mm512_loadu_si512(perm + g) : zero;
        const uint8_t *w = src + (window ? base[g] : 0);
        for (int t = 0; t < pairs; t++, k += 2) {
            __m512i v;
            if (window) {
                v = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(w + t * step));
            } else {  /* lane l: outputs l and l + 4 (a gather is slower on some CPUs) */
                const uint8_t *s = src + t * step;
                __m256i lo = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(pair_lane(s, off[0], off[4])),
                    pair_lane(s, off[1], off[5]), 1);
                __m256i hi = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(pair_lane(s, off[2], off[6])),
                    pair_lane(s, off[3], off[7]), 1);
                v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            }
            a = _mm512_add_epi32(a, _mm512_madd_epi16(_mm512_shuffle_epi8(v, mlo),
                                                      _mm512_loadu_si512(k)));
            b = _mm512_add_epi32(b, _mm512_madd_epi16(_mm512_shuffle_epi8(v, mhi),
                                                      _mm512_loadu_si512(k + 1)));
        }
        /* outputs 0-3 and 4-7 as RGBX bytes, clamped to 0..255 */
        __m128i pa = _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_sra_epi32(a, shift), zero));
        __m128i pb = _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_sra_epi32(b, shift), zero));
        if (planar) {
            pa = _mm_shuffle_epi8(pa, planes);
            pb = _mm_shuffle_epi8(pb, planes);
            __m128i rg = _mm_unpacklo_epi32(pa, pb), bx = _mm_unpackhi_epi32(pa, pb);
            _mm_storel_epi64((__m128i *)(void *)(d0 + 8 * g), rg);
            _mm_storel_epi64((__m128i *)(void *)(d1 + 8 * g), _mm_unpackhi_epi64(rg, rg));
            _mm_storel_epi64((__m128i *)(void *)(d2 + 8 * g), bx);
        } else {
            _mm_storeu_si128((__m128i *)(void *)(dst + 24 * g), _mm_shuffle_epi8(pa, rgb));
            _mm_storeu_si128((__m128i *)(void *)(dst + 24 * g + 12), _mm_shuffle_epi8(pb, rgb));
        }
    }
}

AVX512 static void hrow_avx512(const rs_hplan *h, const uint8_t *src, uint8_t *dst,
                               size_t plane, int planar) {
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

/* 64 output bytes from ``taps`` rows at ``at``, the rows read under ``m``. */
AVX512 static inline __m512i vblock(const uint8_t *const *rows, size_t at, const int16_t *coef,
                                   int taps, __m512i bias, __m128i shift, __mmask64 m) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i s0 = bias, s1 = bias, s2 = bias, s3 = bias;
    for (int t = 0; t < taps; t += 2) {
        int pair = t + 1 < taps;
        uint32_t kk = (uint32_t)(uint16_t)coef[t] |
                      (pair ? (uint32_t)(uint16_t)coef[t + 1] << 16 : 0);
        __m512i k = _mm512_set1_epi32((int32_t)kk);
        __m512i x = _mm512_maskz_loadu_epi8(m, rows[t] + at);
        __m512i y = pair ? _mm512_maskz_loadu_epi8(m, rows[t + 1] + at) : zero;
        __m512i lo = _mm512_unpacklo_epi8(x, y), hi = _mm512_unpackhi_epi8(x, y);
        s0 = _mm512_add_epi32(s0, _mm512_madd_epi16(_mm512_unpacklo_epi8(lo, zero), k));
        s1 = _mm512_add_epi32(s1, _mm512_madd_epi16(_mm512_unpackhi_epi8(lo, zero), k));
        s2 = _mm512_add_epi32(s2, _mm512_madd_epi16(_mm512_unpacklo_epi8(hi, zero), k));
        s3 = _mm512_add_epi32(s3, _mm512_madd_epi16(_mm512_unpackhi_epi8(hi, zero), k));
    }
    s0 = _mm512_sra_epi32(s0, shift);
    s1 = _mm512_sra_epi32(s1, shift);
    s2 = _mm512_sra_epi32(s2, shift);
    s3 = _mm512_sra_epi32(s3, shift);
    return _mm512_packus_epi16(_mm512_packs_epi32(s0, s1), _mm512_packs_epi32(s2, s3));
}

AVX512 static void vrow_avx512(const uint8_t *const *rows, size_t offset, const int16_t *coef,
                               int taps, int precision, uint8_t *dst, size_t n) {
    const __m512i bias = _mm512_set1_epi32((int)rs_bias(precision));
    const __m128i shift = _mm_cvtsi32_si128(precision);
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        _mm512_storeu_si512(dst + i, vblock(rows, offset + i, coef, taps, bias, shift,
                                            ~(__mmask64)0));
    if (i < n) {
        __mmask64 m = ((__mmask64)1 << (n - i)) - 1;
        _mm512_mask_storeu_epi8(dst + i, m, vblock(rows, offset + i, coef, taps, bias, shift,
                                                   m));
    }
}

const rs_kernel_desc rs_avx512_kernel = {"avx512", 8, 16, hrow_avx512, vrow_avx512};

#endif
