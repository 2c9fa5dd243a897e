/* The colour and histogram ops (aug_impl.h), each Pillow 13.0.0's arithmetic on an RGB image:
 *
 * - lookup tables as PIL/ImageOps.py builds them, applied as Image.point applies a table
 *   (each entry Python-rounded, then clipped to 0..255: _imaging.c's CLIP8);
 * - ImageEnhance's blends (libImaging/Blend.c): in float, ``in1 + alpha * (in2 - in1)``,
 *   clipped and truncated; the degenerate images: black (Brightness), the grayscale image
 *   converted back (Color; libImaging/Convert.c's rgb2l), the grayscale mean (Contrast), and
 *   ImageFilter.SMOOTH (Sharpness; libImaging/Filter.c's 3x3 float kernel, whose edge rows
 *   and columns are the source's own).
 *
 * Compiled with -ffp-contract=off (setup.py): no fused multiply-add, so every float is the
 * one Pillow's x86-64 build computes. */
#include "aug_impl.h"
#include "augment.h"

#include <math.h>
#include <string.h>

void aug_lut_posterize(uint8_t t[256], int bits) {
    int mask = ~((1 << (8 - bits)) - 1);  /* bits 0: every value 0 */
    for (int i = 0; i < 256; i++) t[i] = (uint8_t)(i & mask);
}

void aug_lut_solarize(uint8_t t[256], double threshold) {
    for (int i = 0; i < 256; i++) t[i] = (uint8_t)((double)i < threshold ? i : 255 - i);
}

/* timm's ``min(255, i + add)`` below the threshold, through Image.point: round() (half to
 * even: rint in the default rounding mode), then clipped to 0..255. */
void aug_lut_solarize_add(uint8_t t[256], double add, double threshold) {
    for (int i = 0; i < 256; i++) {
        if (!((double)i < threshold)) {
            t[i] = (uint8_t)i;
            continue;
        }
        double v = rint(fmin(255.0, (double)i + add));
        t[i] = (uint8_t)(v <= 0.0 ? 0 : v >= 255.0 ? 255 : (int)v);
    }
}

void aug_lut_invert(uint8_t t[256]) {
    for (int i = 0; i < 256; i++) t[i] = (uint8_t)(255 - i);
}

void aug_lut_blend(uint8_t t[256], int degenerate, float alpha) {
    for (int i = 0; i < 256; i++) t[i] = blend8(degenerate, i, alpha);
}

/* ImageOps.autocontrast, cutoff 0: the lowest and highest levels present stretched to 0 and
 * 255, ``int(ix * scale + offset)`` clipped; one level or none present: unchanged. */
void aug_lut_autocontrast(uint8_t t[256], const uint64_t hist[256]) {
    int lo = 0, hi = 255;
    while (lo < 255 && hist[lo] == 0) lo++;
    while (hi > 0 && hist[hi] == 0) hi--;
    if (hi <= lo) {
        for (int i = 0; i < 256; i++) t[i] = (uint8_t)i;
        return;
    }
    double scale = 255.0 / (double)(hi - lo);
    double offset = -(double)lo * scale;
    for (int i = 0; i < 256; i++) {
        double v = (double)i * scale + offset;  /* Python's int(): towards zero */
        int ix = (int)v;
        t[i] = (uint8_t)(ix < 0 ? 0 : ix > 255 ? 255 : ix);
    }
}

/* ImageOps.equalize: step = (pixels - the count of the highest level present) // 255; with
 * two levels present or more and step > 0, level i maps to (step // 2 + the pixels below i)
 * // step, clipped to 255 as Image.point clips; else unchanged. */
void aug_lut_equalize(uint8_t t[256], const uint64_t hist[256]) {
    uint64_t total = 0, last = 0;
    int present = 0;
    for (int i = 0; i < 256; i++) {
        if (hist[i] == 0) continue;
        total += hist[i];
        last = hist[i];
        present++;
    }
    uint64_t step = present > 1 ? (total - last) / 255 : 0;
    if (step == 0) {
        for (int i = 0; i < 256; i++) t[i] = (uint8_t)i;
        return;
    }
    uint64_t n = step / 2;
    for (int i = 0; i < 256; i++) {
        uint64_t v = n / step;
        t[i] = (uint8_t)(v > 255 ? 255 : v);
        n += hist[i];
    }
}

/* Eight bytes at a time: one load, then each byte shifted out (the same shift for a byte's
 * place whatever the machine's byte order, so the stores below put each result where its
 * byte was). Loops of a few instructions a byte run at a speed that hangs on where they lie
 * in the code; these do not. */
