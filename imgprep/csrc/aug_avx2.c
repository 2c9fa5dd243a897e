/* The kernels written with AVX2 intrinsics (aug_impl.h), run only on a CPU that has it.
 *
 * Lookup tables (aug_lut_plane_avx2): 32 bytes a step, each byte's entry of its 256: the
 * sixteen rows of 16 entries each looked up by the byte's low four bits (pshufb), then the
 * row its high four bits name kept, bit by bit (15 byte blends). Integers alone: the same
 * bytes as the table read one at a time.
 *
 * aug_affine's bilinear and bicubic rows: four output pixels a step, one pixel a lane of four doubles, each lane computing what
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

AUG_AVX2 void aug_lut_plane_avx2(uint8_t *d, ptrdiff_t drow, const uint8_t *s, ptrdiff_t srow,
                                 int w, int h, const uint8_t t[256]) {
    __m256i rows[16];
    for (int k = 0; k < 16; k++)
        rows[k] = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)(t + 16 * k)));
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int y = 0; y < h; y++) {
        const uint8_t *from = s + y * srow;
        uint8_t *to = d + y * drow;
        int x = 0;
        for (; x + 32 <= w; x += 32) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(from + x));
            const __m256i lo = _mm256_and_si256(v, low);
            __m256i r[16];
            for (int k = 0; k < 16; k++) r[k] = _mm256_shuffle_epi8(rows[k], lo);
            /* bit 4 + b of each byte moved to bit 7, which blendv reads: the row pairs */
            for (int b = 0, n = 8; b < 4; b++, n /= 2) {
                const __m256i pick = b < 3 ? _mm256_slli_epi16(v, 3 - b) : v;
                for (int k = 0; k < n; k++)
                    r[k] = _mm256_blendv_epi8(r[2 * k], r[2 * k + 1], pick);
            }
            _mm256_storeu_si256((__m256i *)(void *)(to + x), r[0]);
        }
        for (; x < w; x++) to[x] = t[from[x]];
    }
}

/* Eight bytes as ints, and as floats (exact). */
AUG_AVX2 static inline __m256i ints8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

AUG_AVX2 static inline __m256 floats8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(ints8(p));
}

/* blend8 of eight lanes: ``a + alpha (b - a)`` in float (the difference made in int), clipped
 * to 0..255, truncated; the eight bytes stored at ``out``. */
AUG_AVX2 static inline void blend8x8(uint8_t *out, __m256i a, __m256i b, __m256 alpha) {
    __m256 t = _mm256_add_ps(_mm256_cvtepi32_ps(a),
                             _mm256_mul_ps(alpha, _mm256_cvtepi32_ps(_mm256_sub_epi32(b, a))));
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
    const __m256i v = _mm256_cvttps_epi32(t);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)(void *)out, _mm_packus_epi16(w, w));
}

/* ImageEnhance.Color (aug_colour.c's aug_color): eight pixels a step, the luma in int. */
AUG_AVX2 void aug_color_avx2(const Planes *im, float alpha) {
    const __m256 al = _mm256_set1_ps(alpha);
    const __m256i kr = _mm256_set1_epi32(19595), kg = _mm256_set1_epi32(38470),
                  kb = _mm256_set1_epi32(7471), round = _mm256_set1_epi32(0x8000);
    for (int y = 0; y < im->h; y++) {
        uint8_t *r = im->ch[0] + y * im->row, *g = im->ch[1] + y * im->row,
                *b = im->ch[2] + y * im->row;
        int x = 0;
        for (; x + 8 <= im->w; x += 8) {
            const __m256i vr = ints8(r + x), vg = ints8(g + x), vb = ints8(b + x);
            const __m256i l = _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(
                    _mm256_mullo_epi32(vr, kr), _mm256_mullo_epi32(vg, kg)),
                    _mm256_mullo_epi32(vb, kb)), round), 16);
            blend8x8(r + x, l, vr, al);
            blend8x8(g + x, l, vg, al);
            blend8x8(b + x, l, vb, al);
        }
        for (; x < im->w; x++) {
            const int l = luma(r[x], g[x], b[x]);
            r[x] = blend8(l, r[x], alpha);
            g[x] = blend8(l, g[x], alpha);
            b[x] = blend8(l, b[x], alpha);
        }
    }
}

/* Where the eight pixels of a step start in a row's inner pixels 1..w-2, ``x`` on: the last
 * step ends at w - 2, over pixels made already (an out-of-place result: the same values). */
static inline int step8(int x, int w) { return x + 8 <= w - 1 ? x : w - 9; }

