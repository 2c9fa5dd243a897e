/* The resampler's driver: argument checks, the weights of each axis (Pillow's formulas), the
 * tables the kernels read, the two passes, the portable kernels and the kernel dispatch.
 * See resample.h for the contract and resample_impl.h for what a kernel computes.
 *
 * The passes are interleaved: a ring of as many intermediate rows as the vertical filter has
 * taps holds the horizontal pass's output, each intermediate row is made once, when the first
 * output row that needs it comes, so the intermediate stays in the L1 cache.
 */
#include "resample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resample_impl.h"
#include "simd.h"

#define RS_MAX_WEIGHTS ((int64_t)1 << 22)  /* weights of one axis: 32 MB of doubles */
#define RS_MAX_SCRATCH ((size_t)1 << 30)     /* tables and intermediate rows of one resize */
#define RS_ROW_SLACK 64                      /* bytes past a ring row the kernels may touch */

/* ---- sin and cos: fdlibm's kernels, so that no C library's rounding enters the weights */

static double k_sin(double x) {  /* |x| <= pi/4 */
    const double s1 = -1.66666666666666324348e-01, s2 = 8.33333333332248946124e-03,
                 s3 = -1.98412698298579493134e-04, s4 = 2.75573137070700676789e-06,
                 s5 = -2.50507602534068634195e-08, s6 = 1.58969099521155010221e-10;
    double z = x * x, w = z * z;
    double r = s2 + z * (s3 + z * s4) + z * w * (s5 + z * s6);
    return x + z * x * (s1 + z * r);
}

static double k_cos(double x) {  /* |x| <= pi/4 */
    const double c1 = 4.16666666666666019037e-02, c2 = -1.38888888888741095749e-03,
                 c3 = 2.48015872894767294178e-05, c4 = -2.75573143513906633035e-07,
                 c5 = 2.08757232129817482790e-09, c6 = -1.13596475577881948265e-11;
    double z = x * x, w = z * z;
    double r = z * (c1 + z * (c2 + z * c3)) + w * w * (c4 + z * (c5 + z * c6));
    double hz = 0.5 * z, v = 1.0 - hz;
    return v + (((1.0 - v) - hz) + z * r);
}

/* sin(x) and cos(x) for |x| <= 16: x less the nearest multiple n of pi/2 (pi/2 in two parts,
 * the first exact in 33 bits), then the kernels of that quadrant. */
static void sin_cos(double x, double *sin_x, double *cos_x) {
    const double pio2_hi = 1.57079632673412561417e+00, pio2_lo = 6.07710050650619224932e-11;
    const double two_over_pi = 6.36619772367581382433e-01;
    double q = x * two_over_pi;
    int n = (int)(q < 0.0 ? q - 0.5 : q + 0.5);
    double r = (x - n * pio2_hi) - n * pio2_lo, s = k_sin(r), c = k_cos(r);
    switch (n & 3) {
        case 0: *sin_x = s; *cos_x = c; break;
        case 1: *sin_x = c; *cos_x = -s; break;
        case 2: *sin_x = -s; *cos_x = -c; break;
        default: *sin_x = -c; *cos_x = s; break;
    }
}

/* ---- Pillow's filters (Resample.c), with the sines above */

#define RS_PI 3.14159265358979323846

/* The weight of a tap at x: Pillow's filters. For hamming and lanczos, ``s`` and ``c`` are
 * the sine and cosine of the tap's angle (pi x, and pi x / 3 for lanczos), which the caller
 * steps from tap to tap (see axis_weights). Lanczos, Pillow's sinc(x) * sinc(x / 3), takes
 * sin(pi x) as 3 s - 4 s^3: where it is near 0 (x near a nonzero integer) the difference
 * cancels to an error near 1e-16, far below what 16-bit weights hold. */
static double filter_at(int64_t filter, double x, double s, double c) {
    switch (filter) {
        case RS_BOX:
            return x > -0.5 && x <= 0.5 ? 1.0 : 0.0;
        case RS_BILINEAR:
            if (x < 0.0) x = -x;
            return x < 1.0 ? 1.0 - x : 0.0;
        case RS_HAMMING:  /* sin(pi |x|) / (pi |x|) * (0.54 + 0.46 cos(pi |x|)), |x| < 1 */
            if (x == 0.0) return 1.0;
            if (x >= 1.0 || x <= -1.0) return 0.0;
            return s / (x * RS_PI) * (0.54f + 0.46f * c);
        case RS_BICUBIC:
            if (x < 0.0) x = -x;
            if (x < 1.0) return ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1;
            if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * -0.5;
            return 0.0;
        default: /* RS_LANCZOS */
            if (x == 0.0) return 1.0;
            if (x < -3.0 || x >= 3.0) return 0.0;
            return (3.0 * s - 4.0 * s * s * s) * s * 3.0 / ((x * RS_PI) * (x * RS_PI));
    }
}

