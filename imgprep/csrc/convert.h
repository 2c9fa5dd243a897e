/* Convert's per-image work in one call: a JPEG's bytes, decoded at a DCT scale (only the
 * region the resample reads, then the rest of the data read to its end, entropy-decoded
 * only, so that damage anywhere is seen), turned by its EXIF orientation, cropped or scaled
 * on the short side, resampled and encoded; or the
 * same from pixels that Pillow decoded (what libjpeg-turbo cannot: PNG, CMYK ...). Plain C:
 * run it without the GIL. The outputs live in the calling thread's scratch memory until its
 * next call. */
#ifndef IMGPREP_CONVERT_H
#define IMGPREP_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "jerr.h"
#include "jpegdec.h"

enum { CONVERTED = 0, DECLINED = 1, FAILED = 2 };          /* ConvertResult.status */
enum { CENTER_CROP = 0, SHORT_SIDE = 1 };                   /* ConvertOpts.resize */
enum { PATH_REGION = 1, PATH_WHOLE = 2, PATH_PIXELS = 3 };  /* ConvertResult.path */
enum { MESSAGE_LEN = 320, LEVELS = 768 };

typedef struct {
    int size;              /* the output's side (center-crop) or short side (short-side) */
    int resize;            /* CENTER_CROP or SHORT_SIDE */
    int filter;            /* the resampler's filter (RS_LANCZOS ... RS_HAMMING) */
    int quality;           /* JPEG quality, 1..100 */
    int exif_transpose;    /* turn the image as its EXIF (else XMP) orientation says */
    int whole;             /* decode whole images even where a region would do (tests) */
    int histogram;         /* count the output's levels per channel */
    uint64_t max_pixels;   /* larger originals fail (--max-pixels) */
    uint64_t bomb_pixels;  /* Pillow's decompression-bomb limit (0: none) */
} ConvertOpts;

typedef struct {
    int status;               /* CONVERTED; DECLINED: take the Pillow path; FAILED: message */
    int path;                 /* how the pixels were decoded (PATH_*) */
    unsigned width, height;   /* the original's, as stored */
    int components;           /* 1 (Pillow's mode L) or 3 (RGB) */
    int mpf;                  /* an APP2 "MPF" segment (Pillow may call it MPO) */
    unsigned out_width, out_height;
    const unsigned char *pixels;  /* the output, out_width x out_height RGB */
    const unsigned char *jpeg;
    size_t jpeg_len;
    Scan scan;                    /* a JPEG the extension decoded, read to its end */
    uint64_t histogram[LEVELS];   /* R, G, B levels (when asked) */
    char message[MESSAGE_LEN];
} ConvertResult;

/* What the decode stage gives the resample: the decoded pixels as displayed (turned: all of
 * the image, or the part at (shown.x, shown.y) the resample reads), the size of the whole
 * image as displayed, the box to resample in its coordinates, and the output size. The
 * resample weighs the part as it would the whole image, so that the bytes are the same. */
typedef struct {
    Pixels shown;
    unsigned full_width, full_height;
    double box[4];
    unsigned out_width, out_height;
} Decoded;

/* The decode stage alone (for tests): the status, and ``d`` when CONVERTED. */
int convert_decode(const unsigned char *data, size_t len, const ConvertOpts *o,
                   ConvertResult *r, Decoded *d);

/* A JPEG's bytes to the output JPEG; returns r->status. */
int convert_jpeg(const unsigned char *data, size_t len, const ConvertOpts *o,
                 ConvertResult *r);

/* Decoded RGB pixels in rows (already turned, at their draft scale) of an original of
 * ``orig_width`` x ``orig_height`` to the output JPEG; returns r->status. */
int convert_rgb(const unsigned char *pixels, unsigned width, unsigned height,
                unsigned orig_width, unsigned orig_height, const ConvertOpts *o,
                ConvertResult *r);

/* Whether ``filter`` is one the resampler has. */
int convert_filter_known(int filter);

/* Gives back the calling thread's scratch memory where an image grew it past the usual. */
void convert_trim(void);

#endif
