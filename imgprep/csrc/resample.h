/* imgprep's resampler: Pillow's resize, in fixed point, the same bytes on every CPU.
 *
 * rs_resize resizes the region ``box`` (floats, Pillow's ``box``) of an 8-bit RGB or RGBX
 * image to out_width x out_height, as Pillow's ``Image.resize(size, filter, box=box)`` does:
 * a separable two-pass resample (horizontal first, 8-bit between the passes), each output
 * pixel a weighted sum of the input pixels under the filter, the filter's support widened by
 * the shrink factor when shrinking (antialiasing). It writes a window of that resized image
 * (all of it, or the center crop a validation transform keeps) as RGB: rows of pixels (HWC) or
 * three planes (CHW), mirrored left to right on request (a training flip), in one pass.
 *
 * Arithmetic. The weights of an axis are computed in IEEE double from Pillow's formulas with
 * +, -, *, / only (sin and cos are the extension's own polynomials, not the C library's), the
 * box in single precision as Pillow reads it, and the file built with -ffp-contract=off (no
 * fused multiply-add): so they are the same numbers on every machine. They are then rounded
 * to 16-bit integers at the precision pillow-simd picks (the most bits that keep the largest
 * weight below 2^15), and every output byte is clamp((sum_i k_i * p_i + 2^(prec-1)) >> prec,
 * 0, 255) in 32-bit integers that wrap. The kernels (portable C, AVX2, AVX-512) compute that
 * same formula in a different order, and integer sums do not depend on the order: the bytes
 * are the same whichever kernel runs. They equal pillow-simd's resize of the same box (same
 * formula), and differ from stock Pillow's (22-bit weights) by at most a few units.
 *
 * Nearest (filter 0) picks Pillow's source pixel per output pixel, through the same double
 * arithmetic as Pillow's nearest-neighbour scaling.
 */
#ifndef IMGPREP_RESAMPLE_H
#define IMGPREP_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* Filters, numbered as Pillow's Image.Resampling. */
enum { RS_NEAREST = 0, RS_LANCZOS = 1, RS_BILINEAR = 2, RS_BICUBIC = 3, RS_BOX = 4,
       RS_HAMMING = 5 };
/* Kernels: RS_AUTO picks the best one this CPU runs. */
enum { RS_AUTO = -1, RS_PORTABLE = 0, RS_AVX2 = 1, RS_AVX512 = 2, RS_KERNELS = 3 };
/* Results: RS_EINVAL (bad arguments, the message says which) or RS_ENOMEM. */
enum { RS_OK = 0, RS_EINVAL = -1, RS_ENOMEM = -2 };

#define RS_MAX_SIDE ((int64_t)1 << 24)  /* the largest width or height taken, in pixels */

/* A source whose rows are made on demand instead of read from memory (rs_job.make_rows): ``row``
 * writes row ``y`` (0 <= y < the job's height) as the job's width RGBX pixels at ``dst``. A
 * planar source (YUV 4:2:0 stored pixels, imgprep/csrc/yuvrows.h) converts its rows so, one
 * at a time, as the horizontal pass asks for them: no whole frame is made. */
typedef struct rs_rows {
    void (*row)(const struct rs_rows *self, int64_t y, uint8_t *dst);
} rs_rows;

typedef struct {
    const uint8_t *src;        /* the source image: rows of width pixels */
    size_t src_len;            /* bytes readable at src */
    int64_t width, height;     /* source size, pixels */
    int64_t stride;            /* bytes from a row to the next, at least width * channels */
    int64_t channels;          /* bytes a pixel: 3 (RGB) or 4 (RGBX, RGBA: the 4th ignored) */
    double box[4];             /* left, top, right, bottom: 0 <= left <= right <= width ... */
    int64_t out_width, out_height;   /* the size the box is resized to */
    int64_t left, top, cols, rows;   /* the window of the resized image that is written */
    uint8_t *out;              /* rows x cols x 3 (HWC) or 3 x rows x cols bytes (CHW) */
    size_t out_len;            /* exactly rows * cols * 3 */
    int64_t filter;            /* RS_NEAREST ... RS_HAMMING */
    int64_t kernel;            /* RS_AUTO, RS_PORTABLE, RS_AVX2 or RS_AVX512 */
    int planar;                /* CHW instead of HWC */
    int flip;                  /* mirror the window left to right */
    /* Optional: src holds only the part of a larger image at (origin_x, origin_y) of a
     * full_width x full_height image, and box is in that image's coordinates. The weights
     * are those of resampling the whole image (the same bytes as from all of it), and the
     * part must hold every pixel they read. full_width = 0: src is the whole image. */
    int64_t origin_x, origin_y, full_width, full_height;
    /* Optional: the rows are made by ``make_rows`` (channels must be 4; src, src_len and stride
     * are then not read). NULL: they are read at src. */
    const rs_rows *make_rows;
} rs_job;

/* A filter's support in input pixels at scale 1 (Pillow's), widened by the shrink factor
 * when shrinking: how far around its box a resample reads. 0 for RS_NEAREST and for what is
 * no filter. */
double rs_filter_support(int64_t filter);

/* Resize as ``job`` says. Every field is checked first; RS_OK, or an error with a one-line
 * reason in ``message`` (``message_len`` bytes, NUL-terminated). Thread-safe; no global
 * state but the CPU's features, read once. */
int rs_resize(const rs_job *job, char *message, size_t message_len);

/* The kernel that ``requested`` runs as on this CPU (RS_AUTO: the best one), or -1 when the
 * CPU lacks it or it is not a kernel. */
int rs_resolve_kernel(int64_t requested);

/* "portable", "avx2", "avx512", or NULL for anything else. */
const char *rs_kernel_name(int kernel);

#ifdef Py_PYTHON_H
/* The extension's bindings (resample_py.c): resize(...) and resample_kernel(kernel). */
PyObject *rs_py_resize(PyObject *self, PyObject *args);
PyObject *rs_py_kernel(PyObject *self, PyObject *args);
#endif

#endif