static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint8_t byte_at(uint64_t v, int k) { return (uint8_t)(v >> (8 * k)); }

/* Counts of a plane's row into four tables (no count waits on the one before). */
static void count_plane_row(uint32_t raw[4][256], const uint8_t *p, int w) {
    int x = 0;
    for (; x + 8 <= w; x += 8) {
        const uint64_t v = load64(p + x);
        for (int k = 0; k < 8; k++) raw[k & 3][byte_at(v, k)]++;
    }
    for (; x < w; x++) raw[x & 3][p[x]]++;
}

/* Counts of a row of ``w`` pixels (R, G, B bytes) into each channel's four tables. */
static void count_pixel_row(uint32_t raw[3][4][256], const uint8_t *p, int w) {
    const int n = 3 * w;
    int x = 0;
    for (; x + 24 <= n; x += 24) {
        const uint64_t v[3] = {load64(p + x), load64(p + x + 8), load64(p + x + 16)};
#pragma GCC unroll 24
        for (int j = 0; j < 24; j++) raw[j % 3][(j / 3) & 3][byte_at(v[j / 8], j % 8)]++;
    }
    for (; x < n; x++) raw[x % 3][0][p[x]]++;
}

void aug_histogram(const Planes *im, const Lut lut, uint64_t hist[3][256]) {
    /* four tables a channel, each at most ceil(w / 4) x h < 2^32 */
    uint32_t raw[3][4][256];
    memset(raw, 0, sizeof raw);
    for (int y = 0; y < im->h; y++) {
        if (im->px == 1) {
            for (int c = 0; c < 3; c++) count_plane_row(raw[c], im->ch[c] + y * im->row, im->w);
        } else {
            count_pixel_row(raw, im->ch[0] + y * im->row, im->w);
        }
    }
    memset(hist, 0, sizeof(uint64_t) * 3 * 256);
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++)
            hist[c][lut ? lut[c][v] : v] += (uint64_t)raw[c][0][v] + raw[c][1][v] +
                                            raw[c][2][v] + raw[c][3][v];
}

void aug_extremes(const Planes *im, uint64_t hist[3][256]) {
    uint8_t lo[3] = {255, 255, 255}, hi[3] = {0, 0, 0};
    const int w = im->w;
    for (int y = 0; y < im->h; y++) {
        if (im->px == 1) {  /* a plane's row: minima and maxima the compiler vectorises */
            for (int c = 0; c < 3; c++) {
                const uint8_t *p = im->ch[c] + y * im->row;
                uint8_t l = lo[c], h = hi[c];
                for (int x = 0; x < w; x++) {
                    l = p[x] < l ? p[x] : l;
                    h = p[x] > h ? p[x] : h;
                }
                lo[c] = l;
                hi[c] = h;
            }
            continue;
        }
        const uint8_t *p = im->ch[0] + y * im->row;
        for (int x = 0; x < w; x++, p += 3) {
            for (int c = 0; c < 3; c++) {
                lo[c] = p[c] < lo[c] ? p[c] : lo[c];
                hi[c] = p[c] > hi[c] ? p[c] : hi[c];
            }
        }
    }
    memset(hist, 0, sizeof(uint64_t) * 3 * 256);
    for (int c = 0; c < 3; c++) hist[c][lo[c]] = hist[c][hi[c]] = 1;
}

/* ImageStat's mean is sum / count, a correctly rounded division (both exact in a double
 * here), and ImageEnhance.Contrast takes int(mean + 0.5). */
int aug_gray_mean(const Planes *im, const Lut lut) {
    uint64_t sum = 0;
    const int w = im->w;
    const ptrdiff_t px = im->px;
    for (int y = 0; y < im->h; y++) {
        const uint8_t *r = im->ch[0] + y * im->row, *g = im->ch[1] + y * im->row,
                      *b = im->ch[2] + y * im->row;
        uint32_t row = 0;  /* at most 255 x 65500: no overflow */
        if (lut == NULL && px == 1) {
            for (int x = 0; x < w; x++) row += (uint32_t)luma(r[x], g[x], b[x]);
        } else if (lut == NULL) {
            for (int x = 0; x < w; x++) row += (uint32_t)luma(r[x * px], g[x * px], b[x * px]);
        } else {
            for (int x = 0; x < w; x++)
                row += (uint32_t)luma(lut[0][r[x * px]], lut[1][g[x * px]], lut[2][b[x * px]]);
        }
        sum += row;
    }
    double mean = (double)sum / ((double)im->w * (double)im->h);
    return (int)(mean + 0.5);
}

