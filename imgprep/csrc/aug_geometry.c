/* Image.transform(size, Image.AFFINE, a, resample, fillcolor=fill) of an RGB image to its
 * own size, as Pillow 13.0.0's libImaging/Geometry.c computes it (aug_impl.h):
 *
 * - NEAREST takes one of three paths (ImagingTransformAffine): with b == d == 0, the scale
 *   path (ImagingScaleAffine: columns tabulated once, positions accumulated in doubles from
 *   c + a/2); else, when the four corners map inside +-32768, 16.16 fixed point (affine_fixed:
 *   each coefficient rounded to 1/65536 once, then integer steps); else positions accumulated
 *   in doubles. A sample at (u, v) takes pixel (floor u, floor v), negative u or v outside.
 * - BILINEAR and BICUBIC evaluate the matrix at each pixel's centre (x + 0.5, y + 0.5)
 *   (ImagingGenericTransform), keep a position only in [0, width) x [0, height), move it by
 *   -0.5 and interpolate the clamped neighbours in doubles (bicubic: Pillow's a = -1 cubic,
 *   rows first), truncating (bicubic: clipping first).
 *
 * Where the source has no sample the output pixel is ``fill``. Conversions from double to int
 * are Pillow's x86-64 ones, made defined here: out of range or NaN gives INT32_MIN (what
 * cvttsd2si does), so those positions fall outside as they do in Pillow; fixed-point steps
 * wrap as the x86 integer adds Pillow compiles to.
 *
 * The source is the planar copy (augment.c), so a pixel is three reads where Pillow reads one
 * four-byte pixel: nearest copies whole runs of consecutive source pixels where a row has
 * them (translations, horizontal shears: memcpy), and otherwise gathers a pixel at a time as
 * its position is made. */
#include "aug_impl.h"
#include "augment.h"

#include <math.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* (int)v as x86-64 computes it: truncation, and INT32_MIN out of range or for NaN. */
static inline int32_t trunc32(double v) {
    return v > -2147483649.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
}

/* Geometry.c's COORD and FLOOR. */
static inline int32_t coord(double v) { return v < 0.0 ? -1 : trunc32(v); }
static inline int32_t floor32(double v) { return v < 0.0 ? trunc32(floor(v)) : trunc32(v); }

/* The offset of pixel (u, v) in a plane ``row`` bytes wide, or -1 where it lies outside
 * ``w`` x ``h``: no branch (the loops that call it are the nearest paths' whole cost). */
static inline ptrdiff_t offset_of(int32_t u, int32_t v, int w, int h, ptrdiff_t row) {
    int inside = ((uint32_t)u < (uint32_t)w) & ((uint32_t)v < (uint32_t)h);
    return inside ? v * row + u : -1;
}

/* Pixels [x0, x1) of row y of ``o`` from consecutive pixels of ``s`` (planar) at ``from``,
 * or ``fill`` where ``from`` is -1. */
static void emit_span(const Planes *o, int y, int x0, int x1, const Planes *s, ptrdiff_t from,
                      const int fill[3]) {
    const int n = x1 - x0;
    if (o->px == 1) {
        for (int c = 0; c < 3; c++) {
            uint8_t *d = o->ch[c] + y * o->row + x0;
            if (from >= 0)
                memcpy(d, s->ch[c] + from, (size_t)n);
            else
                memset(d, fill[c], (size_t)n);
        }
        return;
    }
    uint8_t *d = o->ch[0] + y * o->row + x0 * 3;  /* rows of pixels: interleaved in one pass */
    if (from < 0) {
        for (int x = 0; x < n; x++) {
            d[3 * x] = (uint8_t)fill[0];
            d[3 * x + 1] = (uint8_t)fill[1];
            d[3 * x + 2] = (uint8_t)fill[2];
        }
        return;
    }
    const uint8_t *r = s->ch[0] + from, *g = s->ch[1] + from, *b = s->ch[2] + from;
    for (int x = 0; x < n; x++) {
        d[3 * x] = r[x];
        d[3 * x + 1] = g[x];
        d[3 * x + 2] = b[x];
    }
}

