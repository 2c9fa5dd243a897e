/* The stored-pixel record: the C home of its layout (imgprep/rawformat.py is the
 * Python one; a test holds the two equal through the constants the module exports).
 *
 * A shard sample whose image is stored as decoded pixels has, instead of ``<key>.jpg``, a
 * ``<key>.yuv420`` or ``<key>.rgb24`` member holding one record, little-endian:
 *
 *     b"IPXL"  u8 version (1)  u8 mode  u16 0  u32 width  u32 height   (16 bytes)
 *     RAW_RGB24:  height rows of width x 3 bytes (R, G, B)
 *     RAW_YUV420: the Y plane (height rows of width bytes), then the Cb and the Cr planes
 *                 (ceil(height / 2) rows of ceil(width / 2) bytes each): the JPEG's own
 *                 components before upsampling, as libjpeg's raw-data decode gives them.
 *
 * A record is whole only when its length is exactly the header's plus the planes' its
 * header declares, so a reader checks the length before any pixel is read: the bytes vouch
 * for the size (1.5 or 3 bytes a pixel), and a forged header cannot make a reader touch or
 * allocate more than the record holds. */
#ifndef IMGPREP_RAWFORMAT_H
#define IMGPREP_RAWFORMAT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "bounds.h"

enum { RAW_HEADER = 16, RAW_VERSION = 1 };
enum { RAW_RGB24 = 1, RAW_YUV420 = 2 };  /* the record's mode byte */
static const unsigned char RAW_MAGIC[4] = {'I', 'P', 'X', 'L'};

/* A parsed record: its mode, size and planes (chroma NULL for RGB24). */
typedef struct {
    int mode;
    unsigned width, height;
    unsigned chroma_width, chroma_height;  /* YUV420's Cb and Cr planes */
    const unsigned char *pixels;           /* RGB24's rows; YUV420's Y plane */
    const unsigned char *cb, *cr;
} RawImage;

/* The bytes of a record of ``mode`` and size (header included); 0 for a mode or size that is
 * none (sides 1..MAX_SIDE). */
static inline size_t raw_record_size(int mode, unsigned width, unsigned height) {
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE) return 0;
    size_t px = (size_t)width * height;
    size_t cw = ((size_t)width + 1) / 2, ch = ((size_t)height + 1) / 2;
    if (mode == RAW_RGB24) return RAW_HEADER + px * 3;
    if (mode == RAW_YUV420) return RAW_HEADER + px + 2 * cw * ch;
    return 0;
}

static inline uint32_t raw_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ``data`` (``len`` bytes) read as a record into ``r``: NULL, or why it is not one. */
static inline const char *raw_parse(const unsigned char *data, size_t len, RawImage *r) {
    memset(r, 0, sizeof *r);
    if (len < RAW_HEADER || memcmp(data, RAW_MAGIC, sizeof RAW_MAGIC) != 0)
        return "not a stored-pixel record (no IPXL header)";
    if (data[4] != RAW_VERSION) return "a stored-pixel record of another version";
    if (data[6] != 0 || data[7] != 0) return "a stored-pixel record with reserved bits set";
    r->mode = data[5];
    uint32_t w = raw_u32(data + 8), h = raw_u32(data + 12);
    size_t want = w <= MAX_SIDE && h <= MAX_SIDE
        ? raw_record_size(r->mode, (unsigned)w, (unsigned)h) : 0;
    if (want == 0) return "a stored-pixel record of an unknown mode or a size outside 1..65500";
    if (want != len) return "a stored-pixel record whose length is not its header's";
    r->width = (unsigned)w;
    r->height = (unsigned)h;
    r->pixels = data + RAW_HEADER;
    if (r->mode == RAW_YUV420) {
        r->chroma_width = (r->width + 1) / 2;
        r->chroma_height = (r->height + 1) / 2;
        r->cb = r->pixels + (size_t)w * h;
        r->cr = r->cb + (size_t)r->chroma_width * r->chroma_height;
    }
    return NULL;
}

/* The 16 header bytes of a record of ``mode`` and size at ``out``. */
static inline void raw_header(unsigned char *out, int mode, unsigned width, unsigned height) {
    memcpy(out, RAW_MAGIC, sizeof RAW_MAGIC);
    out[4] = RAW_VERSION;
    out[5] = (unsigned char)mode;
    out[6] = out[7] = 0;
    for (int i = 0; i < 4; i++) {
        out[8 + i] = (unsigned char)(width >> (8 * i));
        out[12 + i] = (unsigned char)(height >> (8 * i));
    }
}

#endif