/* ``d`` = ``t`` of ``s``, ``n`` bytes of a plane (``d`` may be ``s``). */
static void lut_plane_row(uint8_t *d, const uint8_t *s, const uint8_t t[256], int n) {
    int x = 0;
    for (; x + 8 <= n; x += 8) {
        const uint64_t v = load64(s + x);
        uint64_t r = 0;
        for (int k = 0; k < 8; k++) r |= (uint64_t)t[byte_at(v, k)] << (8 * k);
        memcpy(d + x, &r, 8);
    }
    for (; x < n; x++) d[x] = t[s[x]];
}

/* The same for a row of ``w`` pixels (R, G, B bytes), in place or not. */
static void lut_pixel_row(uint8_t *d, const uint8_t *s, const Lut lut, int w) {
    const int n = 3 * w;
    int x = 0;
    for (; x + 24 <= n; x += 24) {
#pragma GCC unroll 3
        for (int i = 0; i < 3; i++) {
            const uint64_t v = load64(s + x + 8 * i);
            uint64_t r = 0;
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                r |= (uint64_t)lut[(8 * i + k) % 3][byte_at(v, k)] << (8 * k);
            memcpy(d + x + 8 * i, &r, 8);
        }
    }
    for (; x < n; x++) d[x] = lut[x % 3][s[x]];
}

void aug_apply_lut(const Planes *dst, const Planes *src, const Lut lut, int kernel) {
    const int w = src->w;
    if (src->px == 1 && dst->px == 1) {  /* plane by plane */
        for (int c = 0; c < 3; c++) {
#ifdef AUG_X86
            if (kernel == AUG_KERNEL_AVX2 && lut != NULL) {
                aug_lut_plane_avx2(dst->ch[c], dst->row, src->ch[c], src->row, w, src->h,
                                   lut[c]);
                continue;
            }
#endif
            uint8_t t[256];
            if (lut != NULL) memcpy(t, lut[c], sizeof t);  /* no store can change it */
            for (int y = 0; y < src->h; y++) {
                const uint8_t *s = src->ch[c] + y * src->row;
                uint8_t *d = dst->ch[c] + y * dst->row;
                if (lut != NULL)
                    lut_plane_row(d, s, t, w);
                else if (d != s)
                    memcpy(d, s, (size_t)w);
            }
        }
        return;
    }
    (void)kernel;
    for (int y = 0; y < src->h; y++) {
        const uint8_t *r = src->ch[0] + y * src->row, *g = src->ch[1] + y * src->row,
                      *b = src->ch[2] + y * src->row;
        uint8_t *dr = dst->ch[0] + y * dst->row, *dg = dst->ch[1] + y * dst->row,
                *db = dst->ch[2] + y * dst->row;
        if (src->px == 3 && dst->px == 3 && lut != NULL) {  /* rows of pixels to rows */
            lut_pixel_row(dr, r, lut, w);
            continue;
        }
        for (int x = 0; x < w; x++) {  /* a pixel at a time: one pass over each row */
            ptrdiff_t i = x * src->px, o = x * dst->px;
            uint8_t vr = r[i], vg = g[i], vb = b[i];
            dr[o] = lut ? lut[0][vr] : vr;
            dg[o] = lut ? lut[1][vg] : vg;
            db[o] = lut ? lut[2][vb] : vb;
        }
    }
}

/* ImageEnhance.Color: each pixel blended with its grey (``img.convert("L")``) value. */
void aug_color(const Planes *im, float alpha, int kernel) {
#ifdef AUG_X86
    if (kernel == AUG_KERNEL_AVX2) {
        aug_color_avx2(im, alpha);
        return;
    }
#endif
    (void)kernel;
    const int w = im->w;  /* held in a local: the loop's count is then known to the compiler */
    for (int y = 0; y < im->h; y++) {
        uint8_t *restrict r = im->ch[0] + y * im->row, *restrict g = im->ch[1] + y * im->row,
                *restrict b = im->ch[2] + y * im->row;
        for (int x = 0; x < w; x++) {
            int l = luma(r[x], g[x], b[x]);
            r[x] = blend8(l, r[x], alpha);
            g[x] = blend8(l, g[x], alpha);
            b[x] = blend8(l, b[x], alpha);
        }
    }
}

