/* Per-sample augmentation: a list of ops carried out in place on one 8-bit RGB image, three
 * planes (3 x H x W) or rows of pixels (H x W x 3), each op equal byte for byte to stock
 * Pillow 13.0.0's own call on an RGB image (imgprep/augment.py names them; docs/augment.md
 * defines each). The arithmetic is Pillow's, ported: libImaging/Blend.c, Filter.c, Convert.c,
 * Point.c and Geometry.c, and the lookup tables of PIL/ImageOps.py and ImageEnhance.py.
 *
 * The op codes, filter numbers and limits below are the module's AUG_* constants
 * (imgprep/_jpegcrop.c), which imgprep/augment.py reads. Plain C: run it without the GIL. */
#ifndef IMGPREP_AUGMENT_H
#define IMGPREP_AUGMENT_H

#include <stddef.h>
#include <stdint.h>

/* The ops, and their arguments (AugOp.args):
 *   IDENTITY, AUTOCONTRAST, EQUALIZE, INVERT: none
 *   AFFINE: a, b, c, d, e, f: output pixel (x, y) samples the input at
 *           (a x + b y + c, d x + e y + f), pixel centres at +0.5 (Image.transform, AFFINE)
 *   BRIGHTNESS, COLOR, CONTRAST, SHARPNESS: the factor (ImageEnhance.<X>(im).enhance(f))
 *   POSTERIZE: bits, an integer 0..8;  SOLARIZE: the threshold
 *   SOLARIZE_ADD: add, threshold (timm's: p + add, at most 255, where p < threshold) */
enum {
    AUG_OP_IDENTITY = 0, AUG_OP_AFFINE = 1, AUG_OP_BRIGHTNESS = 2, AUG_OP_COLOR = 3,
    AUG_OP_CONTRAST = 4, AUG_OP_SHARPNESS = 5, AUG_OP_POSTERIZE = 6, AUG_OP_SOLARIZE = 7,
    AUG_OP_SOLARIZE_ADD = 8, AUG_OP_AUTOCONTRAST = 9, AUG_OP_EQUALIZE = 10,
    AUG_OP_INVERT = 11,
    AUG_OP_KINDS
};

/* AFFINE's resampling filters, Pillow's numbers (Image.Resampling) */
enum { AUG_NEAREST = 0, AUG_BILINEAR = 2, AUG_BICUBIC = 3 };

enum {
    AUG_MAX_OPS = 64,            /* ops in one call */
    AUG_MAX_ARGS = 6,            /* arguments of one op */
    AUG_MAX_ARG = 1000000000,    /* |an argument| at most: every sum stays finite and exact
                                  * enough that no NaN or infinity reaches a pixel */
};

/* The kernels: AUG_KERNEL_AUTO is the best this CPU runs (AVX2 where it has it, found at run
 * time). Every kernel gives the same bytes: the SIMD ones make each value with the same IEEE
 * operations in the same order as the portable C, lane by lane. */
enum { AUG_KERNEL_AUTO = -1, AUG_KERNEL_PORTABLE = 0, AUG_KERNEL_AVX2 = 1, AUG_KERNELS = 2 };

/* aug_run's answers */
enum { AUG_OK = 0, AUG_INVALID = 1, AUG_ENOMEM = 2 };
enum { AUG_MESSAGE = 200 };

typedef struct {
    int kind;                    /* AUG_OP_* */
    int nargs;
    double args[AUG_MAX_ARGS];
    int resample;                /* AFFINE: AUG_NEAREST, AUG_BILINEAR or AUG_BICUBIC */
    int fill[3];                 /* AFFINE: the colour where the source has no pixel, 0..255 */
} AugOp;

typedef struct {
    uint8_t *pixels;             /* planar: 3 x height x width; else height x width x 3 */
    size_t len;                  /* the bytes at pixels: exactly 3 x width x height */
    int64_t width, height;       /* 1..MAX_SIDE (imgprep/csrc/bounds.h) */
    int planar;
    int kernel;                  /* AUG_KERNEL_AUTO, or one aug_resolve_kernel accepts */
} AugImage;

/* Carries ``ops`` (``n`` of them) out in order on ``im``, in place, with the kernel
 * ``im->kernel``. Everything is checked before a byte is touched: AUG_INVALID with the reason
 * in ``msg``. Scratch: one copy of the image with a border of two pixels (affine and
 * sharpness read their source from it) and two rows of offsets, the thread's, kept between
 * calls up to SCRATCH_KEEP (aug_trim), had before a byte is touched too (AUG_ENOMEM when it
 * cannot be). */
int aug_run(const AugImage *im, const AugOp *ops, size_t n, char *msg, size_t msg_len);

/* Gives back the calling thread's scratch where an image grew it past SCRATCH_KEEP. */
void aug_trim(void);

/* The kernel ``requested`` runs as on this CPU (AUG_KERNEL_AUTO: the best one), or -1 when
 * the CPU lacks it or it is not a kernel. */
int aug_resolve_kernel(int64_t requested);

/* "portable", "avx2", or NULL for anything else. */
const char *aug_kernel_name(int kernel);

#endif
