/* A JPEG's headers read, and whether the loader's fast path takes it: a sequential YCbCr or
 * grayscale JPEG whose bytes after the start of scan hold only entropy-coded data, restart
 * markers and the final EOI, so that stopping early cannot hide an error a full decode would
 * raise; with ``check``, every scan's coefficients read to the end under the budget (no
 * pixels; any colour space, progressive too). Plain C: run it without the GIL. */
#ifndef IMGPREP_PROBE_H
#define IMGPREP_PROBE_H

#include <stddef.h>

#include "jerr.h"

/* ProbeResult.code: why the fast path declines (0: it takes it) */
enum { PROBE_FAST = 0, PROBE_PROGRESSIVE = 1, PROBE_COLOR = 2, PROBE_TAIL = 3,
       PROBE_BROKEN = 4 };

typedef struct {
    long width, height;  /* as the header says (0 when it could not be read) */
    int code;            /* PROBE_* */
    int failed;          /* libjpeg failed, or the budget refused it (err.refused) */
    long trailing;       /* with check: the bytes after the EOI marker */
    JpegErr err;         /* what reading found (warnings, the error's message) */
} ProbeResult;

void probe_jpeg(const unsigned char *data, size_t len, int check, ProbeResult *r);

#endif
