/* A JPEG's headers and the fast path's test (see probe.h). */
#include "probe.h"

#include <setjmp.h>
#include <string.h>

#include "jpegdec.h"

/* Whether the bytes from ``p`` to the end are entropy-coded data with restart markers only,
 * then EOI as the last two bytes. */
static int clean_tail(const unsigned char *p, const unsigned char *end) {
    if (end - p < 2 || end[-2] != 0xFF || end[-1] != 0xD9) return 0;
    end -= 2;
    while (p < end) {
        const unsigned char *ff = memchr(p, 0xFF, (size_t)(end - p));
        if (ff == NULL) return 1;
        p = ff + 1;
        while (p < end && *p == 0xFF) p++;  /* fill bytes */
        if (p == end) return 0;
        if (*p != 0x00 && (*p < 0xD0 || *p > 0xD7)) return 0;  /* a marker: not RSTn */
        p++;
    }
    return 1;
}

static int code_of(const JpegHeader *h, j_decompress_ptr cinfo, const unsigned char *end) {
    if (h->progressive || h->arithmetic) return PROBE_PROGRESSIVE;
    if (!colour_region_exact(h->colour)) return PROBE_COLOR;
    if (!clean_tail(cinfo->src->next_input_byte, end)) return PROBE_TAIL;
    return PROBE_FAST;
}

void probe_jpeg(const unsigned char *data, size_t len, int check, ProbeResult *r) {
    struct jpeg_decompress_struct cinfo;
    Budget budget;
    JpegHeader h;
    memset(r, 0, offsetof(ProbeResult, err));
    if (setjmp(r->err.jump)) {
        if (r->code == PROBE_FAST) r->code = PROBE_BROKEN;  /* a declined header keeps its own */
        r->failed = 1;
        jpeg_destroy_decompress(&cinfo);
        return;
    }
    jpegdec_open(&cinfo, &r->err, &budget, data, len, 0, &h);
    r->width = (long)h.width;
    r->height = (long)h.height;
    r->code = code_of(&h, &cinfo, data + len);
    if (check) {
        budget_header(&cinfo, len);
        r->trailing = jpegdec_coefficients(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
}
