/* The one home of the extension's libjpeg sequences: a JPEG's headers read (its budget
 * attached, imgprep/csrc/budget.h), its colour classified, and the rows and iMCU columns of a
 * region decoded at a DCT scale (the whole image being the region that covers it), then the
 * rest of the data read to its end; or every scan's coefficients read without pixels.
 * Convert (convert.c), the loader's frame (frame.c) and the probe (probe.c) call these; the
 * calls longjmp to the caller's setjmp on a libjpeg error or a refusal (imgprep/csrc/jerr.h). */
#ifndef IMGPREP_JPEGDEC_H
#define IMGPREP_JPEGDEC_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

#include "budget.h"
#include "jerr.h"
#include "orient.h"
#include "scratch.h"

enum { COLOUR_GRAY, COLOUR_YCC, COLOUR_RGB, COLOUR_OTHER };

/* Whether libjpeg makes RGB of a JPEG of this colour (YCbCr, grayscale, RGB-coded); the others
 * (CMYK, YCCK ...) are Pillow's to decode. */
static inline int colour_to_rgb(int colour) { return colour != COLOUR_OTHER; }

/* Whether a region of a JPEG of this colour decodes to the whole decode's pixels (YCbCr and
 * grayscale: the widened columns keep fancy upsampling's edges out; an RGB-coded JPEG is
 * decoded whole). */
static inline int colour_region_exact(int colour) {
    return colour == COLOUR_YCC || colour == COLOUR_GRAY;
}

typedef struct {
    unsigned width, height;  /* as stored */
    int components;
    int colour;              /* COLOUR_* */
    int multi_scan;          /* progressive or several scans */
    int arithmetic;
    int progressive;
    int mpf;                 /* an APP2 "MPF" segment (a multi-picture file to Pillow) */
    int orientation;         /* EXIF (else XMP) orientation when asked for, else 1 */
} JpegHeader;

/* Pixels decoded at 1/scale: ``width`` x ``height`` pixels of ``channels`` bytes (4: RGBX,
 * 3: RGB) in rows ``stride`` bytes apart, whose top-left pixel is (x, y) of the whole scaled
 * image. */
typedef struct {
    const unsigned char *pixels;
    unsigned x, y, width, height;
    size_t stride;
    int channels;
} Pixels;

/* Makes ``cinfo`` (after the caller's setjmp on ``err->jump``: creating it may fail too),
 * attaches ``budget``, points it at ``data`` and reads the headers into ``h``;
 * ``orientation``: read the EXIF/XMP orientation too. */
void jpegdec_open(j_decompress_ptr cinfo, JpegErr *err, Budget *budget,
                  const unsigned char *data, size_t len, int orientation, JpegHeader *h);

/* Sets the decode to 1/``scale``, RGBX out, and gives the size of the scaled image. */
void jpegdec_scale(j_decompress_ptr cinfo, int scale, unsigned *width, unsigned *height);

/* Starts the decode (after ``jpegdec_scale``) of the rows and iMCU columns that cover
 * ``want`` (scaled pixels), widened by a column each side (fancy upsampling treats a crop's
 * outer columns as the image's edge) and clipped to the image; ``got``: the columns and rows
 * ``jpegdec_rows`` writes, whose pixels in ``want`` are a whole decode's. A region outside
 * the image is libjpeg's JERR_BAD_CROP_SPEC. */
void jpegdec_start(j_decompress_ptr cinfo, Rect want, Rect *got);

/* Decodes the rows of ``got`` into ``dst``: row y at ``dst + (y - got->y0) * stride``, its
 * first pixel column ``got->x0``. */
void jpegdec_rows(j_decompress_ptr cinfo, const Rect *got, unsigned char *dst, size_t stride);

/* After ``jpegdec_rows``: the rest of the data read to its end (the rows below the region
 * entropy-decoded, the last one made into ``row``), so that libjpeg's warnings cover the
 * whole file; returns the bytes after the EOI marker. */
long jpegdec_to_end(j_decompress_ptr cinfo, Scratch *row);

/* After ``jpegdec_open``: every scan's coefficients read to the end, no pixels made; returns
 * the bytes after the EOI marker. */
long jpegdec_coefficients(j_decompress_ptr cinfo);

/* The scaled size of a ``width`` x ``height`` image at 1/``scale``: libjpeg's (and Pillow's
 * draft's) ceiling division. */
static inline unsigned scaled(unsigned side, int scale) {
    return (unsigned)(((unsigned long)side + (unsigned long)scale - 1) / (unsigned long)scale);
}

/* The DCT scale (1, 2, 4 or 8) Pillow's ``draft(mode, (rw, rh))`` picks for a ``w`` x ``h``
 * image: the largest that keeps it at least ``rw`` x ``rh`` (``rw``, ``rh`` >= 1). */
static inline int jpegdec_draft_scale(unsigned w, unsigned h, unsigned rw, unsigned rh) {
    unsigned s = w / rw < h / rh ? w / rw : h / rh;
    return s >= 8 ? 8 : s >= 4 ? 4 : s >= 2 ? 2 : 1;
}

/* The input pixels a resample of [lo, hi) to ``out`` pixels reads with a filter of
 * ``support`` (Pillow's, in input pixels at scale 1): the box widened by the support (times
 * the shrink factor when shrinking), plus a pixel, within [0, limit). */
static inline void jpegdec_reach(double lo, double hi, unsigned out, unsigned limit,
                                 double support, unsigned *a, unsigned *b) {
    double s = support * fmax(1.0, (hi - lo) / out);
    double x0 = floor(lo - s) - 1, x1 = ceil(hi + s) + 1;
    *a = x0 <= 0 ? 0 : (unsigned)x0;
    *b = x1 >= limit ? limit : (unsigned)x1;
}

#endif
