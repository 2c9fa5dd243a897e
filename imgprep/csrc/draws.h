/* A random-resized crop's draws made in C from a numpy Generator's own bit generator, so that
 * they continue its stream exactly as the Python draws (loaders.transforms.crop_box) would:
 * the same doubles, the same bounded integers (numpy's Lemire method over 32-bit outputs),
 * the same libm calls in the same order, and the generator left in the same state. */
#ifndef IMGPREP_DRAWS_H
#define IMGPREP_DRAWS_H

#include <stdint.h>

/* numpy's bitgen_t (numpy/random/bitgen.h), the public C interface of its bit generators,
 * which a BitGenerator's ``capsule`` ("BitGenerator") points at. */
typedef struct {
    void *state;
    uint64_t (*next_uint64)(void *st);
    uint32_t (*next_uint32)(void *st);
    double (*next_double)(void *st);
    uint64_t (*next_raw)(void *st);
} NpBitgen;

typedef struct {
    double scale_lo, scale_hi;  /* of the image's area, 0 < lo <= hi <= 1 */
    double ratio_lo, ratio_hi;  /* width / height, 0 < lo <= hi */
    int flip;                   /* draw a horizontal flip after the box */
} CropSpec;

typedef struct {
    int left, top, right, bottom;
    int flip;
} CropDraw;

enum { CROP_TRIES = 10 };  /* boxes drawn before the centred fallback */

/* ``g``'s next double in [lo, hi): numpy's ``lo + (hi - lo) * next_double``. */
double draw_uniform(NpBitgen *g, double lo, double hi);

/* ``g``'s next integer in [0, n), numpy's ``Generator.integers(0, n)`` (int64) for
 * 1 <= n <= 2^32: no output drawn for n == 1. */
int64_t draw_below(NpBitgen *g, int64_t n);

/* A ``w`` x ``h`` image's crop box (1 <= w, h <= MAX_SIDE) and flip, drawn from ``g``. */
void draw_crop(NpBitgen *g, int w, int h, const CropSpec *spec, CropDraw *out);

#endif
