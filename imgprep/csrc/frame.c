/* The loader's frame (see frame.h): region decode into a whole-image buffer, and the pack. */
#include "frame.h"

#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include "budget.h"
#include "crop_fix.h"

void frame_setup(struct jpeg_decompress_struct *cinfo, JpegErr *err) {
    memset(cinfo, 0, sizeof *cinfo);
    jerr_init(&cinfo->err, err);
    jpeg_create_decompress(cinfo);
}

/* Whether libjpeg makes RGB of this colour space (YCbCr, grayscale, RGB). */
static int rgb_of(J_COLOR_SPACE cs, int components) {
    return (components == 3 && (cs == JCS_YCbCr || cs == JCS_RGB)) ||
           (components == 1 && cs == JCS_GRAYSCALE);
}


int frame_decode(const unsigned char *data, size_t len, unsigned char *frame, size_t frame_len,
                 int scale, FrameRegion *r, int whole, long *trailing, JpegErr *err) {
    struct jpeg_decompress_struct cinfo;
    Budget budget;
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return err->refused ? FRAME_REFUSED : FRAME_FAILED;
    }
    frame_setup(&cinfo, err);
    budget_attach(&cinfo, &budget);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    budget_header(&cinfo, len);
    if (!rgb_of(cinfo.jpeg_color_space, cinfo.num_components)) {
        snprintf(err->message, JMSG_LENGTH_MAX, "a %d-component JPEG libjpeg makes no RGB of",
                 cinfo.num_components);
        jpeg_destroy_decompress(&cinfo);
        return FRAME_COLOUR;
    }
    cinfo.out_color_space = JCS_EXT_RGBX;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)scale;
    jpeg_calc_output_dimensions(&cinfo);
    JDIMENSION w = cinfo.output_width, h = cinfo.output_height;
    size_t need;
    if (__builtin_mul_overflow((size_t)w, (size_t)h, &need) ||
        __builtin_mul_overflow(need, (size_t)4, &need) || need > frame_len) {
        snprintf(err->message, JMSG_LENGTH_MAX, "the frame holds %zu bytes, the %ux%u image "
                 "needs 4 a pixel", frame_len, (unsigned)w, (unsigned)h);
        jpeg_destroy_decompress(&cinfo);
        return FRAME_FAILED;
    }
    /* libjpeg-turbo rounds the columns out to iMCU boundaries, and fancy upsampling treats
     * the cropped columns' outer edges as the image's edges: one more column on each side
     * keeps them out of the region. Skipped rows keep their context (libjpeg reads what
     * the upsampler needs), and rows past ``bottom`` only feed the rows above them. */
    JDIMENSION left = r->left > 0 ? r->left - 1 : 0;
    JDIMENSION right = r->right < w ? r->right + 1 : w;
    JDIMENSION top = r->top, bottom = r->bottom < h ? r->bottom : h;
    if (top >= bottom || left >= right) {
        snprintf(err->message, JMSG_LENGTH_MAX, "the region lies outside the %ux%u image",
                 (unsigned)w, (unsigned)h);
        jpeg_destroy_decompress(&cinfo);
        return FRAME_FAILED;
    }
    jpeg_start_decompress(&cinfo);
    JDIMENSION width = right - left;
    if (left > 0 || right < w) {
        if (crop_columns_exact(&cinfo)) jpeg_crop_scanline(&cinfo, &left, &width);
        else left = 0, width = w;
    }
    if (top > 0) jpeg_skip_scanlines(&cinfo, top);
    while (cinfo.output_scanline < bottom) {
        JSAMPROW row = frame + ((size_t)cinfo.output_scanline * w + left) * 4;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    if (whole) {
        /* Skipping to the very end would mark the data read without reading it: skip to the
         * last row, write it (outside the region: undefined there), then read to EOI. */
        if (cinfo.output_scanline + 1 < h)
            jpeg_skip_scanlines(&cinfo, h - 1 - cinfo.output_scanline);
        while (cinfo.output_scanline < h) {
            JSAMPROW row = frame + ((size_t)cinfo.output_scanline * w + left) * 4;
            jpeg_read_scanlines(&cinfo, &row, 1);
        }
        jpeg_finish_decompress(&cinfo);
        *trailing = (long)cinfo.src->bytes_in_buffer;
    } else {
        jpeg_abort_decompress(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
    r->left = left;
    r->top = top;
    r->right = left + width;
    r->bottom = bottom;
    return FRAME_OK;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
enum { SHIFT_R = 24, SHIFT_G = 16, SHIFT_B = 8 };
#else
enum { SHIFT_R = 0, SHIFT_G = 8, SHIFT_B = 16 };
#endif

void frame_pack(const unsigned char *src, size_t stride, size_t w, size_t h,
                unsigned char *out, int flip, int planar) {
    size_t plane = w * h;
    ptrdiff_t step = flip ? -4 : 4;
    for (size_t y = 0; y < h; y++) {
        const unsigned char *p = src + y * stride + (flip ? (w - 1) * 4 : 0);
        uint32_t v;
        if (planar) {
            unsigned char *r = out + y * w, *g = r + plane, *b = g + plane;
            for (size_t x = 0; x < w; x++, p += step) {
                memcpy(&v, p, 4);  /* one load; the bytes R, G, B, X in memory order */
                r[x] = (unsigned char)(v >> SHIFT_R);
                g[x] = (unsigned char)(v >> SHIFT_G);
                b[x] = (unsigned char)(v >> SHIFT_B);
            }
        } else {
            unsigned char *d = out + y * w * 3;
            for (size_t x = 0; x + 1 < w; x++, p += step, d += 3) {
                memcpy(&v, p, 4);
                memcpy(d, &v, 4);  /* the 4th byte is overwritten by the next pixel */
            }
            memcpy(d, p, 3);
        }
    }
}

