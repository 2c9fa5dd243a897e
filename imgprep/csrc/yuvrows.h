/* A YUV 4:2:0 stored-pixel record (imgprep/csrc/rawformat.h) as a source of the resampler
 * whose rows are made on demand (resample.h, rs_rows): each row the horizontal pass asks for
 * is made from the Y row and the two chroma rows it needs, for the part's columns only, as
 * libjpeg-turbo makes a full-scale decode's rows from the same planes: its "fancy" (triangle)
 * h2v2 chroma upsampling and its YCbCr -> RGB conversion, in the same integer arithmetic, so
 * the pixels are a libjpeg-turbo decode's of the JPEG the planes came from
 * (tests/loaders/test_rawstore_pixels.py holds them to it). Portable C loops (which the
 * compiler vectorises for the baseline CPU), and AVX2 ones where the CPU has it: the column
 * sums and the upsampling in 16-bit lanes, the conversion with one vpmaddwd a product
 * (yuvrows.c says how it stays exact); integers, so the same bytes either way (checked on
 * every Y, Cb, Cr triple, and row by row on random planes of every width). */
#ifndef IMGPREP_YUVROWS_H
#define IMGPREP_YUVROWS_H

#include <stdint.h>

#include "rawformat.h"
#include "resample.h"
#include "scratch.h"

typedef struct {
    rs_rows base;              /* first: the resampler calls base.row */
    const RawImage *img;       /* a RAW_YUV420 record */
    unsigned x0, y0, width;    /* the part: columns [x0, x0 + width), rows from y0 */
    uint16_t *sum_b, *sum_r;   /* a row's chroma column sums (3 near + 1 far), edges padded */
    uint8_t *up_b, *up_r;      /* a row's upsampled chroma, from column x0 & ~1 */
} YuvRows;

/* Sets ``s`` up to make rows of the part at (x0, y0), ``width`` columns wide, of ``img``,
 * its buffers in ``mem``, with the loop of the resampler's ``kernel`` (RS_PORTABLE: the
 * portable one; else the AVX2 one where the CPU has it: the same bytes, checked on every
 * (Y, Cb, Cr) triple); 0, or -1 when memory is short. */
int yuv_rows_init(YuvRows *s, const RawImage *img, unsigned x0, unsigned y0, unsigned width,
                  int64_t kernel, Scratch *mem);

#endif
