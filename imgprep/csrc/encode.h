/* JPEG encoding through libjpeg-turbo: what convert writes for every image. */
#ifndef IMGPREP_ENCODE_H
#define IMGPREP_ENCODE_H

#include <stddef.h>

/* A growing output buffer (malloc'd; free ``data`` when done). */
typedef struct {
    unsigned char *data;
    size_t len, cap;
} OutBuf;

/* Encodes ``width`` x ``height`` pixels of ``channels`` bytes each (3: RGB, 4: RGBX), rows
 * ``stride`` bytes apart, as a baseline JFIF JPEG: YCbCr 4:2:0, libjpeg's quality scaling of
 * the standard tables at ``quality`` (1..100, baseline-clamped), ISLOW DCT, standard Huffman
 * tables, and no marker but APP0 (JFIF 1.01, density 1:1). ``sampling``: NULL, or each
 * component's horizontal and vertical sampling factors (Y, Cb, Cr; 1..4 each) in place of
 * 4:2:0 (what some cameras write: a test's input). ``out`` is reused and grown as needed;
 * ``out->len`` is set. Returns 0, or -1 with libjpeg's message in ``message``
 * (JMSG_LENGTH_MAX bytes). Touches no Python object: run it without the GIL. */
int encode_jpeg(const unsigned char *pixels, unsigned width, unsigned height, size_t stride,
                int channels, int quality, const int sampling[6], OutBuf *out, char *message);

#endif
