/* A stored-pixel record made from a JPEG (see rawstore.h). */
#include "rawstore.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jerror.h>

#include "jpegdec.h"
#include "rawformat.h"

static _Thread_local Scratch record_mem, rows_mem;

/* Whether the JPEG is YCbCr with 2x2 luma and 1x1 chroma sampling: what YUV 4:2:0 stores. */
static int is_420(j_decompress_ptr cinfo) {
    const jpeg_component_info *c = cinfo->comp_info;
    return cinfo->num_components == 3 && cinfo->jpeg_color_space == JCS_YCbCr &&
           c[0].h_samp_factor == 2 && c[0].v_samp_factor == 2 && c[1].h_samp_factor == 1 &&
           c[1].v_samp_factor == 1 && c[2].h_samp_factor == 1 && c[2].v_samp_factor == 1;
}

/* The planes by libjpeg's raw-data decode, an iMCU row (16 luma rows) at a time into row
 * buffers of the padded width, the image's own rows and columns copied into ``dst``. */
static void yuv_planes(j_decompress_ptr cinfo, unsigned char *dst) {
    cinfo->raw_data_out = TRUE;
    cinfo->dct_method = JDCT_ISLOW;
    jpeg_start_decompress(cinfo);
    const unsigned w = cinfo->image_width, h = cinfo->image_height;
    const unsigned cw = (w + 1) / 2, ch = (h + 1) / 2;
    size_t pad[3];
    for (int c = 0; c < 3; c++)
        pad[c] = (size_t)cinfo->comp_info[c].width_in_blocks * DCTSIZE;
    unsigned char *b = scratch_reserve(&rows_mem, 16 * pad[0] + 8 * (pad[1] + pad[2]));
    if (b == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 21);
    JSAMPROW y_rows[16], cb_rows[8], cr_rows[8];
    for (int i = 0; i < 16; i++) y_rows[i] = b + (size_t)i * pad[0];
    for (int i = 0; i < 8; i++) {
        cb_rows[i] = b + 16 * pad[0] + (size_t)i * pad[1];
        cr_rows[i] = b + 16 * pad[0] + 8 * pad[1] + (size_t)i * pad[2];
    }
    JSAMPARRAY planes[3] = {y_rows, cb_rows, cr_rows};
    unsigned char *ys = dst, *cbs = dst + (size_t)w * h, *crs = cbs + (size_t)cw * ch;
    for (unsigned row = 0; row < h; row += 16) {
        jpeg_read_raw_data(cinfo, planes, 16);
        for (unsigned i = 0; i < 16 && row + i < h; i++)
            memcpy(ys + (size_t)(row + i) * w, y_rows[i], w);
        for (unsigned i = 0; i < 8 && row / 2 + i < ch; i++) {
            memcpy(cbs + (size_t)(row / 2 + i) * cw, cb_rows[i], cw);
            memcpy(crs + (size_t)(row / 2 + i) * cw, cr_rows[i], cw);
        }
    }
}

/* The full-scale RGB decode (the loader's JPEG path's pixels at DCT scale 1), in rows. */
static void rgb_rows(j_decompress_ptr cinfo, unsigned char *dst) {
    unsigned w, h;
    jpegdec_scale(cinfo, 1, &w, &h);
    cinfo->out_color_space = JCS_RGB;
    jpeg_start_decompress(cinfo);
    while (cinfo->output_scanline < cinfo->output_height) {
        JSAMPROW row = dst + (size_t)cinfo->output_scanline * w * 3;
        jpeg_read_scanlines(cinfo, &row, 1);
    }
}

int raw_store(const unsigned char *data, size_t len, int mode, uint64_t max_pixels,
              RawStored *r) {
    memset(r, 0, sizeof *r);
    struct jpeg_decompress_struct cinfo;
    JpegErr err;
    Budget budget;
    JpegHeader h;
    if (mode != RAW_RGB24 && mode != RAW_YUV420)
        return r->status = fail_with(SAMPLE_FAILED, r->message, SAMPLE_MESSAGE,
                                     "no stored-pixel mode %d", mode);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        int code = err.refused ? SAMPLE_REFUSED : SAMPLE_FAILED;
        return r->status = fail_with(code, r->message, SAMPLE_MESSAGE, "%s", err.message);
    }
    jpegdec_open(&cinfo, &err, &budget, data, len, 0, &h);
    budget_header(&cinfo, len);
    if (max_pixels && (uint64_t)h.width * h.height > max_pixels)
        jerr_refuse((j_common_ptr)&cinfo, "%ux%u is over the limit of %llu pixels", h.width,
                    h.height, (unsigned long long)max_pixels);
    if (!colour_to_rgb(h.colour))
        jerr_refuse((j_common_ptr)&cinfo, "a %d-component JPEG libjpeg makes no RGB of",
                    h.components);
    r->mode = mode == RAW_YUV420 && is_420(&cinfo) ? RAW_YUV420 : RAW_RGB24;
    size_t size = raw_record_size(r->mode, h.width, h.height);
    unsigned char *rec = size ? scratch_reserve(&record_mem, size) : NULL;
    if (rec == NULL) ERREXIT1(&cinfo, JERR_OUT_OF_MEMORY, 22);
    raw_header(rec, r->mode, h.width, h.height);
    if (r->mode == RAW_YUV420)
        yuv_planes(&cinfo, rec + RAW_HEADER);
    else
        rgb_rows(&cinfo, rec + RAW_HEADER);
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    if (err.warnings)
        return r->status = fail_with(SAMPLE_FAILED, r->message, SAMPLE_MESSAGE,
                                     "the JPEG is damaged (libjpeg: %s)", err.first);
    r->width = h.width, r->height = h.height;
    r->record = rec, r->len = size;
    return r->status = SAMPLE_DONE;
}

void raw_store_trim(void) {
    scratch_trim(&record_mem, SCRATCH_KEEP);
    scratch_trim(&rows_mem, SCRATCH_KEEP);
}
