/* Convert's per-image work in one call (see convert.h). */
#include "convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>

#include "budget.h"
#include "encode.h"
#include "jerr.h"
#include "bounds.h"
#include "resample.h"

enum { RETRY = -1 };                     /* decode_once: decode the whole image instead */
enum { AT_HEADER, AT_REGION, AT_WHOLE };  /* where a libjpeg error struck */

/* Each thread's scratch: the decoded region, the region turned, the output's RGB pixels,
 * the last row read past the region, the output JPEG. */
static _Thread_local Scratch region_mem, turned_mem, out_mem, row_mem;
static _Thread_local OutBuf jpeg_mem;

typedef struct {
    double box[4];        /* the resample's box, displayed pixels at the scale */
    unsigned out_width, out_height;
    Rect reach;           /* the displayed pixels the resample reads */
} Geometry;

#define fail(r, ...) ((r)->status = fail_with(FAILED, (r)->message, MESSAGE_LEN, __VA_ARGS__))

static const char *mode_of(int components) { return components == 1 ? "L" : "RGB"; }

/* Python's ``round(a / b)``: the nearest integer, ties to even (exact in integers: a true
 * quotient of these sizes is never within a rounding of a tie without being one). */
static uint64_t round_ratio(uint64_t a, uint64_t b) {
    uint64_t q = a / b, twice = (a % b) * 2;
    return twice > b || (twice == b && (q & 1)) ? q + 1 : q;
}

/* The box and output size of a ``w`` x ``h`` displayed image (of an original stored as
 * ``ow`` x ``oh``), as convert's options say. */
static int geometry(unsigned w, unsigned h, unsigned ow, unsigned oh, const ConvertOpts *o,
                    ConvertResult *r, Geometry *g) {
    unsigned side = w < h ? w : h;
    if (o->resize == CENTER_CROP) {
        unsigned left = (w - side) / 2, top = (h - side) / 2;
        *g = (Geometry){{left, top, left + side, top + side}, (unsigned)o->size,
                        (unsigned)o->size, {0, 0, 0, 0}};
    } else {
        uint64_t gw = round_ratio((uint64_t)w * (uint64_t)o->size, side);
        uint64_t gh = round_ratio((uint64_t)h * (uint64_t)o->size, side);
        gw = gw ? gw : 1;
        gh = gh ? gh : 1;
        if (gw > o->max_pixels || gh > o->max_pixels || gw * gh > o->max_pixels)
            return fail(r, "%ux%u is too elongated for --resize short-side (output "
                           "%llux%llu is over --max-pixels)", ow, oh,
                        (unsigned long long)gw, (unsigned long long)gh);
        *g = (Geometry){{0, 0, w, h}, (unsigned)gw, (unsigned)gh, {0, 0, 0, 0}};
    }
    double support = rs_filter_support(o->filter);
    jpegdec_reach(g->box[0], g->box[2], g->out_width, w, support, &g->reach.x0,
                  &g->reach.x1);
    jpegdec_reach(g->box[1], g->box[3], g->out_height, h, support, &g->reach.y0,
                  &g->reach.y1);
    return CONVERTED;
}

typedef struct {
    int scale, orientation, region;
    unsigned width, height;  /* at the scale, as stored */
    Rect stored;             /* what to decode, at the scale, as stored */
    Geometry g;
} Plan;

/* What to decode of the image ``h`` describes, or why not here (DECLINED, FAILED). */
static int plan(const JpegHeader *h, const ConvertOpts *o, int whole, ConvertResult *r,
                Plan *p) {
    r->width = h->width;
    r->height = h->height;
    r->components = h->components;
    r->mpf = h->mpf;
    if (!colour_to_rgb(h->colour)) {
        snprintf(r->message, MESSAGE_LEN, "%d-component JPEG (CMYK, YCCK ...)", h->components);
        return r->status = DECLINED;
    }
    uint64_t pixels = (uint64_t)h->width * h->height;
    if (o->bomb_pixels && pixels > o->bomb_pixels)
        return fail(r, "decompression bomb refused: Image size (%llu pixels) exceeds limit of "
                       "%llu pixels, could be decompression bomb DOS attack.",
                    (unsigned long long)pixels, (unsigned long long)o->bomb_pixels);
    if (pixels > o->max_pixels)
        return fail(r, "%ux%u = %llu pixels is over the limit of %llu (--max-pixels)", h->width,
                    h->height, (unsigned long long)pixels, (unsigned long long)o->max_pixels);
    p->scale = jpegdec_draft_scale(h->width, h->height, (unsigned)o->size, (unsigned)o->size);
    p->width = scaled(h->width, p->scale);
    p->height = scaled(h->height, p->scale);
    p->orientation = h->orientation >= 2 && h->orientation <= 8 ? h->orientation : 1;
    int swaps = orientation_swaps(p->orientation);
    unsigned w = swaps ? p->height : p->width, hh = swaps ? p->width : p->height;
    if (geometry(w, hh, h->width, h->height, o, r, &p->g) != CONVERTED) return FAILED;
    Rect all = {0, 0, p->width, p->height};
    p->stored = turn_rect(inverse_orientation(p->orientation), w, hh, p->g.reach);
    p->region = !whole && !h->arithmetic && colour_region_exact(h->colour) &&
                memcmp(&p->stored, &all, sizeof all) != 0;
    if (!p->region) p->stored = all;
    return CONVERTED;
}

