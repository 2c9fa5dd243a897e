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
 * wrap as the x86 integer adds Pillow compiles to. */
#include "aug_impl.h"
#include "augment.h"

#include <math.h>
#include <string.h>

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

static inline int32_t wrap_add(int32_t a, int32_t b) {
    return (int32_t)((uint32_t)a + (uint32_t)b);
}

enum { RUN = 8 };  /* consecutive source pixels worth a memcpy */

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

/* Row y of ``o``: each pixel x from channel offset ``from[x]`` of ``s`` (planar), or ``fill``
 * where that is -1; a run of consecutive source pixels (a translation's or a shear's rows) is
 * copied whole. */
static void emit_row(const Planes *o, int y, const Planes *s, const ptrdiff_t *from,
                     const int fill[3]) {
    const int w = o->w;
    for (int x = 0; x < w;) {
        int end = x + 1;
        if (from[x] < 0) {
            while (end < w && from[end] < 0) end++;
        } else {
            while (end < w && from[end] == from[end - 1] + 1) end++;
        }
        if (end - x >= RUN || from[x] < 0) {
            emit_span(o, y, x, end, s, from[x], fill);
        } else {
            for (int c = 0; c < 3; c++) {
                uint8_t *d = o->ch[c] + y * o->row;
                const uint8_t *p = s->ch[c] + from[x];
                for (int k = 0; k < end - x; k++) d[(x + k) * o->px] = p[k];
            }
        }
        x = end;
    }
}

/* ImagingScaleAffine (b == d == 0): the columns tabulated once. */
static void nearest_scale(const Planes *o, const Planes *s, const double *a, const int fill[3],
                          ptrdiff_t *cols, ptrdiff_t *from) {
    double xo = a[2] + a[0] * 0.5, yo = a[5] + a[4] * 0.5;
    int xmin = o->w, xmax = 0;
    for (int x = 0; x < o->w; x++) {
        int32_t u = coord(xo);
        cols[x] = 0;  /* Pillow's calloc'd table: 0 where a column is outside */
        if (u >= 0 && u < s->w) {
            xmax = x + 1;
            if (x < xmin) xmin = x;
            cols[x] = u;
        }
        xo += a[0];
    }
    const int w = o->w;
    const ptrdiff_t row = s->row;
    for (int y = 0; y < o->h; y++) {
        int32_t v = coord(yo);
        int inside = v >= 0 && v < s->h;
        for (int x = 0; x < w; x++)
            from[x] = inside && x >= xmin && x < xmax ? v * row + cols[x] : -1;
        emit_row(o, y, s, from, fill);
        yo += a[4];
    }
}

static int fixed_ok(const double *a, int x, int y) {
    return fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 &&
           fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
}

/* affine_fixed: 16.16 fixed point. */
static void nearest_fixed(const Planes *o, const Planes *s, const double *a, const int fill[3],
                          ptrdiff_t *from) {
#define FIX(v) floor32((v) * 65536.0 + 0.5)
    int32_t a0 = FIX(a[0]), a1 = FIX(a[1]), a3 = FIX(a[3]), a4 = FIX(a[4]);
    int32_t a2 = FIX(a[2] + a[0] * 0.5 + a[1] * 0.5);
    int32_t a5 = FIX(a[5] + a[3] * 0.5 + a[4] * 0.5);
#undef FIX
    const int w = o->w, sw = s->w, sh = s->h;
    const ptrdiff_t row = s->row;  /* held in locals: no store to ``from`` can change them */
    for (int y = 0; y < o->h; y++) {
        int32_t xx = a2, yy = a5;
        for (int x = 0; x < w; x++) {
            from[x] = offset_of(xx >> 16, yy >> 16, sw, sh, row);
            xx = wrap_add(xx, a0);
            yy = wrap_add(yy, a3);
        }
        emit_row(o, y, s, from, fill);
        a2 = wrap_add(a2, a1);
        a5 = wrap_add(a5, a4);
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
        emit_row(o, y, s, from, fill);
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

/* The same with 8-bit samples: Pillow sums those in int before the doubles. */
static inline double cubic8(const uint8_t *p, const ptrdiff_t *xs, double d) {
    int v1 = p[xs[0]], v2 = p[xs[1]], v3 = p[xs[2]], v4 = p[xs[3]];
    double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
    return p1 + d * (p2 + d * (p3 + d * p4));
}

/* bicubic_filter32RGB for the position (u, v), inside the source: rows y-1..y+2 clamped
 * (Pillow repeats the last row in range, which is the same row). */
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
        const uint8_t *p = s->ch[c];
        double w = cubic(cubic8(p + rows[0], xs, dx), cubic8(p + rows[1], xs, dx),
                         cubic8(p + rows[2], xs, dx), cubic8(p + rows[3], xs, dx), dy);
        out[c] = w <= 0.0 ? 0 : w >= 255.0 ? 255 : (uint8_t)w;
    }
}

/* ImagingGenericTransform with affine_transform: the matrix at each pixel's centre. */
static void interpolated(const Planes *o, const Planes *s, const double *a, int resample,
                         const int fill[3]) {
    for (int y = 0; y < o->h; y++) {
        double yin = y + 0.5;
        for (int x = 0; x < o->w; x++) {
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

void aug_affine(const Planes *out, const Planes *src, const double a[6], int resample,
                const int fill[3], ptrdiff_t *rows) {
    if (resample != AUG_NEAREST) {
        interpolated(out, src, a, resample, fill);
    } else if (a[1] == 0 && a[3] == 0) {
        nearest_scale(out, src, a, fill, rows, rows + out->w);
    } else if (fixed_ok(a, 0, 0) && fixed_ok(a, out->w, out->h) && fixed_ok(a, 0, out->h) &&
               fixed_ok(a, out->w, 0)) {
        nearest_fixed(out, src, a, fill, rows);
    } else {
        nearest_float(out, src, a, fill, rows);
    }
}
