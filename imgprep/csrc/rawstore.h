/* A stored-pixel record (imgprep/csrc/rawformat.h) made from a JPEG: its full-scale decode
 * by the extension's libjpeg-turbo (ISLOW IDCT, as every decode of the extension), as RGB24
 * rows, or as the JPEG's own Y, Cb and Cr planes (libjpeg's raw-data decode) for a YCbCr
 * 4:2:0 JPEG, the form imgprep's encoder writes: nothing is lost that the JPEG holds. A
 * JPEG of other sampling asked for as YUV 4:2:0 is stored as RGB24 (``RawStored.mode``
 * says). Every decode runs under the per-image budget (budget.h), and the data must decode
 * without a warning: a stored JPEG is imgprep's own. Plain C: run it without the GIL. The
 * record lives in the calling thread's scratch until its next call. */
#ifndef IMGPREP_RAWSTORE_H
#define IMGPREP_RAWSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "sample.h"

typedef struct {
    int status;                    /* SAMPLE_DONE, SAMPLE_FAILED or SAMPLE_REFUSED (budget) */
    int mode;                      /* RAW_RGB24 or RAW_YUV420: what was stored */
    unsigned width, height;
    const unsigned char *record;   /* the record, ``len`` bytes */
    size_t len;
    char message[SAMPLE_MESSAGE];  /* why it failed */
} RawStored;

/* The record of ``mode`` (RAW_RGB24 or RAW_YUV420) of the JPEG ``data``; an image of more
 * than ``max_pixels`` pixels fails (0: no limit). */
int raw_store(const unsigned char *data, size_t len, int mode, uint64_t max_pixels,
              RawStored *r);

void raw_store_trim(void);

#endif
