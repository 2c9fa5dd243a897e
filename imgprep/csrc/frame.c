/* The loader's frame (see frame.h): region decode into a whole-image buffer, and the pack. */
#include "frame.h"

#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include "jpegdec.h"

static _Thread_local Scratch last_row;  /* the last row of a whole decode (outside the region) */

int frame_decode(const unsigned char *data, size_t len, unsigned char *frame, size_t frame_len,
                 int scale, Rect *r, int whole, long *trailing, JpegErr *err) {
    struct jpeg_decompress_struct cinfo;
    Budget budget;
    JpegHeader h;
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return err->refused ? FRAME_REFUSED : FRAME_FAILED;
    }
    jpegdec_open(&cinfo, err, &budget, data, len, 0, &h);
    budget_header(&cinfo, len);
    if (!colour_to_rgb(h.colour)) {
        snprintf(err->message, JMSG_LENGTH_MAX, "a %d-component JPEG libjpeg makes no RGB of",
                 h.components);
        jpeg_destroy_decompress(&cinfo);
        return FRAME_COLOUR;
    }
    unsigned w, hh;
    jpegdec_scale(&cinfo, scale, &w, &hh);
    size_t need;
    if (__builtin_mul_overflow((size_t)w, (size_t)hh, &need) ||
        __builtin_mul_overflow(need, (size_t)4, &need) || need > frame_len) {
        snprintf(err->message, JMSG_LENGTH_MAX, "the frame holds %zu bytes, the %ux%u image "
                 "needs 4 a pixel", frame_len, w, hh);
        jpeg_destroy_decompress(&cinfo);
        return FRAME_FAILED;
    }
    Rect got;
    jpegdec_start(&cinfo, *r, &got);
    jpegdec_rows(&cinfo, &got, frame + ((size_t)got.y0 * w + got.x0) * 4, (size_t)w * 4);
    if (whole)
        *trailing = jpegdec_to_end(&cinfo, &last_row);
    else
        jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    *r = got;
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