/* The angle of a tap at x for the filters that take one (0 for the others). */
static double tap_angle(int64_t filter, double x) {
    return filter == RS_LANCZOS ? x * RS_PI / 3 : filter == RS_HAMMING ? x * RS_PI : 0.0;
}

double rs_filter_support(int64_t filter) {
    switch (filter) {
        case RS_BOX: return 0.5;
        case RS_BILINEAR: case RS_HAMMING: return 1.0;
        case RS_BICUBIC: return 2.0;
        case RS_LANCZOS: return 3.0;
        default: return 0.0;  /* nearest, and no filter */
    }
}

/* ---- one axis: Pillow's precompute_coeffs, then pillow-simd's 16-bit rounding */

typedef struct {
    int64_t out;       /* resized size on this axis */
    int64_t first, n;  /* the outputs kept: the window's, [first, first + n) */
    int64_t per;       /* weights stored per output */
    double *w;         /* n * per normalized weights (one allocation with lo and count) */
    int32_t *lo, *count;  /* per output kept: first source pixel, taps used */
    int precision;     /* from the weights of every output, kept or not */
} rs_axis;

static void axis_free(rs_axis *a) {
    free(a->w);
}

/* The weights of the outputs [first, first + n) of a resize of [in0, in1) of ``in`` pixels
 * to ``out``. Every output's weights are computed (the fixed-point precision is the whole
 * axis's, so a window's bytes are the whole resize's), but only the window's are kept: an
 * extreme aspect ratio resized whole (a 1 x 20,000 strip's short side to 256) costs time in
 * proportion to its size, and memory in proportion to the window. */