/* aug_colour.c's triple, eight sums a step. */
AUG_AVX2 void aug_sharpen_triple_avx2(float *t, const uint8_t *r, int w) {
    const __m256 k1 = _mm256_set1_ps(AUG_K1);
    for (int x = 1; x < w - 1; x += 8) {
        const int at = step8(x, w);
        const __m256 s = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(floats8(r + at - 1), k1), _mm256_mul_ps(floats8(r + at), k1)),
            _mm256_mul_ps(floats8(r + at + 1), k1));
        _mm256_storeu_ps(t + at, s);
    }
}

/* aug_colour.c's sharpen_row, eight pixels a step. */
AUG_AVX2 void aug_sharpen_row_avx2(uint8_t *out, const uint8_t *mid, const float *below,
                                   const float *above, int w, float alpha) {
    const __m256 k1 = _mm256_set1_ps(AUG_K1), k5 = _mm256_set1_ps(AUG_K5),
                 al = _mm256_set1_ps(alpha);
    out[0] = mid[0];
    for (int x = 1; x < w - 1; x += 8) {
        const int at = step8(x, w);
        const __m256i m = ints8(mid + at);
        const __m256 own = _mm256_add_ps(
            _mm256_add_ps(_mm256_mul_ps(floats8(mid + at - 1), k1),
                          _mm256_mul_ps(_mm256_cvtepi32_ps(m), k5)),
            _mm256_mul_ps(floats8(mid + at + 1), k1));
        __m256 ss = _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_loadu_ps(below + at));
        ss = _mm256_add_ps(_mm256_add_ps(ss, own), _mm256_loadu_ps(above + at));
        blend8x8(out + at, _mm256_cvttps_epi32(ss), m, al);
    }
    out[w - 1] = mid[w - 1];
}

int aug_nearest_fits_avx2(const Planes *s) {
    return (int64_t)(s->h + 2 * AUG_PAD) * s->row < INT32_MAX;
}

/* Row y: eight offsets a step, from (``xx``, ``yy``), the row's first pixel's position, by
 * (``a0``, ``a3``) a pixel; each plane's eight bytes by one gather. */
AUG_AVX2 static void nearest_row(const Planes *o, const Planes *s, int y, uint32_t xx,
                                 uint32_t yy, uint32_t a0, uint32_t a3) {
    const ptrdiff_t outside = -(AUG_PAD * s->row + AUG_PAD);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i vx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)xx),
                                  _mm256_mullo_epi32(_mm256_set1_epi32((int32_t)a0), lane));
    __m256i vy = _mm256_add_epi32(_mm256_set1_epi32((int32_t)yy),
                                  _mm256_mullo_epi32(_mm256_set1_epi32((int32_t)a3), lane));
    const __m256i sx = _mm256_set1_epi32((int32_t)(a0 * 8u)),
                  sy = _mm256_set1_epi32((int32_t)(a3 * 8u));
    const __m256i sw = _mm256_set1_epi32(s->w), sh = _mm256_set1_epi32(s->h),
                  none = _mm256_set1_epi32(-1), row = _mm256_set1_epi32((int32_t)s->row),
                  fill_at = _mm256_set1_epi32((int32_t)outside);
    const __m256i low = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                         -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                         -1, -1, -1, -1);
    uint8_t *const d[3] = {o->ch[0] + y * o->row, o->ch[1] + y * o->row, o->ch[2] + y * o->row};
    const uint8_t *const p[3] = {s->ch[0], s->ch[1], s->ch[2]};
    const ptrdiff_t px = o->px;
    for (int x = 0; x < o->w; x += 8) {
        const __m256i u = _mm256_srai_epi32(vx, 16), v = _mm256_srai_epi32(vy, 16);
        const __m256i in = _mm256_and_si256(
            _mm256_and_si256(_mm256_cmpgt_epi32(u, none), _mm256_cmpgt_epi32(sw, u)),
            _mm256_and_si256(_mm256_cmpgt_epi32(v, none), _mm256_cmpgt_epi32(sh, v)));
        const __m256i at = _mm256_blendv_epi8(
            fill_at, _mm256_add_epi32(_mm256_mullo_epi32(v, row), u), in);
        vx = _mm256_add_epi32(vx, sx);
        vy = _mm256_add_epi32(vy, sy);
        const int n = o->w - x < 8 ? o->w - x : 8;
        uint8_t got[3][8];
        for (int c = 0; c < 3; c++) {  /* four bytes at each offset, the first kept */
            const __m256i g = _mm256_shuffle_epi8(
                _mm256_i32gather_epi32((const int *)(const void *)p[c], at, 1), low);
            const __m128i b = _mm_unpacklo_epi32(_mm256_castsi256_si128(g),
                                                 _mm256_extracti128_si256(g, 1));
            _mm_storel_epi64((__m128i *)(void *)(px == 1 && n == 8 ? d[c] + x : got[c]), b);
        }
        if (px == 1 && n == 8) continue;
        for (int i = 0; i < n; i++)
            for (int c = 0; c < 3; c++) d[c][(x + i) * px] = got[c][i];
    }
}