/* Pixels [x0, x1) of row y of ``o``: each pixel x from channel offset ``base + from[x]`` of
 * ``s`` (planar), or ``fill`` where ``from[x]`` is -1. With ``runs`` (a row that steps one
 * source pixel a pixel: a translation's, a horizontal shear's) runs of consecutive source
 * pixels are copied whole; otherwise a pixel at a time (looking for runs in a rotation's rows,
 * a pixel or two long, would cost a mispredicted branch every other pixel). */
static void emit_row(const Planes *o, int y, int x0, int x1, const Planes *s,
                     const ptrdiff_t *from, ptrdiff_t base, const int fill[3], int runs) {
    const ptrdiff_t px = o->px;
    uint8_t *d0 = o->ch[0] + y * o->row, *d1 = o->ch[1] + y * o->row,
            *d2 = o->ch[2] + y * o->row;
    const uint8_t *p0 = s->ch[0] + base, *p1 = s->ch[1] + base, *p2 = s->ch[2] + base;
    const uint8_t f0 = (uint8_t)fill[0], f1 = (uint8_t)fill[1], f2 = (uint8_t)fill[2];
    if (!runs) {
        for (int x = x0; x < x1; x++) {
            const ptrdiff_t f = from[x];
            d0[x * px] = f >= 0 ? p0[f] : f0;
            d1[x * px] = f >= 0 ? p1[f] : f1;
            d2[x * px] = f >= 0 ? p2[f] : f2;
        }
        return;
    }
    for (int x = x0; x < x1;) {
        const ptrdiff_t f = from[x];
        int end = x + 1;
        if (f < 0) {
            while (end < x1 && from[end] < 0) end++;
            emit_span(o, y, x, end, s, -1, fill);
        } else {
            while (end < x1 && from[end] == f + (end - x)) end++;
            emit_span(o, y, x, end, s, base + f, fill);
        }
        x = end;
    }
}

/* ImagingScaleAffine's column table (b == d == 0): ``cols[x]`` the source column of output
 * column x, -1 outside [``*xmin``, ``*xmax``), column 0 for a gap inside (Pillow's calloc'd
 * table); positions accumulated in doubles from c + a/2. */
static void scale_columns(const double *a, int w, ptrdiff_t *cols, int *xmin, int *xmax) {
    double xo = a[2] + a[0] * 0.5;
    *xmin = w;
    *xmax = 0;
    for (int x = 0; x < w; x++) {
        int32_t u = coord(xo);
        cols[x] = -1;
        if (u >= 0 && u < w) {
            *xmax = x + 1;
            if (x < *xmin) *xmin = x;
            cols[x] = u;
        }
        xo += a[0];
    }
    for (int x = *xmin; x < *xmax; x++)
        if (cols[x] < 0) cols[x] = 0;
}

/* ImagingScaleAffine (b == d == 0): the columns tabulated once, the same for every row. */
static void nearest_scale(const Planes *o, const Planes *s, const double *a, const int fill[3],
                          ptrdiff_t *cols) {
    double yo = a[5] + a[4] * 0.5;
    int xmin, xmax;
    scale_columns(a, o->w, cols, &xmin, &xmax);
    for (int y = 0; y < o->h; y++) {
        int32_t v = coord(yo);
        if (v >= 0 && v < s->h)
            emit_row(o, y, 0, o->w, s, cols, v * s->row, fill, a[0] == 1.0);
        else
            emit_span(o, y, 0, o->w, s, -1, fill);
        yo += a[4];
    }
}

/* Pixels [x0, x1) of row y of ``im`` set to ``fill``. */
static void fill_span(const Planes *im, int y, int x0, int x1, const int fill[3]) {
    for (int c = 0; c < 3; c++)
        for (int x = x0; x < x1; x++) im->ch[c][y * im->row + x * im->px] = (uint8_t)fill[c];
}