static int axis_weights(rs_axis *a, int64_t in, float in0, float in1, int64_t out,
                        int64_t first, int64_t n, int64_t filter, char *msg, size_t len) {
    double scale = (double)(in1 - in0) / (double)out;
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = rs_filter_support(filter) * filterscale;
    double ksize = ceil(support) * 2 + 1;
    double maxw = 0.0, minw = 0.0, step_s = 0.0, step_c = 1.0;
    const int trig = filter == RS_LANCZOS || filter == RS_HAMMING;
    if (trig) sin_cos(tap_angle(filter, 1.0 / filterscale), &step_s, &step_c);
    memset(a, 0, sizeof *a);
    a->out = out;
    a->first = first;
    a->n = n;
    a->per = ksize < (double)in ? (int64_t)ksize : in;
    if (a->per * n > RS_MAX_WEIGHTS) {
        snprintf(msg, len, "resizing %lld pixels to a window of %lld needs %lld filter "
                 "weights, over the limit of %lld", (long long)in, (long long)n,
                 (long long)(a->per * n), (long long)RS_MAX_WEIGHTS);
        return RS_EINVAL;
    }
    /* the window's weights, then one output's scratch, then lo and count */
    a->w = malloc(sizeof(double) * (size_t)(a->per * (n + 1)) +
                  2 * sizeof(int32_t) * (size_t)n);
    if (a->w == NULL) return RS_ENOMEM;
    double *spare = a->w + a->per * n;
    a->lo = (int32_t *)(void *)(spare + a->per);
    a->count = a->lo + n;
    for (int64_t xx = 0; xx < out; xx++) {
        double center = in0 + ((double)xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
        int64_t xmin = (int64_t)(center - support + 0.5), xmax;
        if (xmin < 0) xmin = 0;
        xmax = (int64_t)(center + support + 0.5);
        if (xmax > in) xmax = in;
        xmax -= xmin;
        if (xmax < 0) xmax = 0;
        if (xmax > a->per) xmax = a->per;  /* never: Pillow's own bound */
        const int kept = xx >= first && xx < first + n;
        double *k = kept ? a->w + (xx - first) * a->per : spare, s = 0.0, c = 1.0;
        if (trig) sin_cos(tap_angle(filter, ((double)xmin - center + 0.5) * ss), &s, &c);
        for (int64_t x = 0; x < xmax; x++) {
            double w = filter_at(filter, ((double)(x + xmin) - center + 0.5) * ss, s, c);
            double next_s = s * step_c + c * step_s;  /* the angle of the next tap */
            c = c * step_c - s * step_s;
            s = next_s;
            k[x] = w;
            ww += w;
        }
        const int divide = ww != 0.0 && ww != 1.0;  /* dividing by 1 changes nothing */
        for (int64_t x = 0; x < xmax; x++) {
            if (divide) k[x] /= ww;
            if (k[x] > maxw) maxw = k[x];
            if (k[x] < minw) minw = k[x];
        }
        if (kept) {
            a->lo[xx - first] = (int32_t)xmin;
            a->count[xx - first] = (int32_t)xmax;
        }
    }
    /* pillow-simd: the most fraction bits (up to 22) that keep the largest weight below 2^15;
     * fewer if the most negative one would not fit 16 bits (never, for these filters). */
    int p = 0;
    while (p < 22 && 0.5 + maxw * (double)(1 << (p + 1)) < 32768.0) p++;
    while (p > 0 && -0.5 + minw * (double)(1 << p) <= -32769.0) p--;
    a->precision = p;
    return RS_OK;
}

static int16_t to_fixed(double w, int precision) {
    double v = w < 0 ? -0.5 + w * (double)(1 << precision) : 0.5 + w * (double)(1 << precision);
    if (v >= 32767.0) return 32767;
    if (v <= -32768.0) return -32768;
    return (int16_t)(int)v;
}

/* The taps the window's outputs need: the most any of them uses. */
static int32_t window_taps(const rs_axis *a) {
    int32_t taps = 1;
    for (int64_t i = 0; i < a->n; i++)
        if (a->count[i] > taps) taps = a->count[i];
    return taps;
}

/* The window's weights in fixed point, ``taps`` per output, each output's run of taps moved
 * left where it would pass the source's end (``in`` pixels), into ``coef`` zeroed before. */
static void window_fill(const rs_axis *a, int64_t in, int flip, int32_t taps, int32_t *start,
                        int16_t *coef) {
    int64_t last_start = in - taps > 0 ? in - taps : 0, n = a->n;
    for (int64_t j = 0; j < n; j++) {
        int64_t xx = flip ? n - 1 - j : j;
        int64_t lo = a->lo[xx], s = lo < last_start ? lo : last_start;
        int16_t *k = coef + j * taps;
        for (int32_t t = 0; t < a->count[xx]; t++)
            k[lo - s + t] = to_fixed(a->w[xx * a->per + t], a->precision);
        start[j] = (int32_t)s;
    }
}

/* ---- portable kernels */

static void hrow_portable(const rs_hplan *h, const uint8_t *src, uint8_t *dst, size_t plane,
                          int planar) {
    const int taps = h->taps, ch = h->channels, p = h->precision;
    const int32_t n = h->n, *offset = h->offset;
    const int16_t *coef = h->coef;
    const uint32_t bias = rs_bias(p);
    const size_t step = planar ? 1 : 3, at1 = planar ? plane : 1, at2 = planar ? 2 * plane : 2;
    for (int32_t j = 0; j < n; j++, coef += taps) {
        const uint8_t *s = src + offset[j];
        uint32_t a0 = bias, a1 = bias, a2 = bias;
        for (int t = 0; t < taps; t++, s += ch) {
            uint32_t kt = (uint32_t)(int32_t)coef[t];
            a0 += kt * s[0];
            a1 += kt * s[1];
            a2 += kt * s[2];
        }
        uint8_t *d = dst + (size_t)j * step;
        d[0] = rs_clamp(a0, p);
        d[at1] = rs_clamp(a1, p);
        d[at2] = rs_clamp(a2, p);
    }
}

/* In blocks of 64 bytes, each tap's row added to 64 sums at once: loops a compiler
 * vectorizes for whatever CPU it builds for. */
static void vrow_portable(const uint8_t *const *rows, size_t offset, const int16_t *coef,
                          int taps, int precision, uint8_t *dst, size_t n) {
    const uint32_t bias = rs_bias(precision);
    for (size_t i = 0; i < n; i += 64) {
        const size_t m = n - i < 64 ? n - i : 64;
        uint32_t acc[64];
        for (size_t x = 0; x < m; x++) acc[x] = bias;
        for (int t = 0; t < taps; t++) {
            const uint8_t *r = rows[t] + offset + i;
            const uint32_t k = (uint32_t)(int32_t)coef[t];
            for (size_t x = 0; x < m; x++) acc[x] += k * r[x];
        }
        for (size_t x = 0; x < m; x++) dst[i + x] = rs_clamp(acc[x], precision);
    }
}

const rs_kernel_desc rs_portable_kernel = {"portable", 1, 0, hrow_portable, vrow_portable};

/* ---- dispatch */

static int best_kernel(void) {
#ifdef RS_X86
    const int level = simd_level();
    if (level == SIMD_AVX512) return RS_AVX512;
    if (level == SIMD_AVX2) return RS_AVX2;
#endif
    return RS_PORTABLE;
}

int rs_resolve_kernel(int64_t requested) {
    int best = best_kernel();
    if (requested == RS_AUTO) return best;
    if (requested < RS_PORTABLE || requested >= RS_KERNELS || requested > best) return -1;
    return (int)requested;
}

const char *rs_kernel_name(int kernel) {
    static const char *const names[RS_KERNELS] = {"portable", "avx2", "avx512"};
    return kernel >= 0 && kernel < RS_KERNELS ? names[kernel] : NULL;
}

static const rs_kernel_desc *kernel_desc(int kernel) {
#ifdef RS_X86
    if (kernel == RS_AVX512) return &rs_avx512_kernel;
    if (kernel == RS_AVX2) return &rs_avx2_kernel;
#endif
    (void)kernel;
    return &rs_portable_kernel;
}

/* ---- argument checks */

static int fail(char *msg, size_t len, const char *what) {
    snprintf(msg, len, "%s", what);
    return RS_EINVAL;
}

/* The size of the image the box refers to: the source's own unless it is a part. */
static int64_t full_width(const rs_job *j) { return j->full_width ? j->full_width : j->width; }
static int64_t full_height(const rs_job *j) {
    return j->full_width ? j->full_height : j->height;
}

/* The axis's taps moved from the image's coordinates to the part's (``origin``, ``in``
 * pixels long), which must hold every tap with a weight. */
static int axis_shift(rs_axis *a, int64_t origin, int64_t in, char *msg, size_t len) {
    for (int64_t xx = 0; xx < a->n; xx++) {
        int64_t lo = a->lo[xx] - origin;
        if (a->count[xx] > 0 && (lo < 0 || lo + a->count[xx] > in)) {
            snprintf(msg, len, "the source part (%lld pixels from %lld) does not hold the "
                     "pixels %lld to %lld that the filter reads", (long long)in,
                     (long long)origin, (long long)a->lo[xx],
                     (long long)(a->lo[xx] + a->count[xx]));
            return RS_EINVAL;
        }
        a->lo[xx] = (int32_t)(a->count[xx] > 0 ? lo : 0);
    }
    return RS_OK;
}

static int check_job(const rs_job *j, float box[4], char *msg, size_t len) {
    if ((j->src == NULL && j->make_rows == NULL) || j->out == NULL)
        return fail(msg, len, "no source or output buffer");
    if (j->channels != 3 && j->channels != 4)
        return fail(msg, len, "channels must be 3 (RGB) or 4 (RGBX)");
    if (j->make_rows != NULL && (j->channels != 4 || j->filter == RS_NEAREST))
        return fail(msg, len, "a source of made rows gives RGBX (channels 4), and is resampled "
                    "by a filter");
    if (j->width < 1 || j->width > RS_MAX_SIDE || j->height < 1 || j->height > RS_MAX_SIDE ||
        j->out_width < 1 || j->out_width > RS_MAX_SIDE || j->out_height < 1 ||
        j->out_height > RS_MAX_SIDE) {
        snprintf(msg, len, "sizes must be 1 to %lld pixels: source %lldx%lld, output %lldx%lld",
                 (long long)RS_MAX_SIDE, (long long)j->width, (long long)j->height,
                 (long long)j->out_width, (long long)j->out_height);
        return RS_EINVAL;
    }
    if (j->make_rows == NULL &&
        (j->stride < j->width * j->channels || j->stride > RS_MAX_SIDE * 64))
        return fail(msg, len, "stride must hold a row (width * channels) and be below 2^30");
    /* at most 2^24 rows of 2^30 bytes: no overflow in 64 bits */
    if (j->make_rows == NULL &&
        (uint64_t)((j->height - 1) * j->stride + j->width * j->channels) > (uint64_t)j->src_len) {
        snprintf(msg, len, "the source holds %zu bytes, a %lldx%lld image of stride %lld needs "
                 "%lld", j->src_len, (long long)j->width, (long long)j->height,
                 (long long)j->stride,
                 (long long)((j->height - 1) * j->stride + j->width * j->channels));
        return RS_EINVAL;
    }
    for (int i = 0; i < 4; i++) {
        box[i] = (float)j->box[i];  /* Pillow reads the box as single precision */
        if (!isfinite(j->box[i]) || !isfinite(box[i]))
            return fail(msg, len, "box coordinates must be finite");
    }
    const int64_t fw = full_width(j), fh = full_height(j);
    if (fw > RS_MAX_SIDE || fh > RS_MAX_SIDE || j->origin_x < 0 || j->origin_y < 0 ||
        j->origin_x > fw - j->width || j->origin_y > fh - j->height) {
        snprintf(msg, len, "the %lldx%lld source at (%lld, %lld) must lie within its %lldx%lld "
                 "image", (long long)j->width, (long long)j->height, (long long)j->origin_x,
                 (long long)j->origin_y, (long long)fw, (long long)fh);
        return RS_EINVAL;
    }
    if (box[0] < 0 || box[1] < 0 || box[2] > (float)fw || box[3] > (float)fh ||
        box[2] - box[0] < 0 || box[3] - box[1] < 0) {
        snprintf(msg, len, "box (%g, %g, %g, %g) must lie within the %lldx%lld image, "
                 "left <= right and top <= bottom", (double)box[0], (double)box[1],
                 (double)box[2], (double)box[3], (long long)fw, (long long)fh);
        return RS_EINVAL;
    }
    if (j->left < 0 || j->top < 0 || j->cols < 1 || j->rows < 1 ||
        j->cols > j->out_width - j->left || j->rows > j->out_height - j->top) {
        snprintf(msg, len, "window (%lld, %lld, %lld, %lld) must lie within the %lldx%lld "
                 "output", (long long)j->left, (long long)j->top, (long long)j->cols,
                 (long long)j->rows, (long long)j->out_width, (long long)j->out_height);
        return RS_EINVAL;
    }
    if ((uint64_t)j->out_len != (uint64_t)(j->cols * j->rows * 3)) {
        snprintf(msg, len, "out holds %zu bytes, a %lldx%lld RGB window needs %lld", j->out_len,
                 (long long)j->cols, (long long)j->rows, (long long)(j->cols * j->rows * 3));
        return RS_EINVAL;
    }
    if (j->filter < RS_NEAREST || j->filter > RS_HAMMING)
        return fail(msg, len, "filter must be one of Pillow's: 0 (nearest) to 5 (hamming)");
    if (rs_resolve_kernel(j->kernel) < 0) {
        const char *name = j->kernel >= 0 && j->kernel < RS_KERNELS ?
                           rs_kernel_name((int)j->kernel) : "no such kernel";
        snprintf(msg, len, "kernel %lld (%s) cannot run here: this CPU runs up to %s",
                 (long long)j->kernel, name, rs_kernel_name(best_kernel()));
        return RS_EINVAL;
    }
    return RS_OK;
}

/* ---- nearest: Pillow's nearest-neighbour scaling (ImagingScaleAffine) */

/* Source index of each output position of the window along one axis, -1 outside. */
static int nearest_axis(float b0, float b1, int64_t in, int64_t origin, int64_t part,
                        int64_t out, int64_t first, int64_t n, int32_t *index) {
    double step = (double)(b1 - b0) / (double)out, at = (double)b0 + step * 0.5;
    for (int64_t x = 0; x < first + n; x++, at += step) {
        int64_t i = at < 0.0 ? -1 : (int64_t)at;
        if (x < first) continue;
        if (i >= 0 && i < in && (i < origin || i >= origin + part)) return RS_EINVAL;
        index[x - first] = i >= 0 && i < in ? (int32_t)(i - origin) : -1;
    }
    return RS_OK;
}

static int resize_nearest(const rs_job *j, const float box[4]) {
    int32_t *xs = malloc(sizeof(int32_t) * (size_t)j->cols);
    int32_t *ys = malloc(sizeof(int32_t) * (size_t)j->rows);
    if (xs == NULL || ys == NULL) {
        free(xs);
        free(ys);
        return RS_ENOMEM;
    }
    if (nearest_axis(box[0], box[2], full_width(j), j->origin_x, j->width, j->out_width,
                     j->left, j->cols, xs) != RS_OK ||
        nearest_axis(box[1], box[3], full_height(j), j->origin_y, j->height, j->out_height,
                     j->top, j->rows, ys) != RS_OK) {
        free(xs);
        free(ys);
        return RS_EINVAL;
    }
    size_t plane = (size_t)(j->rows * j->cols);
    for (int64_t r = 0; r < j->rows; r++) {
        const uint8_t *row = ys[r] < 0 ? NULL : j->src + (size_t)ys[r] * (size_t)j->stride;
        for (int64_t c = 0; c < j->cols; c++) {
            int32_t x = xs[j->flip ? j->cols - 1 - c : c];
            const uint8_t *p = row != NULL && x >= 0 ? row + (size_t)x * (size_t)j->channels
                                                      : NULL;
            for (int k = 0; k < 3; k++) {
                uint8_t v = p != NULL ? p[k] : 0;
                if (j->planar)
                    j->out[(size_t)k * plane + (size_t)(r * j->cols + c)] = v;
                else
                    j->out[(size_t)(r * j->cols + c) * 3 + (size_t)k] = v;
            }
        }
    }
    free(xs);
    free(ys);
    return RS_OK;
}

/* ---- the two passes */

typedef struct {
    rs_hplan h;
    int32_t *hstart, *vstart, *copy;
    int16_t *vcoef;
    int32_t vtaps;
    int vprecision;
    size_t max_read;     /* bytes of a source row the horizontal kernel may read */
    size_t plane;        /* planar: bytes between a ring row's channel segments */
    size_t row_bytes;    /* bytes a ring row takes */
    uint8_t *ring, *scratch;
    const uint8_t **rows;
    void *block;
} rs_plan;

/* The SIMD kernels' tables: each group's pairs of weights widened to 4 lanes, and, where
 * every group's taps fit one load of ``span`` pixels (RGBX only), the window mode's
 * indices: lane l of a group holds outputs l and l + group/2. */
static void simd_tables(rs_plan *pl, const rs_kernel_desc *kd, int32_t *wide, int32_t *base,
                        int32_t *perm) {
    rs_hplan *h = &pl->h;
    const int g = kd->group, half = kd->group / 2, pairs = h->taps / 2;
    const int32_t groups = h->padded / g;
    int window = kd->window_span > 0 && h->channels == 4;
    for (int32_t gi = 0; gi < groups; gi++) {
        const int32_t *st = pl->hstart + gi * g;
        int32_t lo = st[0], hi = st[0];
        for (int i = 1; i < g; i++) {
            if (st[i] < lo) lo = st[i];
            if (st[i] > hi) hi = st[i];
        }
        if (hi + 1 - lo >= kd->window_span) window = 0;
        base[gi] = lo * 4;
        for (int l = 0; l < half; l++) {
            int32_t *ix = perm + (gi * half + l) * 4;
            ix[0] = st[l] - lo;
            ix[1] = st[l] - lo + 1;
            ix[2] = st[l + half] - lo;
            ix[3] = st[l + half] - lo + 1;
        }
        for (int t = 0; t < pairs; t++)
            for (int i = 0; i < g; i++) {
                const int16_t *k = h->coef + (size_t)(gi * g + i) * (size_t)h->taps + 2 * t;
                uint32_t v = (uint32_t)(uint16_t)k[0] | (uint32_t)(uint16_t)k[1] << 16;
                int32_t *dst = wide + (((size_t)gi * (size_t)pairs + (size_t)t) * (size_t)g +
                                       (size_t)i) * 4;
                dst[0] = dst[1] = dst[2] = dst[3] = (int32_t)v;
            }
    }
    h->window = window;
    size_t ch = (size_t)h->channels, read = 0;
    for (int32_t j = 0; j < h->padded; j++) {
        size_t end = (size_t)h->offset[j] + (size_t)(h->taps - 2) * ch + 8;
        if (window) end = (size_t)base[j / g] + (size_t)(h->taps - 2 + kd->window_span) * 4;
        if (end > read) read = end;
    }
    pl->max_read = read;
}

static int plan_build(rs_plan *pl, const rs_job *j, const rs_kernel_desc *kd, rs_axis *ax,
                      rs_axis *ay, char *msg, size_t len) {
    const int g = kd->group;
    const int32_t ht = (window_taps(ax) + 1) & ~1;
    const int32_t n = (int32_t)j->cols, padded = (n + g - 1) / g * g;
    const int32_t vt = window_taps(ay);
    const size_t groups = (size_t)(padded / g), pairs = (size_t)ht / 2;
    pl->plane = j->planar ? (size_t)padded + RS_ROW_SLACK : 0;
    pl->row_bytes = j->planar ? 3 * pl->plane : (size_t)padded * 3 + RS_ROW_SLACK;
    size_t src_row = (size_t)(j->width + ht + 16) * (size_t)j->channels + RS_ROW_SLACK;
    size_t sizes[] = {
        sizeof(int32_t) * (size_t)padded * 2,                   /* hstart, offset */
        sizeof(int16_t) * (size_t)padded * (size_t)ht,          /* hcoef */
        sizeof(int32_t) * groups * pairs * (size_t)g * 4,       /* wide */
        sizeof(int32_t) * groups * (1 + 2 * (size_t)g),         /* base, perm */
        sizeof(int32_t) * (size_t)j->rows * 2,                  /* vstart, copy */
        sizeof(int16_t) * (size_t)j->rows * (size_t)vt,         /* vcoef */
        sizeof(uint8_t *) * 2 * (size_t)vt,                     /* rows */
        pl->row_bytes * (size_t)vt,                             /* ring */
        src_row,                                                /* scratch */
    };
    size_t total = 0, at[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        at[i] = total;
        total += (sizes[i] + 63) & ~(size_t)63;  /* each below 2^60: no overflow */
    }
    if (total > RS_MAX_SCRATCH) {
        snprintf(msg, len, "this resize needs %zu bytes of scratch (%d rows of %zu bytes "
                 "between the passes), over the limit of %zu", total, (int)vt, pl->row_bytes,
                 RS_MAX_SCRATCH);
        return RS_EINVAL;
    }
    uint8_t *b = pl->block = aligned_alloc(64, total);
    if (b == NULL) return RS_ENOMEM;
    memset(b, 0, total);
    rs_hplan *h = &pl->h;
    pl->hstart = (int32_t *)(b + at[0]);
    int32_t *offset = pl->hstart + padded;
    int16_t *hcoef = (int16_t *)(b + at[1]);
    window_fill(ax, j->width, j->flip, ht, pl->hstart, hcoef);
    for (int32_t i = 0; i < padded; i++) {
        if (i >= n) pl->hstart[i] = pl->hstart[n - 1];  /* zero weights, reads in range */
        offset[i] = pl->hstart[i] * (int32_t)j->channels;
    }
    *h = (rs_hplan){n, padded, ht, ax->precision, (int32_t)j->channels, 0, offset, hcoef,
                    (int32_t *)(b + at[2]), (int32_t *)(b + at[3]),
                    (int32_t *)(b + at[3]) + groups};
    pl->max_read = 0;
    for (int32_t i = 0; i < padded; i++) {
        size_t end = (size_t)(pl->hstart[i] + ht) * (size_t)j->channels;
        if (end > pl->max_read) pl->max_read = end;
    }
    if (g > 1) simd_tables(pl, kd, (int32_t *)h->wide, (int32_t *)h->base, (int32_t *)h->perm);
    pl->vstart = (int32_t *)(b + at[4]);
    pl->copy = pl->vstart + j->rows;
    pl->vcoef = (int16_t *)(b + at[5]);
    pl->vtaps = vt;
    pl->vprecision = ay->precision;
    window_fill(ay, j->height, 0, vt, pl->vstart, pl->vcoef);
    for (int64_t r = 0; r < j->rows; r++) {  /* rows that are one source row: a copy */
        const int16_t *k = pl->vcoef + r * vt;
        int32_t one = -1, others = 0;
        for (int32_t t = 0; t < vt; t++) {
            if (k[t] == (1 << pl->vprecision) && one < 0) one = t;
            else if (k[t] != 0) others = 1;
        }
        pl->copy[r] = others ? -1 : one;
    }
    pl->rows = (const uint8_t **)(void *)(b + at[6]);
    pl->ring = b + at[7];
    pl->scratch = b + at[8];
    return RS_OK;
}

/* Source row y for the horizontal kernel: in place, or copied where the kernel's reads would
 * pass the end of the buffer (its last rows; reads past a row's end only feed zero weights),
 * or made by the job's ``make_rows``. */
static const uint8_t *source_row(const rs_job *j, const rs_plan *pl, int64_t y) {
    if (j->make_rows != NULL) {  /* made on demand into the scratch row, which the reads fit */
        j->make_rows->row(j->make_rows, y, pl->scratch);
        return pl->scratch;
    }
    size_t at = (size_t)y * (size_t)j->stride;
    if (at + pl->max_read <= j->src_len) return j->src + at;
    memcpy(pl->scratch, j->src + at, (size_t)(j->width * j->channels));
    return pl->scratch;
}

/* ``slot`` moved on by ``by`` rows in a ring of ``n`` (no division: ``by`` is small). */
static int32_t ring_step(int32_t slot, int64_t by, int32_t n) {
    int64_t s = slot + by;
    while (s >= n) s -= n;
    return (int32_t)s;
}

static void run_passes(const rs_job *j, rs_plan *pl, const rs_kernel_desc *kd) {
    const int32_t vt = pl->vtaps;
    const size_t cols = (size_t)j->cols, plane_out = cols * (size_t)j->rows;
    /* Source row q's intermediate row lives in ring slot q % vt, and rows[s] = rows[s + vt]
     * = slot s: so rows + (ys % vt) lists the rows ys .. ys + vt - 1 in order. */
    for (int32_t t = 0; t < vt; t++)
        pl->rows[t] = pl->rows[t + vt] = pl->ring + (size_t)t * pl->row_bytes;
    int64_t next = 0, ys = 0;  /* the first source row not yet in the ring; the window's */
    int32_t next_slot = 0, ys_slot = 0;
    for (int64_t r = 0; r < j->rows; r++) {
        ys_slot = ring_step(ys_slot, pl->vstart[r] - ys, vt);
        ys = pl->vstart[r];
        if (next < ys) {
            next = ys;
            next_slot = ys_slot;
        }
        for (; next < ys + vt; next++) {
            kd->hrow(&pl->h, source_row(j, pl, next),
                     pl->ring + (size_t)next_slot * pl->row_bytes, pl->plane, j->planar);
            next_slot = next_slot + 1 == vt ? 0 : next_slot + 1;
        }
        const uint8_t *const *rows = pl->rows + ys_slot;
        const int16_t *k = pl->vcoef + r * vt;
        for (int c = 0; c < (j->planar ? 3 : 1); c++) {
            uint8_t *dst = j->planar ? j->out + (size_t)c * plane_out + (size_t)r * cols
                                     : j->out + (size_t)r * cols * 3;
            size_t offset = (size_t)c * pl->plane, n = j->planar ? cols : cols * 3;
            if (pl->copy[r] >= 0)
                memcpy(dst, rows[pl->copy[r]] + offset, n);
            else
                kd->vrow(rows, offset, k, vt, pl->vprecision, dst, n);
        }
    }
}

int rs_resize(const rs_job *job, char *message, size_t message_len) {
    float box[4];
    int rc = check_job(job, box, message, message_len);
    if (rc != RS_OK) return rc;
    if (job->filter == RS_NEAREST) {
        rc = resize_nearest(job, box);
        if (rc == RS_EINVAL)
            snprintf(message, message_len, "the source part does not hold every pixel that "
                     "nearest picks");
    } else {
        const rs_kernel_desc *kd = kernel_desc(rs_resolve_kernel(job->kernel));
        rs_axis ax, ay;
        rs_plan pl = {0};
        rc = axis_weights(&ax, full_width(job), box[0], box[2], job->out_width, job->left,
                          job->cols, job->filter, message, message_len);
        if (rc == RS_OK)
            rc = axis_weights(&ay, full_height(job), box[1], box[3], job->out_height,
                              job->top, job->rows, job->filter, message, message_len);
        else
            memset(&ay, 0, sizeof ay);
        if (rc == RS_OK) rc = axis_shift(&ax, job->origin_x, job->width, message, message_len);
        if (rc == RS_OK) rc = axis_shift(&ay, job->origin_y, job->height, message, message_len);
        if (rc == RS_OK) rc = plan_build(&pl, job, kd, &ax, &ay, message, message_len);
        if (rc == RS_OK) run_passes(job, &pl, kd);
        free(pl.block);
        axis_free(&ax);
        axis_free(&ay);
    }
    if (rc == RS_ENOMEM) snprintf(message, message_len, "out of memory");
    return rc;
}
