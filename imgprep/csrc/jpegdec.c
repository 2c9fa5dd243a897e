/* The extension's libjpeg sequences (see jpegdec.h), over libjpeg-turbo's partial
 * decompression: jpeg_crop_scanline, jpeg_skip_scanlines, and stopping after the last row
 * needed. */
#include "jpegdec.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>

#include "crop_fix.h"

enum { ROWS_AT_ONCE = 16, XMP_HEAD = 29, MIN_COLUMNS = 8 };
static const char MPF[4] = {'M', 'P', 'F', 0};
static const char EXIF[6] = {'E', 'x', 'i', 'f', 0, 0};
static const char XMP[XMP_HEAD] = "http://ns.adobe.com/xap/1.0/";  /* and its NUL */

static int is_app1(jpeg_saved_marker_ptr m, const char *head, size_t n) {
    return m->marker == JPEG_APP0 + 1 && m->data_length >= n && memcmp(m->data, head, n) == 0;
}

/* The EXIF orientation of the Exif APP1 segments, joined as Pillow joins them (the first
 * whole, the others without their header), or -1. */
static int exif_of(j_decompress_ptr cinfo) {
    size_t total = 0;
    int count = 0;
    jpeg_saved_marker_ptr first = NULL;
    for (jpeg_saved_marker_ptr m = cinfo->marker_list; m != NULL; m = m->next) {
        if (!is_app1(m, EXIF, sizeof EXIF)) continue;
        if (first == NULL) first = m;
        total += count++ ? m->data_length - sizeof EXIF : m->data_length;
    }
    if (count < 2) return first ? exif_orientation(first->data, first->data_length) : -1;
    unsigned char *joined = malloc(total), *at = joined;
    if (joined == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 11);
    for (jpeg_saved_marker_ptr m = cinfo->marker_list; m != NULL; m = m->next) {
        if (!is_app1(m, EXIF, sizeof EXIF)) continue;
        size_t skip = at == joined ? 0 : sizeof EXIF;
        memcpy(at, m->data + skip, m->data_length - skip);
        at += m->data_length - skip;
    }
    int orientation = exif_orientation(joined, total);
    free(joined);
    return orientation;
}

/* Pillow's reading: the EXIF tag when there is one (none, and no XMP either, when it cannot
 * read the Exif payload's TIFF header), else the last XMP packet's. */
static int orientation_of(j_decompress_ptr cinfo) {
    int o = exif_of(cinfo);
    if (o >= 0) return o;
    jpeg_saved_marker_ptr xmp = NULL;
    for (jpeg_saved_marker_ptr m = cinfo->marker_list; m != NULL; m = m->next)
        if (is_app1(m, XMP, XMP_HEAD)) xmp = m;
    if (xmp != NULL) o = xmp_orientation(xmp->data + XMP_HEAD, xmp->data_length - XMP_HEAD);
    return o >= 0 ? o : 1;
}

static int colour_of(int components, J_COLOR_SPACE cs) {
    if (components == 1 && cs == JCS_GRAYSCALE) return COLOUR_GRAY;
    if (components == 3 && cs == JCS_YCbCr) return COLOUR_YCC;
    if (components == 3 && cs == JCS_RGB) return COLOUR_RGB;
    return COLOUR_OTHER;
}