/* A pixel whose sample falls outside reads the border's first byte of each plane instead,
 * set to the fill colour here (nearest reads no other border byte; an interpolation pads
 * the border again before it reads it); the gathers read four bytes at an offset, the
 * border and the copy's last 16 bytes hold the three after any. */
AUG_AVX2 void aug_nearest_avx2(const Planes *o, const Planes *s, const uint32_t f[6],
                               const int fill[3]) {
    const ptrdiff_t outside = -(AUG_PAD * s->row + AUG_PAD);
    for (int c = 0; c < 3; c++) s->ch[c][outside] = (uint8_t)fill[c];
    uint32_t xx = f[2], yy = f[5];
    for (int y = 0; y < o->h; y++, xx += f[1], yy += f[4])
        nearest_row(o, s, y, xx, yy, f[0], f[3]);
}

static inline int32_t load32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Where a step's four pixels sample: each lane's offset in a plane (row y, column x), and
 * whether they are four neighbours of one row (at[i] = at[0] + i: translations, horizontal
 * shears), whose bytes one load holds. */
typedef struct {
    int64_t at[4];
    int row_of_four;
} Quad;

/* The four bytes at ``p + at[i] + by`` of each lane's pixel. */
AUG_AVX2 static inline __attribute__((always_inline)) __m128i taps(const uint8_t *p, const Quad *q, ptrdiff_t by) {
    if (q->row_of_four) {  /* bytes i .. i + 3 of the eight from at[0] */
        const __m128i spread = _mm_setr_epi8(0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6);
        return _mm_shuffle_epi8(
            _mm_loadl_epi64((const __m128i *)(const void *)(p + q->at[0] + by)), spread);
    }
    return _mm_setr_epi32(load32(p + q->at[0] + by), load32(p + q->at[1] + by),
                          load32(p + q->at[2] + by), load32(p + q->at[3] + by));
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
AUG_AVX2 static inline __attribute__((always_inline)) __m128i bilinear4(const uint8_t *p, const Quad *q, ptrdiff_t row,
                                         __m256d dx, __m256d dy, int flat_x, int flat_y) {
    __m256d v1 = row_linear4(taps(p, q, 0), dx, flat_x);
    if (!flat_y) {
        const __m256d v2 = row_linear4(taps(p, q, row), dx, flat_x);
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
AUG_AVX2 static inline __attribute__((always_inline)) void bicubic4(const Planes *s, const Quad *q, __m256d dx, __m256d dy,
                                     int flat_x, int flat_y, __m128i out[3]) {
    const ptrdiff_t row = s->row;
    __m256d r[3][4];
    for (int k = flat_y ? 1 : 0; k < (flat_y ? 2 : 4); k++)
        for (int c = 0; c < 3; c++)
            r[c][k] = row_cubic4(taps(s->ch[c] - 1, q, (k - 1) * row), dx, flat_x);
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
            const __m256i at = _mm256_add_epi64(_mm256_mul_epi32(yi, row), xi);
            const __m256i from_first = _mm256_sub_epi64(at, _mm256_permute4x64_epi64(at, 0));
            Quad q = {.row_of_four = _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(
                                         from_first, _mm256_setr_epi64x(0, 1, 2, 3)))) == 15};
            _mm256_storeu_si256((__m256i *)(void *)q.at, at);
            const int flat_x = all_zero(dx), flat_y = all_zero(dy);
            __m128i made[3];
            if (resample == AUG_BILINEAR && q.row_of_four) {  /* each path its own code */
                q.row_of_four = 1;
                for (int ch = 0; ch < 3; ch++)
                    made[ch] = bilinear4(s->ch[ch], &q, s->row, dx, dy, flat_x, flat_y);
            } else if (resample == AUG_BILINEAR) {
                q.row_of_four = 0;
                for (int ch = 0; ch < 3; ch++)
                    made[ch] = bilinear4(s->ch[ch], &q, s->row, dx, dy, flat_x, flat_y);
            } else if (q.row_of_four) {
                q.row_of_four = 1;
                bicubic4(s, &q, dx, dy, flat_x, flat_y, made);
            } else {
                q.row_of_four = 0;
                bicubic4(s, &q, dx, dy, flat_x, flat_y, made);
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
