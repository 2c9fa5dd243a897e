/* JPEG decoding for the convert path: what the headers say, and the rows and iMCU columns of
 * a region at a DCT scale (the whole image being the region that covers it). The calls longjmp
 * to the caller's setjmp on a libjpeg error (imgprep/csrc/jerr.h). */
#ifndef IMGPREP_JPEGDEC_H
#define IMGPREP_JPEGDEC_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

#include "orient.h"
#include "scratch.h"

enum { COLOUR_GRAY, COLOUR_YCC, COLOUR_RGB, COLOUR_OTHER };

typedef struct {
    unsigned width, height;  /* as stored */
    int components;
    int colour;              /* COLOUR_*: what libjpeg decodes to RGB (OTHER: CMYK, YCCK ...) */
    int multi_scan;          /* progressive or several scans */
    int arithmetic;
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

/* Points ``cinfo`` (created) at ``data`` and reads the headers into ``h``; ``orientation``:
 * read the EXIF/XMP orientation too. */
void jpegdec_header(j_decompress_ptr cinfo, const unsigned char *data, size_t len,
                    int orientation, JpegHeader *h);

/* Decodes at 1/``scale`` the rows and iMCU columns that cover ``want`` (in scaled pixels)
 * into ``mem``, widened by a column each side (fancy upsampling treats a crop's outer columns
 * as the image's edge); ``out``: the pixels of ``want`` (those of a whole decode). After
 * ``jpegdec_header``. */
void jpegdec_region(j_decompress_ptr cinfo, int scale, Rect want, Scratch *mem, Pixels *out);

/* After ``jpegdec_region``: the rest of the data read to its end (the rows below the region
 * entropy-decoded, the last one made into ``row``), so that libjpeg's warnings cover the
 * whole file; returns the bytes after the EOI marker. */
long jpegdec_to_end(j_decompress_ptr cinfo, Scratch *row);

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