void jpegdec_open(j_decompress_ptr cinfo, JpegErr *err, Budget *budget,
                  const unsigned char *data, size_t len, int orientation, JpegHeader *h) {
    memset(cinfo, 0, sizeof *cinfo);  /* destroying it is safe whatever create reached */
    jerr_init(&cinfo->err, err);
    jpeg_create_decompress(cinfo);
    budget_attach(cinfo, budget);
    jpeg_mem_src(cinfo, data, (unsigned long)len);
    jpeg_save_markers(cinfo, JPEG_APP0 + 2, sizeof MPF);  /* its head only */
    if (orientation) jpeg_save_markers(cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(cinfo, TRUE);
    h->width = cinfo->image_width;
    h->height = cinfo->image_height;
    h->components = cinfo->num_components;
    h->colour = colour_of(cinfo->num_components, cinfo->jpeg_color_space);
    h->multi_scan = jpeg_has_multiple_scans(cinfo);
    h->arithmetic = cinfo->arith_code;
    h->progressive = cinfo->progressive_mode;
    h->mpf = 0;
    for (jpeg_saved_marker_ptr m = cinfo->marker_list; m != NULL; m = m->next)
        if (m->marker == JPEG_APP0 + 2 && m->data_length >= sizeof MPF &&
            memcmp(m->data, MPF, sizeof MPF) == 0)
            h->mpf = 1;
    h->orientation = orientation ? orientation_of(cinfo) : 1;
}

void jpegdec_scale(j_decompress_ptr cinfo, int scale, unsigned *width, unsigned *height) {
    cinfo->out_color_space = JCS_EXT_RGBX;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)scale;
    cinfo->dct_method = JDCT_ISLOW;
    jpeg_calc_output_dimensions(cinfo);
    *width = cinfo->output_width;
    *height = cinfo->output_height;
}

void jpegdec_start(j_decompress_ptr cinfo, Rect want, Rect *got) {
    jpeg_start_decompress(cinfo);
    JDIMENSION w = cinfo->output_width, h = cinfo->output_height;
    JDIMENSION left = want.x0 > 0 ? want.x0 - 1 : 0;
    JDIMENSION right = want.x1 < w ? want.x1 + 1 : w;
    JDIMENSION top = want.y0 < h ? want.y0 : h, bottom = want.y1 < h ? want.y1 : h;
    if (left >= right || top >= bottom) ERREXIT(cinfo, JERR_BAD_CROP_SPEC);
    if (right - left < MIN_COLUMNS) {  /* libjpeg-turbo's upsampling of a sliver differs */
        right = left + MIN_COLUMNS < w ? left + MIN_COLUMNS : w;
        left = right > MIN_COLUMNS ? right - MIN_COLUMNS : 0;
    }
    JDIMENSION width = right - left;
    if (left > 0 || right < w) {
        if (crop_columns_exact(cinfo)) jpeg_crop_scanline(cinfo, &left, &width);
        else left = 0, width = w;
    }
    if (top > 0) jpeg_skip_scanlines(cinfo, top);
    *got = (Rect){left, top, left + width, bottom};
}

void jpegdec_rows(j_decompress_ptr cinfo, const Rect *got, unsigned char *dst, size_t stride) {
    JSAMPROW rows[ROWS_AT_ONCE];
    while (cinfo->output_scanline < got->y1) {
        JDIMENSION n = got->y1 - cinfo->output_scanline;
        if (n > ROWS_AT_ONCE) n = ROWS_AT_ONCE;
        for (JDIMENSION i = 0; i < n; i++)
            rows[i] = dst + (size_t)(cinfo->output_scanline - got->y0 + i) * stride;
        jpeg_read_scanlines(cinfo, rows, n);
    }
}

long jpegdec_coefficients(j_decompress_ptr cinfo) {
    jpeg_read_coefficients(cinfo);
    jpeg_finish_decompress(cinfo);
    return (long)cinfo->src->bytes_in_buffer;
}

long jpegdec_to_end(j_decompress_ptr cinfo, Scratch *row) {
    JDIMENSION h = cinfo->output_height;
    /* Skipping to the very end would count the rows read without reading them: skip to the
     * last row, make it, then read on to EOI. */
    if (cinfo->output_scanline + 1 < h)
        jpeg_skip_scanlines(cinfo, h - 1 - cinfo->output_scanline);
    if (cinfo->output_scanline < h) {
        JSAMPROW last = scratch_reserve(row, (size_t)cinfo->output_width * 4);
        if (last == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 13);
        jpeg_read_scanlines(cinfo, &last, 1);
    }
    jpeg_finish_decompress(cinfo);
    return (long)cinfo->src->bytes_in_buffer;
}