int aug_shift(const Planes *im, const double a[6], const int fill[3], ptrdiff_t *cols,
              int32_t *rows) {
    if (a[0] != 1.0 || a[1] != 0.0 || a[3] != 0.0 || a[4] != 1.0) return 0;
    int xmin, xmax, up = 1, down = 1;
    scale_columns(a, im->w, cols, &xmin, &xmax);
    for (int x = xmin; x < xmax; x++)  /* one run of a source row */
        if (cols[x] != cols[xmin] + (x - xmin)) return 0;
    double yo = a[5] + a[4] * 0.5;
    for (int y = 0; y < im->h; y++, yo += a[4]) {
        int32_t v = coord(yo);
        rows[y] = v >= 0 && v < im->h ? v : -1;
        up &= rows[y] < 0 || rows[y] >= y;    /* top down: each source row still unwritten */
        down &= rows[y] < 0 || rows[y] <= y;  /* bottom up */
    }
    if (!up && !down) return 0;
    const ptrdiff_t run = xmax > xmin ? xmax - xmin : 0, u0 = run > 0 ? cols[xmin] : 0;
    for (int k = 0; k < im->h; k++) {
        const int y = up ? k : im->h - 1 - k;
        if (rows[y] < 0 || run == 0) {
            fill_span(im, y, 0, im->w, fill);
            continue;
        }
        if (im->px == 1) {
            for (int c = 0; c < 3; c++)
                memmove(im->ch[c] + y * im->row + xmin, im->ch[c] + rows[y] * im->row + u0,
                        (size_t)run);
        } else {
            memmove(im->ch[0] + y * im->row + 3 * xmin, im->ch[0] + rows[y] * im->row + 3 * u0,
                    3 * (size_t)run);
        }
        fill_span(im, y, 0, xmin, fill);
        fill_span(im, y, xmax, im->w, fill);
    }
    return 1;
}

