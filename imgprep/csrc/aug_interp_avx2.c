/* aug_affine's bilinear and bicubic rows with AVX2 (aug_impl.h), run only on a CPU that has
 * it: four output pixels a step, one pixel a lane of four doubles, each lane computing what
 * the portable code (aug_geometry.c, Pillow's Geometry.c) computes for its pixel, with the
 * same IEEE operations in the same order (no fused multiply-add), so the same bytes:
 *
 * - the position: ``a0 xin + a1 yin + a2`` (``a1 yin`` is the same product at every pixel
 *   of a row, made once), kept where it lies in [0, width) x [0, height), moved by -0.5,
 *   floored (exact), and its fraction ``u - floor(u)``;
 * - the neighbours: the source is the padded copy, whose border repeats the edge pixels, so
 *   Pillow's clamped neighbours are plain reads: one four-byte read a row a pixel holds the
 *   two (bilinear) or four (bicubic) bytes of a row;
 * - bilinear: ``p0 + (p1 - p0) dx`` for the two rows (the difference made in int), then
 *   ``v1 + (v2 - v1) dy``, truncated;
 * - bicubic: each row's cubic at dx from its integer p1..p4 (exact in int, then doubles),
 *   then the cubic of the four rows at dy in doubles, in Pillow's order, clipped to 0..255
 *   and truncated.
 *
 * A pixel whose sample falls outside reads the source's first pixel (its lane is thrown
 * away) and takes the fill colour. */
#include "aug_impl.h"
#include "augment.h"

#ifdef AUG_X86
#include <immintrin.h>
#include <string.h>

static inline int32_t load32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The four bytes at ``p + at[i] + by`` of each lane's pixel. */
AUG_AVX2 static inline __m128i taps(const uint8_t *p, const int64_t at[4], ptrdiff_t by) {
    return _mm_setr_epi32(load32(p + at[0] + by), load32(p + at[1] + by),
                          load32(p + at[2] + by), load32(p + at[3] + by));
}

/* Byte ``k`` of each lane, as an int. */
AUG_AVX2 static inline __m128i byte_of(__m128i t, int k) {
    return _mm_and_si128(_mm_srli_epi32(t, 8 * k), _mm_set1_epi32(0xff));
}

/* bilinear_filter32RGB's channel for the lanes' pixels (rows y and y + 1, columns x, x + 1
 * at ``at``). */
AUG_AVX2 static inline __m128i bilinear4(const uint8_t *p, const int64_t at[4], ptrdiff_t row,
                                         __m256d dx, __m256d dy) {
    const __m128i t0 = taps(p, at, 0), t1 = taps(p, at, row);
    const __m128i a0 = byte_of(t0, 0), b0 = byte_of(t0, 1);
    const __m128i a1 = byte_of(t1, 0), b1 = byte_of(t1, 1);
    __m256d v1 = _mm256_add_pd(_mm256_cvtepi32_pd(a0),
                               _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(b0, a0)), dx));
    __m256d v2 = _mm256_add_pd(_mm256_cvtepi32_pd(a1),
                               _mm256_mul_pd(_mm256_cvtepi32_pd(_mm_sub_epi32(b1, a1)), dx));
    v1 = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), dy));
    return _mm256_cvttpd_epi32(v1);
}

/* Geometry.c's BICUBIC of doubles: p2 = -v1 + v3, p3 = 2 (v1 - v2) + v3 - v4,
 * p4 = -v1 + v2 - v3 + v4 (x - y is x + -y in IEEE arithmetic: the same sums), then
 * p1 + d (p2 + d (p3 + d p4)). */
AUG_AVX2 static inline __m256d cubic4(__m256d v1, __m256d v2, __m256d v3, __m256d v4,
                                      __m256d d) {
    const __m256d p2 = _mm256_sub_pd(v3, v1);
    const __m256d p3 = _mm256_sub_pd(
        _mm256_add_pd(_mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(v1, v2)), v3), v4);
    const __m256d p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(v2, v1), v3), v4);
    return _mm256_add_pd(v2, _mm256_mul_pd(d, _mm256_add_pd(
        p2, _mm256_mul_pd(d, _mm256_add_pd(p3, _mm256_mul_pd(d, p4))))));
}

/* One row's BICUBIC at dx on 8-bit samples: p1..p4 summed in int (exact), then doubles. */
AUG_AVX2 static inline __m256d row_cubic4(__m128i t, __m256d dx) {
    const __m128i v1 = byte_of(t, 0), v2 = byte_of(t, 1), v3 = byte_of(t, 2),
                  v4 = _mm_srli_epi32(t, 24);
    const __m128i p2 = _mm_sub_epi32(v3, v1);
    const __m128i p3 = _mm_sub_epi32(_mm_add_epi32(_mm_slli_epi32(_mm_sub_epi32(v1, v2), 1),
                                                   v3), v4);
    const __m128i p4 = _mm_add_epi32(_mm_sub_epi32(_mm_sub_epi32(v2, v1), v3), v4);
    const __m256d d1 = _mm256_cvtepi32_pd(v2), d2 = _mm256_cvtepi32_pd(p2),
                  d3 = _mm256_cvtepi32_pd(p3), d4 = _mm256_cvtepi32_pd(p4);
    return _mm256_add_pd(d1, _mm256_mul_pd(dx, _mm256_add_pd(
        d2, _mm256_mul_pd(dx, _mm256_add_pd(d3, _mm256_mul_pd(dx, d4))))));
}

