/* EXIF orientation: read from a JPEG's APP1 segments as Pillow's ``ImageOps.exif_transpose``
 * reads it, and applied to decoded RGBX pixels. */
#ifndef IMGPREP_ORIENT_H
#define IMGPREP_ORIENT_H

#include <stddef.h>
#include <stdint.h>

/* The orientation Pillow's ``ImageOps.exif_transpose`` acts on for an APP1 "Exif\0\0" payload
 * (the Exif segments joined as Pillow joins them), its IFD0 read as Pillow 11.2 to 12.3 read
 * it: 1..8 where the tag's first value, of any numeric type, is a whole number 1..8 (of a
 * repeated tag, the last copy Pillow keeps); 0 where the tag holds anything else, or where
 * Pillow cannot read the TIFF header (it then reads no XMP packet either); -1 where Pillow
 * finds no tag (it reads the XMP packet's). Pillow 13 reads a few malformed payloads
 * otherwise (it keeps a repeated tag's first copy, strips at most two "Exif\0\0" headers,
 * and skips a value stored at an offset, where 12 stopped reading, once such values add up
 * past the payload); this reading is 12's whichever Pillow is installed. */
int exif_orientation(const unsigned char *p, size_t n);

/* The digit after ``tiff:Orientation="`` or ``tiff:Orientation>`` in an APP1 XMP payload
 * (after its "http://ns.adobe.com/xap/1.0/" header), or -1 when there is none. */
int xmp_orientation(const unsigned char *p, size_t n);

/* Whether an orientation (2..8 transpose; anything else leaves the image as stored) swaps
 * width and height. */
int orientation_swaps(int orientation);

/* A rectangle [x0, x1) x [y0, y1) in pixels. */
typedef struct {
    unsigned x0, y0, x1, y1;
} Rect;

/* Where the rectangle ``r`` of a ``width`` x ``height`` image lies once the image is
 * transposed by ``orientation``. */
Rect turn_rect(int orientation, unsigned width, unsigned height, Rect r);

/* The orientation that undoes ``orientation`` (each is its own inverse but 6 and 8). */
int inverse_orientation(int orientation);

/* Copies the ``width`` x ``height`` RGBX pixels at ``src`` (rows ``stride`` bytes apart) into
 * ``dst`` transposed by ``orientation``, as Pillow's ``exif_transpose`` does: rows of
 * ``width`` pixels, or of ``height`` when the orientation swaps them, packed. */
void transpose_rgbx(int orientation, const unsigned char *src, unsigned width, unsigned height,
                    size_t stride, unsigned char *dst);

#endif
