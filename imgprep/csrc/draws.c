/* A random-resized crop drawn from a numpy bit generator (see draws.h). Every step is the
 * Python reference's (loaders.transforms.crop_box): doubles as numpy's Generator.random(),
 * bounded integers as its integers() for int64 (numpy/random/src/distributions: a range of
 * at most 32 bits takes Lemire's method over next_uint32, and an empty one draws nothing),
 * Python's round() as nearbyint() (ties to even, the default rounding mode), math.log,
 * math.exp and math.sqrt as the same libm's. Built without FP contraction, so that
 * ``lo + (hi - lo) * u`` is two roundings, as in Python. */
#include "draws.h"

#include <math.h>

double draw_uniform(NpBitgen *g, double lo, double hi) {
    return lo + (hi - lo) * g->next_double(g->state);
}

int64_t draw_below(NpBitgen *g, int64_t n) {
    uint64_t rng = (uint64_t)(n - 1);  /* numpy's inclusive range */
    if (rng == 0) return 0;
    if (rng == 0xFFFFFFFFULL) return (int64_t)g->next_uint32(g->state);
    uint32_t excl = (uint32_t)rng + 1;
    uint64_t m = (uint64_t)g->next_uint32(g->state) * excl;
    uint32_t leftover = (uint32_t)m;
    if (leftover < excl) {
        uint32_t threshold = (UINT32_MAX - (uint32_t)rng) % excl;
        while (leftover < threshold) {
            m = (uint64_t)g->next_uint32(g->state) * excl;
            leftover = (uint32_t)m;
        }
    }
    return (int64_t)(m >> 32);
}

static void centred(int w, int h, int cw, int ch, CropDraw *out) {
    out->left = (w - cw) / 2;
    out->top = (h - ch) / 2;
    out->right = out->left + cw;
    out->bottom = out->top + ch;
}

void draw_crop(NpBitgen *g, int w, int h, const CropSpec *spec, CropDraw *out) {
    double area = (double)w * (double)h;
    double log_lo = log(spec->ratio_lo), log_hi = log(spec->ratio_hi);
    int found = 0;
    for (int i = 0; i < CROP_TRIES && !found; i++) {
        double target = area * draw_uniform(g, spec->scale_lo, spec->scale_hi);
        double aspect = exp(draw_uniform(g, log_lo, log_hi));
        double cw = nearbyint(sqrt(target * aspect));
        double ch = nearbyint(sqrt(target / aspect));
        if (0 < cw && cw <= w && 0 < ch && ch <= h) {
            out->left = (int)draw_below(g, w - (int64_t)cw + 1);
            out->top = (int)draw_below(g, h - (int64_t)ch + 1);
            out->right = out->left + (int)cw;
            out->bottom = out->top + (int)ch;
            found = 1;
        }
    }
    if (!found) {  /* the whole image, clamped to the ratio range, centred */
        double in_ratio = (double)w / (double)h;
        if (in_ratio < spec->ratio_lo)
            centred(w, h, w, (int)nearbyint(w / spec->ratio_lo), out);
        else if (in_ratio > spec->ratio_hi)
            centred(w, h, (int)nearbyint(h * spec->ratio_hi), h, out);
        else
            centred(w, h, w, h, out);
    }
    out->flip = spec->flip && g->next_double(g->state) < 0.5;
}