/* bicubic_filter32RGB's channel for the lanes' pixels (rows y - 1 .. y + 2, columns x - 1 ..
 * x + 2 around ``at``). */
AUG_AVX2 static inline __m128i bicubic4(const uint8_t *p, const int64_t at[4], ptrdiff_t row,
                                        __m256d dx, __m256d dy) {
    p -= 1;
    const __m256d r0 = row_cubic4(taps(p, at, -row), dx), r1 = row_cubic4(taps(p, at, 0), dx),
                  r2 = row_cubic4(taps(p, at, row), dx),
                  r3 = row_cubic4(taps(p, at, 2 * row), dx);
    __m256d v = cubic4(r0, r1, r2, r3, dy);
    v = _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0));
    return _mm256_cvttpd_epi32(v);
}

/* The four ints of ``v`` (0..255) as bytes. */
AUG_AVX2 static inline void store4(uint8_t out[4], __m128i v) {
    const __m128i b = _mm_packus_epi16(_mm_packus_epi32(v, v), v);
    int32_t word = _mm_cvtsi128_si32(b);
    memcpy(out, &word, 4);
}

AUG_AVX2 int aug_interpolate_row_avx2(const Planes *o, const Planes *s, const double a[6],
                                      int resample, const int fill[3], int y) {
    const __m256d a0 = _mm256_set1_pd(a[0]), a3 = _mm256_set1_pd(a[3]);
    const __m256d c = _mm256_set1_pd(a[2]), f = _mm256_set1_pd(a[5]);
    const double yin = y + 0.5;
    const __m256d by = _mm256_set1_pd(a[1] * yin), ey = _mm256_set1_pd(a[4] * yin);
    const __m256d zero = _mm256_setzero_pd(), half = _mm256_set1_pd(0.5);
    const __m256d wd = _mm256_set1_pd((double)s->w), hd = _mm256_set1_pd((double)s->h);
    const __m256i row = _mm256_set1_epi64x(s->row);
    const int n = o->w & ~3;
    __m256d xin = _mm256_setr_pd(0.5, 1.5, 2.5, 3.5);  /* x + 0.5: exact */
    for (int x = 0; x < n; x += 4, xin = _mm256_add_pd(xin, _mm256_set1_pd(4.0))) {
        __m256d u = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(a0, xin), by), c);
        __m256d v = _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(a3, xin), ey), f);
        const __m256d in = _mm256_and_pd(
            _mm256_and_pd(_mm256_cmp_pd(u, zero, _CMP_GE_OQ), _mm256_cmp_pd(u, wd, _CMP_LT_OQ)),
            _mm256_and_pd(_mm256_cmp_pd(v, zero, _CMP_GE_OQ), _mm256_cmp_pd(v, hd, _CMP_LT_OQ)));
        const int inside = _mm256_movemask_pd(in);
        uint8_t px[3][4];
        if (inside != 0) {
            u = _mm256_and_pd(_mm256_sub_pd(u, half), in);  /* outside: 0, the first pixel */
            v = _mm256_and_pd(_mm256_sub_pd(v, half), in);
            const __m256d fu = _mm256_floor_pd(u), fv = _mm256_floor_pd(v);
            const __m256d dx = _mm256_sub_pd(u, fu), dy = _mm256_sub_pd(v, fv);
            const __m256i xi = _mm256_cvtepi32_epi64(_mm256_cvttpd_epi32(fu));
            const __m256i yi = _mm256_cvtepi32_epi64(_mm256_cvttpd_epi32(fv));
            int64_t at[4];
            _mm256_storeu_si256((__m256i *)(void *)at,
                                _mm256_add_epi64(_mm256_mul_epi32(yi, row), xi));
            for (int ch = 0; ch < 3; ch++)
                store4(px[ch], resample == AUG_BILINEAR ? bilinear4(s->ch[ch], at, s->row, dx, dy)
                                                        : bicubic4(s->ch[ch], at, s->row, dx, dy));
        }
        for (int i = 0; i < 4; i++)
            if (!(inside >> i & 1))
                for (int ch = 0; ch < 3; ch++) px[ch][i] = (uint8_t)fill[ch];
        const ptrdiff_t at = y * o->row + x * o->px;
        if (o->px == 1) {
            for (int ch = 0; ch < 3; ch++) memcpy(o->ch[ch] + at, px[ch], 4);
        } else {
            for (int i = 0; i < 4; i++)
                for (int ch = 0; ch < 3; ch++) o->ch[ch][at + 3 * i] = px[ch][i];
        }
    }
    return n;
}
#endif
