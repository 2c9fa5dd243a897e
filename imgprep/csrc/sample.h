/* The loader's per-sample work in one call: a JPEG's bytes to a batch row. The rows and iMCU
 * columns the transform reads, decoded at the DCT scale Pillow's draft would pick into the
 * thread's frame (imgprep/csrc/frame.h), then the transform's box resampled by imgprep's
 * resampler (imgprep/csrc/resample.h, bilinear: Pillow's filter semantics) and the window the
 * batch keeps written as RGB, rows of pixels or three planes, mirrored on request. The
 * geometry (``SampleGeometry``) is the transform's (loaders/transforms.py ``Geometry``), in
 * the original image's pixels, so the sample's draws stay in Python. Plain C: run it without
 * the GIL. */
#ifndef IMGPREP_SAMPLE_H
#define IMGPREP_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "jerr.h"
#include "orient.h"

/* SampleResult.status; REFUSED: the image broke its budget (imgprep/csrc/budget.h);
 * INVALID: the geometry is not one (a caller's error: checked before any byte is read) */
enum { SAMPLE_DONE = 0, SAMPLE_DECLINED = 1, SAMPLE_FAILED = 2, SAMPLE_REFUSED = 3,
       SAMPLE_INVALID = 4 };
enum { SAMPLE_REGION = 0, SAMPLE_WHOLE = 1 };  /* how a JPEG is decoded (SampleResult.path) */
enum { SAMPLE_MESSAGE = 240 };

typedef struct {
    int64_t width, height;        /* the original, as its header says (> 0) */
    int64_t draft_w, draft_h;     /* the size Pillow's draft is asked for; 0: scale 1 */
    int64_t resize_w, resize_h;   /* what the box is resampled to; 0: nothing resampled */
    int has_box;                  /* box: the region resampled; else the whole image */
    double box[4];                /* left, top, right, bottom, original pixels */
    int64_t crop[4];              /* left, top, right, bottom of the resampled image (of
                                   * the decoded one when nothing is resampled) */
    int flip, planar;
    int whole;                    /* decode the whole image and read the data to its end */
    uint64_t max_pixels;          /* a larger original fails (0: no limit) */
} SampleGeometry;

typedef struct {
    int status;                   /* SAMPLE_DONE; DECLINED: a colour space for Pillow */
    int path;                     /* SAMPLE_REGION or SAMPLE_WHOLE */
    int warnings;                 /* libjpeg's warnings (a whole decode keeps its pixels) */
    Scan scan;                    /* SAMPLE_WHOLE: what reading the data to its end found */
    char message[SAMPLE_MESSAGE]; /* why it failed, was refused or declined */
} SampleResult;

/* What a geometry asks of a source image (sample_plan): the DCT scale (1 for stored
 * pixels, whose geometry has no draft), the decoded (scaled) size, the size of the image the
 * crop is taken from, the box resampled, and the region the resample (or the crop) reads. */
typedef struct {
    int scale;             /* the DCT scale, chosen once */
    unsigned sw, sh;       /* the decoded (scaled) image */
    int64_t cw, ch;        /* the image the crop is taken from: resampled, or decoded */
    double box[4];         /* the resampled box, scaled pixels */
    Rect region;           /* what the resample (or the crop) reads, scaled pixels */
} SamplePlan;

/* ``g`` checked (as sample_jpeg checks it: SAMPLE_INVALID with the reason) and planned into
 * ``p``; SAMPLE_DONE. The one home of the geometry's checks and reach, for the JPEG path
 * and the stored-pixel one (imgprep/csrc/rawsample.h). */
int sample_plan(const SampleGeometry *g, size_t out_len, SamplePlan *p, SampleResult *r);

/* Decodes and transforms the JPEG ``data`` as ``g`` says into ``out``. ``g`` is checked
 * first (every size, box and window inside what it refers to; ``out_len`` exactly the
 * window's 3 bytes a pixel): SAMPLE_INVALID with the reason. The DCT scale is chosen once. A
 * region decode that meets corrupt data, or fails, is redone whole (as Pillow decodes it:
 * warnings keep their pixels; what the whole decode found is in ``r->scan``, for the caller
 * to judge); one that breaks its budget is not. */
int sample_jpeg(const unsigned char *data, size_t len, const SampleGeometry *g,
                unsigned char *out, size_t out_len, SampleResult *r);

/* Gives back the calling thread's frame where an image grew it past the usual. */
void sample_trim(void);

#endif