/* ImageFilter.SMOOTH is Pillow's 3x3 float kernel (1 1 1 / 1 5 1 / 1 1 1) / 13 (aug_impl.h's
 * AUG_K1, AUG_K5): at each inner pixel the kernel's rows, each ``(v[x-1] k + v[x] k') +
 * v[x+1] k``, summed onto 0.5 in Pillow's order (the row below first, then the pixel's own,
 * then the row above), truncated. Pillow clips the sum to 0..255 first, which changes nothing
 * here: the weights are positive, so the sum is at least 0.5, and at most 255.5 (all nine
 * 255). A row's sum with the weights (1, 1, 1) / 13 is the row below of one output row and
 * the row above of another: it is made once (``triple``), kept in a ring of three rows, and
 * read twice; the same floats, so the same sums. */
static void triple(float *restrict t, const uint8_t *restrict r, int w) {
    for (int x = 1; x < w - 1; x++)
        t[x] = ((float)r[x - 1] * AUG_K1 + (float)r[x] * AUG_K1) + (float)r[x + 1] * AUG_K1;
}

/* An output row from its source row ``mid`` and the sums of the rows below and above. */
static void sharpen_row(uint8_t *restrict out, const uint8_t *restrict mid,
                        const float *restrict below, const float *restrict above, int w,
                        float alpha) {
    out[0] = mid[0];
    for (int x = 1; x < w - 1; x++) {
        float ss = 0.5f;
        ss += below[x];
        ss += ((float)mid[x - 1] * AUG_K1 + (float)mid[x] * AUG_K5) + (float)mid[x + 1] * AUG_K1;
        ss += above[x];
        out[x] = blend8((int)ss, mid[x], alpha);
    }
    out[w - 1] = mid[w - 1];
}

/* A kernel's pair: the sums of a row, and an output row from them (portable or AVX2). */
typedef struct {
    void (*triple)(float *t, const uint8_t *r, int w);
    void (*row)(uint8_t *out, const uint8_t *mid, const float *below, const float *above,
                int w, float alpha);
} SharpenKernel;

/* One channel's rows 1..h-2 (an image of at least 3 x 3) with kernel ``k``; ``t``: three
 * rows of floats, ``line``: a row of bytes, where ``out`` is not a plane. */
static void sharpen_plane(SharpenKernel k, uint8_t *out, ptrdiff_t px, ptrdiff_t out_row,
                          const uint8_t *s, ptrdiff_t row, int w, int h, float alpha, float *t,
                          uint8_t *line) {
    k.triple(t, s, w);
    k.triple(t + w, s + row, w);
    for (int y = 1; y < h - 1; y++) {
        float *below = t + (size_t)((y + 1) % 3) * (size_t)w,
              *above = t + (size_t)((y - 1) % 3) * (size_t)w;
        k.triple(below, s + (y + 1) * row, w);
        uint8_t *o = out + y * out_row;
        const uint8_t *mid = s + y * row;
        if (mid == o) {  /* in place: the row's own bytes kept before they are written */
            memcpy(line, mid, (size_t)w);
            mid = line;
        }
        if (px == 1) {
            k.row(o, mid, below, above, w, alpha);
        } else {
            k.row(line, mid, below, above, w, alpha);
            for (int x = 0; x < w; x++) o[x * px] = line[x];
        }
    }
}

void aug_sharpness(const Planes *im, const Planes *src, float alpha, void *rows, int kernel) {
    float *t = rows;
    uint8_t *line = (uint8_t *)(t + 3 * (size_t)im->w);
    const int w = im->w, h = im->h, inner = w >= 3 && h >= 3;
    for (int c = 0; c < 3; c++) {
        for (int y = 0; y < h && src != im; y++) {  /* the rows Pillow leaves as they are */
            if (inner && y != 0 && y != h - 1) continue;
            uint8_t *out = im->ch[c] + y * im->row;
            const uint8_t *s = src->ch[c] + y * src->row;
            for (int x = 0; x < w; x++) out[x * im->px] = s[x];
        }
        if (!inner) continue;
        SharpenKernel k = {triple, sharpen_row};
#ifdef AUG_X86
        if (kernel == AUG_KERNEL_AVX2 && w >= AUG_SHARPEN_MIN_AVX2)
            k = (SharpenKernel){aug_sharpen_triple_avx2, aug_sharpen_row_avx2};
#endif
        sharpen_plane(k, im->ch[c], im->px, im->row, src->ch[c], src->row, w, h, alpha, t,
                      line);
    }
    (void)kernel;
}
