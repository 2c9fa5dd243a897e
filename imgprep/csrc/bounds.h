/* The limits the extension's cores hold their inputs and arguments to, one home each; the
 * module exports them (imgprep/_jpegcrop.c). The per-image budget's are in budget.h, the
 * resampler's in resample.h. */
#ifndef IMGPREP_BOUNDS_H
#define IMGPREP_BOUNDS_H

enum {
    MAX_SIDE = 65500,         /* a JPEG's largest side (libjpeg's JPEG_MAX_DIMENSION) */
    SCRATCH_KEEP = 16 << 20,  /* the scratch a thread keeps from one image to the next */
};

#endif
