/* What the augmentation's files share (imgprep/csrc/augment.h is the interface): a view of an
 * image's three channels that serves both layouts, and the ops' kernels, colour
 * (aug_colour.c) and geometry (aug_geometry.c). */
#ifndef IMGPREP_AUG_IMPL_H
#define IMGPREP_AUG_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* An image's channels: channel c's pixel (x, y) is ch[c][y * row + x * px]. Planar: three
 * planes, px 1; rows of pixels: px 3. */
typedef struct {
    uint8_t *ch[3];
    ptrdiff_t px, row;
    int w, h;
} Planes;

static inline Planes planes_of(uint8_t *base, int w, int h, int planar) {
    size_t plane = (size_t)w * (size_t)h;
    Planes p = {
        .ch = {base, planar ? base + plane : base + 1, planar ? base + 2 * plane : base + 2},
        .px = planar ? 1 : 3, .row = planar ? w : (ptrdiff_t)w * 3, .w = w, .h = h,
    };
    return p;
}

/* The source copy's border: two pixels on every side, each a copy of the nearest edge pixel
 * (aug_pad), so that the interpolations' clamped neighbours (bicubic: two either side) are
 * plain reads. */
enum { AUG_PAD = 2 };

/* The planar copy of a ``w`` x ``h`` image at ``base``, inside its border: what
 * aug_copy_bytes(w, h) bytes hold (16 bytes to spare after the last plane: a four-byte read
 * at the border's last pixel stays inside). */
static inline size_t aug_copy_bytes(int w, int h) {
    return (size_t)(w + 2 * AUG_PAD) * (size_t)(h + 2 * AUG_PAD) * 3 + 16;
}

static inline Planes padded_planes(uint8_t *base, int w, int h) {
    const ptrdiff_t row = w + 2 * AUG_PAD, plane = row * (h + 2 * AUG_PAD),
                    origin = AUG_PAD * row + AUG_PAD;
    Planes p = {
        .ch = {base + origin, base + plane + origin, base + 2 * plane + origin},
        .px = 1, .row = row, .w = w, .h = h,
    };
    return p;
}

/* The kernels' code: x86-64 builds carry AVX2 versions (aug_avx2.c; AUG_AVX2: a function
 * compiled for AVX2, run only where the CPU has it), written with intrinsics that make each
 * lane's value with the portable code's operations in its order. No fused multiply-add:
 * setup.py's -ffp-contract=off, and the target is "avx2" alone. */
#if defined(__x86_64__) && defined(__GNUC__)
#define AUG_X86 1
#define AUG_AVX2 __attribute__((target("avx2")))
#endif

/* A lookup table for each channel. */
typedef uint8_t Lut[3][256];

/* Pillow's float blend of two 8-bit values (libImaging/Blend.c: in1 + alpha * (in2 - in1) in
 * float, then clipped and truncated), where ``a`` is the degenerate image's value. The clip
 * is written as two selects, which the compiler vectorises: the same bytes as Pillow's
 * branches (t <= 0 gives 0 either way, t >= 255 gives 255). */
static inline uint8_t blend8(int a, int b, float alpha) {
    float t = (float)a + alpha * (float)(b - a);
    t = t < 0.0f ? 0.0f : t;
    t = t > 255.0f ? 255.0f : t;
    return (uint8_t)(int)t;
}

/* libImaging/Convert.c's L24: ITU-R 601-2 luma in 16-bit fixed point. */
static inline int luma(int r, int g, int b) {
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16;
}

/* ImageFilter.SMOOTH's weights, Pillow's kernel (1 1 1 / 1 5 1 / 1 1 1) over 13 in float. */
#define AUG_K1 (1.0f / 13.0f)
#define AUG_K5 (5.0f / 13.0f)

/* --- aug_colour.c: lookup tables and the per-pixel colour ops --- */

/* ImageOps.posterize (bits 0..8), solarize, ImageOps.invert, timm's solarize_add */
void aug_lut_posterize(uint8_t t[256], int bits);
void aug_lut_solarize(uint8_t t[256], double threshold);
void aug_lut_solarize_add(uint8_t t[256], double add, double threshold);
void aug_lut_invert(uint8_t t[256]);
/* Blending every value against the constant ``degenerate`` (Brightness: 0; Contrast: the
 * grayscale mean) by ``alpha``. */
void aug_lut_blend(uint8_t t[256], int degenerate, float alpha);
/* ImageOps.autocontrast (no cutoff) and ImageOps.equalize of one channel's histogram. */
void aug_lut_autocontrast(uint8_t t[256], const uint64_t hist[256]);
void aug_lut_equalize(uint8_t t[256], const uint64_t hist[256]);