static int fixed_ok(const double *a, int x, int y) {
    return fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 &&
           fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

/* One pixel of a row without runs: from ``f`` of the planes at ``p``, or ``fill``. */
static inline void gather(uint8_t *const d[3], ptrdiff_t at, const uint8_t *const p[3],
                          ptrdiff_t f, const int fill[3]) {
    d[0][at] = f >= 0 ? p[0][f] : (uint8_t)fill[0];
    d[1][at] = f >= 0 ? p[1][f] : (uint8_t)fill[1];
    d[2][at] = f >= 0 ? p[2][f] : (uint8_t)fill[2];
}

/* affine_fixed: 16.16 fixed point, the steps wrapping as Pillow's int32 adds do. A row that
 * steps one source pixel a pixel (a = 1, d = 0: a horizontal shear) is one run of a source
 * row, copied whole (tabulated where its positions would wrap); any other row is gathered as
 * its positions are made. */
static void nearest_fixed(const Planes *o, const Planes *s, const double *a, const int fill[3],
                          ptrdiff_t *from, int kernel) {
#define FIX(v) (uint32_t)floor32((v) * 65536.0 + 0.5)
    uint32_t a0 = FIX(a[0]), a1 = FIX(a[1]), a3 = FIX(a[3]), a4 = FIX(a[4]);
    uint32_t a2 = FIX(a[2] + a[0] * 0.5 + a[1] * 0.5);
    uint32_t a5 = FIX(a[5] + a[3] * 0.5 + a[4] * 0.5);
#undef FIX
    const int w = o->w, sw = s->w, sh = s->h, runs = a0 == 65536 && a3 == 0;
#ifdef AUG_X86
    if (!runs && kernel == AUG_KERNEL_AVX2 && aug_nearest_fits_avx2(s)) {
        const uint32_t f[6] = {a0, a1, a2, a3, a4, a5};
        aug_nearest_avx2(o, s, f, fill);
        return;
    }
#endif
    (void)kernel;
    const ptrdiff_t row = s->row, px = o->px;  /* in locals: no store can change them */
    const uint8_t *const p[3] = {s->ch[0], s->ch[1], s->ch[2]};
    for (int y = 0; y < o->h; y++, a2 += a1, a5 += a4) {
        uint32_t xx = a2, yy = a5;  /* >> of a negative int32 below: arithmetic */
        if (runs && (int64_t)(int32_t)xx + (int64_t)(w - 1) * 65536 <= INT32_MAX) {
            /* no wrap: the row is the source row v from column u0 on, one run */
            int64_t u0 = (int32_t)xx >> 16, v = (int32_t)yy >> 16;
            int64_t lo = u0 < 0 ? -u0 : 0, hi = sw - u0;
            lo = lo < w ? lo : w;
            hi = hi < lo ? lo : hi < w ? hi : w;
            if (v < 0 || v >= sh) lo = hi = w;
            if (lo > 0) emit_span(o, y, 0, (int)lo, s, -1, fill);
            if (hi > lo) emit_span(o, y, (int)lo, (int)hi, s, v * row + u0 + lo, fill);
            if (hi < w) emit_span(o, y, (int)hi, w, s, -1, fill);
            continue;
        }
        if (runs) {
            for (int x = 0; x < w; x++, xx += a0, yy += a3)
                from[x] = offset_of((int32_t)xx >> 16, (int32_t)yy >> 16, sw, sh, row);
            emit_row(o, y, 0, w, s, from, 0, fill, 1);
            continue;
        }
        uint8_t *const d[3] = {o->ch[0] + y * o->row, o->ch[1] + y * o->row,
                               o->ch[2] + y * o->row};
        for (int x = 0; x < w; x++, xx += a0, yy += a3)
            gather(d, x * px, p,
                   offset_of((int32_t)xx >> 16, (int32_t)yy >> 16, sw, sh, row), fill);
    }
}

/* ImagingTransformAffine's own loop, where fixed point cannot hold the positions. */
static void nearest_float(const Planes *o, const Planes *s, const double *a, const int fill[3],
                          ptrdiff_t *from) {
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    const int w = o->w, sw = s->w, sh = s->h;
    const ptrdiff_t row = s->row;
    for (int y = 0; y < o->h; y++) {
        double xx = xo, yy = yo;
        for (int x = 0; x < w; x++) {
            from[x] = offset_of(coord(xx), coord(yy), sw, sh, row);
            xx += a[0];
            yy += a[3];
        }
        emit_row(o, y, 0, o->w, s, from, 0, fill, a[0] == 1.0 && a[3] == 0);
        xo += a[1];
        yo += a[4];
    }
}

static inline int clampi(int v, int size) { return v < 0 ? 0 : v < size ? v : size - 1; }

/* bilinear_filter32RGB for the position (u, v), inside the source. */
static inline void bilinear(const Planes *s, double u, double v, uint8_t out[3]) {
    u -= 0.5;
    v -= 0.5;
    int x = floor32(u), y = floor32(v);
    double dx = u - x, dy = v - y;
    ptrdiff_t x0 = clampi(x, s->w) * s->px, x1 = clampi(x + 1, s->w) * s->px;
    ptrdiff_t r0 = clampi(y, s->h) * s->row, r1 = clampi(y + 1, s->h) * s->row;
    for (int c = 0; c < 3; c++) {
        const uint8_t *p = s->ch[c] + r0, *q = s->ch[c] + r1;
        double v1 = p[x0] + (p[x1] - p[x0]) * dx;
        double v2 = q[x0] + (q[x1] - q[x0]) * dx;
        v1 = v1 + (v2 - v1) * dy;
        out[c] = (uint8_t)v1;
    }
}

/* Geometry.c's BICUBIC: the a = -1 cubic through v1..v4 at d, in its order of operations. */
static inline double cubic(double v1, double v2, double v3, double v4, double d) {
    double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
    return p1 + d * (p2 + d * (p3 + d * p4));
}

/* r[k] = p1[k] + d (p2[k] + d (p3[k] + d p4[k])) for the four rows. With SSE2 (every x86-64
 * CPU) two rows a register: each lane is the same IEEE double multiply and add as the scalar
 * code, in the same order (no fused multiply-add: setup.py), so the bits are the same. */
static inline void horner4(const double *p1, const double *p2, const double *p3,
                           const double *p4, double d, double *r) {
#if defined(__SSE2__)
    const __m128d vd = _mm_set1_pd(d);
    for (int k = 0; k < 4; k += 2) {
        __m128d t = _mm_add_pd(_mm_loadu_pd(p3 + k), _mm_mul_pd(vd, _mm_loadu_pd(p4 + k)));
        t = _mm_add_pd(_mm_loadu_pd(p2 + k), _mm_mul_pd(vd, t));
        _mm_storeu_pd(r + k, _mm_add_pd(_mm_loadu_pd(p1 + k), _mm_mul_pd(vd, t)));
    }
#else
    for (int k = 0; k < 4; k++) r[k] = p1[k] + d * (p2[k] + d * (p3[k] + d * p4[k]));
#endif
}

/* bicubic_filter32RGB for the position (u, v), inside the source: rows y-1..y+2 clamped
 * (Pillow repeats the last row in range, which is the same row). Each row's cubic at dx is
 * Pillow's BICUBIC on 8-bit samples, whose p2..p4 are sums in int before the doubles; the
 * four rows' cubics are evaluated together (horner4). */
static inline void bicubic(const Planes *s, double u, double v, uint8_t out[3]) {
    u -= 0.5;
    v -= 0.5;
    int x = floor32(u), y = floor32(v);
    double dx = u - x, dy = v - y;
    ptrdiff_t xs[4], rows[4];
    for (int k = 0; k < 4; k++) {
        xs[k] = clampi(x - 1 + k, s->w) * s->px;
        rows[k] = clampi(y - 1 + k, s->h) * s->row;
    }
    for (int c = 0; c < 3; c++) {
        double p1[4], p2[4], p3[4], p4[4], r[4];
        for (int k = 0; k < 4; k++) {
            const uint8_t *p = s->ch[c] + rows[k];
            int v1 = p[xs[0]], v2 = p[xs[1]], v3 = p[xs[2]], v4 = p[xs[3]];
            p1[k] = v2;
            p2[k] = -v1 + v3;
            p3[k] = 2 * (v1 - v2) + v3 - v4;
            p4[k] = -v1 + v2 - v3 + v4;
        }
        horner4(p1, p2, p3, p4, dx, r);
        double w = cubic(r[0], r[1], r[2], r[3], dy);
        out[c] = w <= 0.0 ? 0 : w >= 255.0 ? 255 : (uint8_t)w;
    }
}

/* ImagingGenericTransform with affine_transform: the matrix at each pixel's centre; with
 * AVX2, each row's pixels four at a time and the rest here. */
static void interpolated(const Planes *o, const Planes *s, const double *a, int resample,
                         const int fill[3], int kernel) {
    for (int y = 0; y < o->h; y++) {
        double yin = y + 0.5;
        int x = 0;
#ifdef AUG_X86
        if (kernel == AUG_KERNEL_AVX2) x = aug_interpolate_row_avx2(o, s, a, resample, fill, y);
#else
        (void)kernel;
#endif
        for (; x < o->w; x++) {
            double xin = x + 0.5;
            double u = a[0] * xin + a[1] * yin + a[2], v = a[3] * xin + a[4] * yin + a[5];
            uint8_t px[3] = {(uint8_t)fill[0], (uint8_t)fill[1], (uint8_t)fill[2]};
            if (u >= 0.0 && u < s->w && v >= 0.0 && v < s->h) {
                if (resample == AUG_BILINEAR)
                    bilinear(s, u, v, px);
                else
                    bicubic(s, u, v, px);
            }
            ptrdiff_t at = y * o->row + x * o->px;
            o->ch[0][at] = px[0];
            o->ch[1][at] = px[1];
            o->ch[2][at] = px[2];
        }
    }
}

void aug_pad(const Planes *s) {
    const int w = s->w, h = s->h;
    const size_t span = (size_t)w + 2 * AUG_PAD;
    for (int c = 0; c < 3; c++) {
        uint8_t *p = s->ch[c];
        for (int y = 0; y < h; y++) {
            uint8_t *r = p + y * s->row;
            for (int k = 1; k <= AUG_PAD; k++) {
                r[-k] = r[0];
                r[w - 1 + k] = r[w - 1];
            }
        }
        for (int k = 1; k <= AUG_PAD; k++) {
            memcpy(p - k * s->row - AUG_PAD, p - AUG_PAD, span);
            memcpy(p + (h - 1 + k) * s->row - AUG_PAD, p + (h - 1) * s->row - AUG_PAD, span);
        }
    }
}

void aug_affine(const Planes *out, const Planes *src, const double a[6], int resample,
                const int fill[3], ptrdiff_t *rows, int kernel) {
    if (resample != AUG_NEAREST) {
        aug_pad(src);
        interpolated(out, src, a, resample, fill, kernel);
    } else if (a[1] == 0 && a[3] == 0) {
        nearest_scale(out, src, a, fill, rows);
    } else if (fixed_ok(a, 0, 0) && fixed_ok(a, out->w, out->h) && fixed_ok(a, 0, out->h) &&
               fixed_ok(a, out->w, 0)) {
        nearest_fixed(out, src, a, fill, rows, kernel);
    } else {
        nearest_float(out, src, a, fill, rows);
    }
    (void)kernel;
}