/* The decoded pixels ``px`` as displayed, where they lie in the displayed image, and the
 * box. */
static int show(const Pixels *px, const Plan *p, ConvertResult *r, Decoded *d) {
    Pixels s = *px;
    if (p->orientation != 1) {
        unsigned char *t = scratch_reserve(&turned_mem, (size_t)px->width * px->height * 4);
        if (t == NULL) return fail(r, "out of memory turning a %ux%u region", px->width,
                                   px->height);
        transpose_rgbx(p->orientation, px->pixels, px->width, px->height, px->stride, t);
        Rect at = turn_rect(p->orientation, p->width, p->height,
                            (Rect){px->x, px->y, px->x + px->width, px->y + px->height});
        s = (Pixels){t, at.x0, at.y0, at.x1 - at.x0, at.y1 - at.y0,
                     (size_t)(at.x1 - at.x0) * 4, 4};
    }
    d->shown = s;
    int swaps = orientation_swaps(p->orientation);
    d->full_width = swaps ? p->height : p->width;
    d->full_height = swaps ? p->width : p->height;
    memcpy(d->box, p->g.box, sizeof d->box);
    d->out_width = p->g.out_width;
    d->out_height = p->g.out_height;
    return CONVERTED;
}

static int libjpeg_failed(int at, const JpegErr *err, ConvertResult *r) {
    if (err->refused) return fail(r, "refused: %s", err->message);  /* none would do */
    if (at == AT_HEADER) {  /* Pillow reads it, or says why not */
        snprintf(r->message, MESSAGE_LEN, "%s", err->message);
        return r->status = DECLINED;
    }
    if (at == AT_REGION) return RETRY;  /* the whole decode says what is wrong */
    const char *mode = mode_of(r->components);
    if (err->eof)
        return fail(r, "cannot decode JPEG %s %ux%u: truncated image data (%s)", mode, r->width,
                    r->height, err->message);
    return fail(r, "cannot decode JPEG %s %ux%u: %s", mode, r->width, r->height, err->message);
}

/* The region ``p`` plans decoded (the rows and columns covering ``p->stored``) into the
 * thread's scratch; ``px``: the pixels of ``p->stored`` (those of a whole decode). */
static void decode_region(j_decompress_ptr cinfo, const Plan *p, Pixels *px) {
    unsigned w, h;
    Rect got;
    jpegdec_scale(cinfo, p->scale, &w, &h);
    jpegdec_start(cinfo, p->stored, &got);
    size_t stride = (size_t)(got.x1 - got.x0) * 4;
    unsigned char *buf = scratch_reserve(&region_mem, stride * (got.y1 - got.y0));
    if (buf == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 12);
    jpegdec_rows(cinfo, &got, buf, stride);
    /* The columns asked for: the outer ones decoded beside them may differ from a whole
     * decode's. */
    unsigned x0 = p->stored.x0 > got.x0 ? p->stored.x0 : got.x0;
    unsigned x1 = p->stored.x1 < w ? p->stored.x1 : w;
    *px = (Pixels){.pixels = buf + (size_t)(x0 - got.x0) * 4, .x = x0, .y = got.y0,
                   .width = x1 - x0, .height = got.y1 - got.y0, .stride = stride,
                   .channels = 4};
}

static int decode_once(const unsigned char *data, size_t len, const ConvertOpts *o, int whole,
                       ConvertResult *r, Decoded *d) {
    struct jpeg_decompress_struct cinfo;
    JpegErr err;
    Budget budget;
    JpegHeader h;
    Plan p;
    Pixels px;
    volatile int at = AT_HEADER;
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return libjpeg_failed(at, &err, r);
    }
    jpegdec_open(&cinfo, &err, &budget, data, len, o->exif_transpose, &h);
    int rc = plan(&h, o, whole, r, &p);
    if (rc != CONVERTED) {
        jpeg_destroy_decompress(&cinfo);
        return rc;
    }
    budget_header(&cinfo, len);
    at = p.region ? AT_REGION : AT_WHOLE;
    decode_region(&cinfo, &p, &px);
    long trailing = jpegdec_to_end(&cinfo, &row_mem);
    jpeg_destroy_decompress(&cinfo);
    jerr_scan(&err, trailing, &r->scan);
    if (p.region && err.warnings) return RETRY;  /* corrupt data: decode it all, as Pillow */
    if (err.eof) {
        snprintf(err.message, JMSG_LENGTH_MAX, "premature end of the JPEG data");
        return libjpeg_failed(AT_WHOLE, &err, r);
    }
    r->path = p.region ? PATH_REGION : PATH_WHOLE;
    return show(&px, &p, r, d);
}