/* Each channel's histogram of ``im`` as ``lut`` maps it (NULL: as it is). */
void aug_histogram(const Planes *im, const Lut lut, uint64_t hist[3][256]);
/* Each channel's lowest and highest levels in ``im``, as a histogram that counts those two
 * once each (one level: once) and nothing else: a pass of minima and maxima. */
void aug_extremes(const Planes *im, uint64_t hist[3][256]);
/* ImageEnhance.Contrast's degenerate value: the mean of the grayscale ("L") image of ``im``
 * as ``lut`` maps it (NULL: as it is), rounded as Pillow rounds it. */
int aug_gray_mean(const Planes *im, const Lut lut);
/* ``dst`` = ``lut`` of ``src`` (NULL: a copy); the same size, either layout each (the same
 * image too, in place). */
void aug_apply_lut(const Planes *dst, const Planes *src, const Lut lut, int kernel);
/* ImageEnhance.Color: each pixel blended with its grayscale value, in place; planar. */
void aug_color(const Planes *im, float alpha, int kernel);
/* ImageEnhance.Sharpness: ``im`` = ``src`` blended with ImageFilter.SMOOTH of ``src``;
 * ``src`` planar: a copy, or ``im`` itself (then planar too: made in place, each row's bytes
 * kept before they are written, the rows below read before); ``rows``: scratch for three
 * rows of floats and one of bytes (13 x ``im->w`` bytes, float-aligned). */
void aug_sharpness(const Planes *im, const Planes *src, float alpha, void *rows, int kernel);

/* --- aug_geometry.c: Image.transform(size, AFFINE, a, resample, fillcolor=fill) --- */

/* ``out`` (the same size as ``src``, either layout) from ``src`` (the padded planar copy,
 * its border filled here where the filter reads it, or written over); ``rows``: scratch for
 * 2 x ``out->w`` offsets and 64 bytes more (augment.c's, for the larger side). */
void aug_affine(const Planes *out, const Planes *src, const double a[6], int resample,
                const int fill[3], ptrdiff_t *rows, int kernel);
/* The border of the padded copy ``src``: each border pixel the nearest edge pixel's copy. */
void aug_pad(const Planes *src);
/* aug_affine's nearest where the matrix moves the image by whole rows and columns (a = e = 1,
 * b = d = 0: translations): each output row fill or one run of one source row (as the
 * column and row tables of ImagingScaleAffine make them), moved within ``im`` itself, rows
 * in an order that reads each source row before it is written over; no copy. 0 (``im``
 * untouched) where the matrix is no such move or no such order exists. Scratch: ``cols``
 * for ``im->w`` columns, ``rows`` for ``im->h`` rows. */
int aug_shift(const Planes *im, const double a[6], const int fill[3], ptrdiff_t *cols,
              int32_t *rows);

#ifdef AUG_X86
/* --- aug_avx2.c: the kernels written with AVX2 intrinsics --- */

/* ``d`` = ``t`` of ``s``, ``w`` x ``h`` bytes of a plane (rows ``drow`` and ``srow`` bytes
 * apart; ``d`` may be ``s``). */
void aug_lut_plane_avx2(uint8_t *d, ptrdiff_t drow, const uint8_t *s, ptrdiff_t srow, int w,
                        int h, const uint8_t t[256]);
/* aug_color on a planar ``im``. */
void aug_color_avx2(const Planes *im, float alpha);
/* Sharpness's two row kernels (aug_colour.c's triple and sharpen_row, which its
 * sharpen_plane runs over a channel), eight pixels a step; rows at least
 * AUG_SHARPEN_MIN_AVX2 wide. */
enum { AUG_SHARPEN_MIN_AVX2 = 10 };
void aug_sharpen_triple_avx2(float *t, const uint8_t *r, int w);
void aug_sharpen_row_avx2(uint8_t *out, const uint8_t *mid, const float *below,
                          const float *above, int w, float alpha);
/* aug_affine's nearest in 16.16 fixed point where no row is a run (aug_geometry.c's
 * nearest_fixed: a rotation, a vertical shear): ``f`` its coefficients (a0..a5, a2 and a5
 * at the first pixel's centre), the positions of eight pixels a step wrapping as its uint32
 * steps do. Where the source's offsets fit in 32 bits (aug_nearest_fits_avx2). */
int aug_nearest_fits_avx2(const Planes *src);
void aug_nearest_avx2(const Planes *out, const Planes *src, const uint32_t f[6],
                      const int fill[3]);
/* Row ``y`` of aug_affine's bilinear or bicubic, four output pixels a step, from the padded
 * ``src``; the pixels made (the row's first, a multiple of four). */
int aug_interpolate_row_avx2(const Planes *out, const Planes *src, const double a[6],
                             int resample, const int fill[3], int y);
#endif

#endif
