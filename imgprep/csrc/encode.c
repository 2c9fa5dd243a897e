/* JPEG encoding through libjpeg-turbo (see encode.h). The parameters are those of Pillow's
 * ``save(format="JPEG", quality=q)`` with no other option, so the same pixels give the same
 * bytes as Pillow linked against the same libjpeg-turbo (tests/convert/test_encode.py). */
#include "encode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "jerr.h"

enum { FIRST_CAP = 1 << 16, ROWS_AT_ONCE = 16 };

typedef struct {
    struct jpeg_destination_mgr pub;
    OutBuf *out;
} Dest;

static int reserve(OutBuf *out, size_t cap) {
    if (out->cap >= cap) return 0;
    unsigned char *p = realloc(out->data, cap);
    if (p == NULL) return -1;
    out->data = p;
    out->cap = cap;
    return 0;
}

static void dest_init(j_compress_ptr cinfo) {
    Dest *d = (Dest *)cinfo->dest;
    d->pub.next_output_byte = d->out->data;
    d->pub.free_in_buffer = d->out->cap;
}

/* The buffer is full: double it, keeping what was written. */
static boolean dest_grow(j_compress_ptr cinfo) {
    Dest *d = (Dest *)cinfo->dest;
    size_t used = d->out->cap;
    if (used > SIZE_MAX / 2 || reserve(d->out, used * 2) != 0)
        ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
    d->pub.next_output_byte = d->out->data + used;
    d->pub.free_in_buffer = d->out->cap - used;
    return TRUE;
}

static void dest_term(j_compress_ptr cinfo) {
    Dest *d = (Dest *)cinfo->dest;
    d->out->len = d->out->cap - d->pub.free_in_buffer;
}

static void write_rows(j_compress_ptr cinfo, const unsigned char *pixels, size_t stride) {
    JSAMPROW rows[ROWS_AT_ONCE];
    while (cinfo->next_scanline < cinfo->image_height) {
        JDIMENSION n = cinfo->image_height - cinfo->next_scanline;
        if (n > ROWS_AT_ONCE) n = ROWS_AT_ONCE;
        for (JDIMENSION i = 0; i < n; i++)  /* libjpeg reads the rows, never writes them */
            rows[i] = (JSAMPROW)(uintptr_t)(pixels + (cinfo->next_scanline + i) * stride);
        jpeg_write_scanlines(cinfo, rows, n);
    }
}

int encode_jpeg(const unsigned char *pixels, unsigned width, unsigned height, size_t stride,
                int channels, int quality, const int sampling[6], OutBuf *out, char *message) {
    struct jpeg_compress_struct cinfo;
    JpegErr err;
    Dest dest;
    out->len = 0;
    if (reserve(out, FIRST_CAP) != 0) {
        snprintf(message, JMSG_LENGTH_MAX, "out of memory for the JPEG output");
        return -1;
    }
    memset(&cinfo, 0, sizeof cinfo);  /* destroying it is safe whatever create reached */
    jerr_init(&cinfo.err, &err);
    if (setjmp(err.jump)) {
        jpeg_destroy_compress(&cinfo);
        snprintf(message, JMSG_LENGTH_MAX, "%s", err.message);
        return -1;
    }
    jpeg_create_compress(&cinfo);
    dest.pub.init_destination = dest_init;
    dest.pub.empty_output_buffer = dest_grow;
    dest.pub.term_destination = dest_term;
    dest.out = out;
    cinfo.dest = &dest.pub;
    cinfo.image_width = width;
    cinfo.image_height = height;
    cinfo.input_components = channels;
    cinfo.in_color_space = channels == 4 ? JCS_EXT_RGBX : JCS_RGB;
    jpeg_set_defaults(&cinfo);  /* YCbCr, 4:2:0, JFIF APP0, Huffman tables, ISLOW */
    jpeg_set_quality(&cinfo, quality, TRUE);
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.optimize_coding = FALSE;
    for (int c = 0; sampling != NULL && c < 3; c++) {
        cinfo.comp_info[c].h_samp_factor = sampling[2 * c];
        cinfo.comp_info[c].v_samp_factor = sampling[2 * c + 1];
    }
    jpeg_start_compress(&cinfo, TRUE);
    write_rows(&cinfo, pixels, stride);
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    return 0;
}
