/* The loader's per-sample call for stored pixels (imgprep/csrc/rawformat.h): a record's
 * bytes to a batch row, crop first. The record is parsed and its length checked against its
 * header before any pixel is read; the geometry is checked and planned as the JPEG path's
 * (sample_plan, at DCT scale 1: stored pixels are a full-scale decode, so the draft is not
 * read); then imgprep's resampler reads only the rows and columns the crop's reach covers:
 * RGB24 rows where they lie, YUV 4:2:0 rows made from the planes as the resampler asks for
 * them (yuvrows.h: chroma upsampling and colour conversion fused into the pass, no frame),
 * and writes the window as RGB, HWC or CHW, mirrored on request. Plain C: run it without the
 * GIL. */
#ifndef IMGPREP_RAWSAMPLE_H
#define IMGPREP_RAWSAMPLE_H

#include <stddef.h>

#include "sample.h"

/* Transforms the record ``data`` as ``g`` says into ``out`` (SampleResult as sample_jpeg's:
 * SAMPLE_INVALID for a geometry that is none or does not fit the record's size, which is
 * checked before any byte is read; SAMPLE_FAILED for a record that is not one, with the
 * reason). ``g->draft`` and ``g->whole`` are not read. ``kernel``: the resampler's (and the
 * YUV rows' loop), RS_AUTO for the best this CPU runs; the same bytes whichever. */
int sample_raw(const unsigned char *data, size_t len, const SampleGeometry *g,
               unsigned char *out, size_t out_len, int64_t kernel, SampleResult *r);

/* Gives back the calling thread's scratch where an image grew it past the usual. */
void sample_raw_trim(void);

#endif
