/* The loader's frame: a JPEG's rows and iMCU columns that cover a region, decoded at a DCT
 * scale into a buffer of the whole scaled image (RGBX, each pixel at its place), and the one
 * pass that copies a box of such a frame into a batch row (RGB, HWC or CHW, mirrored on
 * request). The pixels of the region are those of a whole decode by the same libjpeg-turbo
 * (imgprep/csrc/jpegdec.h says how that is kept); so a resample of the frame gives the bytes a
 * resample of the whole decoded image gives. Plain C, run without the GIL. */
#ifndef IMGPREP_FRAME_H
#define IMGPREP_FRAME_H

#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

#include "jerr.h"
#include "orient.h"

/* frame_decode's results */
enum { FRAME_OK = 0, FRAME_FAILED = -1, FRAME_COLOUR = 1, FRAME_REFUSED = 2 };

/* Decodes at 1/``scale`` the rows and iMCU columns that cover ``r`` (scaled pixels: x0, y0,
 * x1, y1) into
 * ``frame`` (``frame_len`` bytes: the whole scaled image, 4 bytes a pixel, rows of the scaled
 * width), and sets ``r`` to the region written. ``whole``: read the rest of the data to its
 * end too (the rows below entropy-decoded, the last one written; ``*trailing``: the bytes
 * after EOI). FRAME_OK; FRAME_COLOUR for a colour space libjpeg makes no RGB of (CMYK,
 * YCCK ...); FRAME_FAILED with the reason in err->message; FRAME_REFUSED when the image breaks
 * its budget (imgprep/csrc/budget.h; the reason in err->message). */
int frame_decode(const unsigned char *data, size_t len, unsigned char *frame, size_t frame_len,
                 int scale, Rect *r, int whole, long *trailing, JpegErr *err);

/* Copies ``w`` x ``h`` pixels of 4 bytes at ``src`` (rows ``stride`` bytes apart) into ``out``
 * as RGB: rows of pixels, or three planes when ``planar``; mirrored when ``flip``. */
void frame_pack(const unsigned char *src, size_t stride, size_t w, size_t h,
                unsigned char *out, int flip, int planar);

#endif