int convert_decode(const unsigned char *data, size_t len, const ConvertOpts *o,
                   ConvertResult *r, Decoded *d) {
    memset(r, 0, offsetof(ConvertResult, histogram));
    r->message[0] = '\0';
    int rc = decode_once(data, len, o, o->whole, r, d);
    if (rc == RETRY) rc = decode_once(data, len, o, 1, r, d);
    return r->status = rc;
}

static void count_levels(const unsigned char *px, size_t n, uint64_t *hist) {
    memset(hist, 0, LEVELS * sizeof *hist);
    for (size_t i = 0; i < n; i++, px += 3) {
        hist[px[0]]++;
        hist[256 + px[1]]++;
        hist[512 + px[2]]++;
    }
}

/* Resample and encode what the decode stage gave. */
static int finish(const Decoded *d, const ConvertOpts *o, ConvertResult *r) {
    unsigned w = d->out_width, h = d->out_height;
    size_t n = (size_t)w * h * 3;
    unsigned char *out = scratch_reserve(&out_mem, n);
    if (out == NULL) return fail(r, "out of memory for a %ux%u output", w, h);
    const Pixels *s = &d->shown;
    rs_job job = {.src = s->pixels,
                  .src_len = s->stride * (s->height - 1) + (size_t)s->width * s->channels,
                  .width = s->width, .height = s->height, .stride = (int64_t)s->stride,
                  .channels = s->channels, .box = {d->box[0], d->box[1], d->box[2], d->box[3]},
                  .out_width = w, .out_height = h, .cols = w, .rows = h, .out = out,
                  .out_len = n, .filter = o->filter, .kernel = RS_AUTO, .origin_x = s->x,
                  .origin_y = s->y, .full_width = d->full_width,
                  .full_height = d->full_height};
    char message[JMSG_LENGTH_MAX];
    if (rs_resize(&job, message, sizeof message) != RS_OK)
        return fail(r, "cannot resample %ux%u to %ux%u: %s", s->width, s->height, w, h,
                    message);
    if (encode_jpeg(out, w, h, (size_t)w * 3, 3, o->quality, NULL, &jpeg_mem, message) != 0)
        return fail(r, "cannot encode the %ux%u output: %s", w, h, message);
    if (o->histogram) count_levels(out, (size_t)w * h, r->histogram);
    r->out_width = w;
    r->out_height = h;
    r->pixels = out;
    r->jpeg = jpeg_mem.data;
    r->jpeg_len = jpeg_mem.len;
    return r->status = CONVERTED;
}

int convert_jpeg(const unsigned char *data, size_t len, const ConvertOpts *o,
                 ConvertResult *r) {
    Decoded d;
    int rc = convert_decode(data, len, o, r, &d);
    return rc == CONVERTED ? finish(&d, o, r) : rc;
}

int convert_rgb(const unsigned char *pixels, unsigned width, unsigned height,
                unsigned orig_width, unsigned orig_height, const ConvertOpts *o,
                ConvertResult *r) {
    Geometry g;
    memset(r, 0, offsetof(ConvertResult, histogram));
    r->message[0] = '\0';
    r->width = orig_width;
    r->height = orig_height;
    r->components = 3;
    r->path = PATH_PIXELS;
    if (geometry(width, height, orig_width, orig_height, o, r, &g) != CONVERTED) return FAILED;
    Decoded d = {.shown = {.pixels = pixels, .width = width, .height = height,
                           .stride = (size_t)width * 3, .channels = 3},
                 .full_width = width, .full_height = height,
                 .box = {g.box[0], g.box[1], g.box[2], g.box[3]}, .out_width = g.out_width,
                 .out_height = g.out_height};
    return finish(&d, o, r);
}

int convert_filter_known(int filter) { return rs_filter_support(filter) > 0; }

void convert_trim(void) {
    scratch_trim(&region_mem, SCRATCH_KEEP);
    scratch_trim(&turned_mem, SCRATCH_KEEP);
    scratch_trim(&out_mem, SCRATCH_KEEP);
    scratch_trim(&row_mem, SCRATCH_KEEP);
    if (jpeg_mem.cap > SCRATCH_KEEP) {
        free(jpeg_mem.data);
        jpeg_mem = (OutBuf){NULL, 0, 0};
    }
}
