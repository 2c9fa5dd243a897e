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

/* The sum over each lane's four bytes (unsigned) weighted by ``w`` (four signed bytes, the
 * same for every lane), exact in int: pmaddubsw's pairs (at most 2 x 255 x 2 in size: no
 * saturation), then pmaddwd's. */
AUG_AVX2 static inline __m128i weighted(__m128i t, int8_t w0, int8_t w1, int8_t w2, int8_t w3) {
    const __m128i w = _mm_setr_epi8(w0, w1, w2, w3, w0, w1, w2, w3, w0, w1, w2, w3, w0, w1, w2,
                                    w3);
    return _mm_madd_epi16(_mm_maddubs_epi16(t, w), _mm_set1_epi16(1));
}

/* Where every lane's ``d`` is 0 the interpolations' steps by ``d`` add a zero: ``p + 0 (...)``
 * is ``p`` exactly (``p`` is never -0: a sum whose first term is a byte), so those steps are
 * left out there (translations and shears: one of dx, dy is 0 at every pixel). */
AUG_AVX2 static inline int all_zero(__m256d d) {
    return _mm256_movemask_pd(_mm256_cmp_pd(d, _mm256_setzero_pd(), _CMP_EQ_OQ)) == 15;
}

/* One row of bilinear_filter32RGB: ``p0 + (p1 - p0) dx``, the difference made in int. */
AUG_AVX2 static inline __m256d row_linear4(__m128i t, __m256d dx, int flat) {
    const __m256d p0 = _mm256_cvtepi32_pd(byte_of(t, 0));
    if (flat) return p0;
    return _mm256_add_pd(p0, _mm256_mul_pd(_mm256_cvtepi32_pd(weighted(t, -1, 1, 0, 0)), dx));
}

/* bilinear_filter32RGB's channel for the lanes' pixels (rows y and y + 1, columns x, x + 1
 * at ``at``): the rows at dx, then ``v1 + (v2 - v1) dy``, truncated. */
AUG_AVX2 static inline __m128i bilinear4(const uint8_t *p, const int64_t at[4], ptrdiff_t row,
                                         __m256d dx, __m256d dy, int flat_x, int flat_y) {
    __m256d v1 = row_linear4(taps(p, at, 0), dx, flat_x);
    if (!flat_y) {
        const __m256d v2 = row_linear4(taps(p, at, row), dx, flat_x);
        v1 = _mm256_add_pd(v1, _mm256_mul_pd(_mm256_sub_pd(v2, v1), dy));
    }
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

/* One row's BICUBIC at dx on 8-bit samples v1..v4: p1 = v2, p2 = -v1 + v3,
 * p3 = 2 (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4, each exact in int, then in doubles
 * p1 + dx (p2 + dx (p3 + dx p4)). */
AUG_AVX2 static inline __m256d row_cubic4(__m128i t, __m256d dx, int flat) {
    const __m256d d1 = _mm256_cvtepi32_pd(byte_of(t, 1));
    if (flat) return d1;
    const __m256d d2 = _mm256_cvtepi32_pd(weighted(t, -1, 0, 1, 0)),
                  d3 = _mm256_cvtepi32_pd(weighted(t, 2, -2, 1, -1)),
                  d4 = _mm256_cvtepi32_pd(weighted(t, -1, 1, -1, 1));
    return _mm256_add_pd(d1, _mm256_mul_pd(dx, _mm256_add_pd(
        d2, _mm256_mul_pd(dx, _mm256_add_pd(d3, _mm256_mul_pd(dx, d4))))));
}

/* bicubic_filter32RGB for the lanes' pixels (rows y - 1 .. y + 2, columns x - 1 .. x + 2
 * around ``at``), the three channels' rows made together (independent chains of operations
 * side by side), each channel clipped to 0..255 and truncated. */
AUG_AVX2 static inline void bicubic4(const Planes *s, const int64_t at[4], __m256d dx,
                                     __m256d dy, int flat_x, int flat_y, __m128i out[3]) {
    const ptrdiff_t row = s->row;
    __m256d r[3][4];
    for (int k = flat_y ? 1 : 0; k < (flat_y ? 2 : 4); k++)
        for (int c = 0; c < 3; c++)
            r[c][k] = row_cubic4(taps(s->ch[c] - 1, at, (k - 1) * row), dx, flat_x);
    for (int c = 0; c < 3; c++) {
        __m256d v = flat_y ? r[c][1] : cubic4(r[c][0], r[c][1], r[c][2], r[c][3], dy);
        v = _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0));
        out[c] = _mm256_cvttpd_epi32(v);
    }
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
            const int flat_x = all_zero(dx), flat_y = all_zero(dy);
            __m128i made[3];
            if (resample == AUG_BILINEAR) {
                for (int ch = 0; ch < 3; ch++)
                    made[ch] = bilinear4(s->ch[ch], at, s->row, dx, dy, flat_x, flat_y);
            } else {
                bicubic4(s, at, dx, dy, flat_x, flat_y, made);
            }
            for (int ch = 0; ch < 3; ch++) store4(px[ch], made[ch]);
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
