/* The loader's per-sample work in one call (see sample.h). */
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "frame.h"
#include "jpegdec.h"
#include "bounds.h"
#include "resample.h"
#include "scratch.h"

#define fail(r, ...) ((r)->status = fail_with(SAMPLE_FAILED, (r)->message, SAMPLE_MESSAGE, \
                                              __VA_ARGS__))
#define invalid(r, ...) ((r)->status = fail_with(SAMPLE_INVALID, (r)->message, SAMPLE_MESSAGE, \
                                                 __VA_ARGS__))

static _Thread_local Scratch frame_mem;

/* Whether a and b are both 0, or both in 1..most. */
static int pair_ok(int64_t a, int64_t b, int64_t most) {
    return (a == 0 && b == 0) || (a >= 1 && b >= 1 && a <= most && b <= most);
}

static int box_ok(const SampleGeometry *g) {
    const double *b = g->box;
    for (int i = 0; i < 4; i++)
        if (!isfinite(b[i])) return 0;
    return b[0] >= 0 && b[1] >= 0 && b[0] <= b[2] && b[1] <= b[3] &&
           b[2] <= (double)g->width && b[3] <= (double)g->height;
}

/* The arguments that the plan rests on: sizes, draft, resize and box. */
static int check_args(const SampleGeometry *g, SampleResult *r) {
    if (g->width < 1 || g->height < 1 || g->width > MAX_SIDE || g->height > MAX_SIDE)
        return invalid(r, "the image's size %lldx%lld is outside 1..%d", (long long)g->width,
                       (long long)g->height, MAX_SIDE);
    if (g->max_pixels && (uint64_t)(g->width * g->height) > g->max_pixels)
        return invalid(r, "%lldx%lld is over the limit of %llu pixels", (long long)g->width,
                       (long long)g->height, (unsigned long long)g->max_pixels);
    if (!pair_ok(g->draft_w, g->draft_h, INT32_MAX) || !pair_ok(g->resize_w, g->resize_h,
                                                                RS_MAX_SIDE))
        return invalid(r, "draft and resize sizes must be 0 (none) or both at least 1");
    if (g->has_box && (!g->resize_w || !box_ok(g)))
        return invalid(r, "the box (%g, %g, %g, %g) must lie within the %lldx%lld image, and "
                          "be resampled", g->box[0], g->box[1], g->box[2], g->box[3],
                       (long long)g->width, (long long)g->height);
    return SAMPLE_DONE;
}

typedef SamplePlan Plan;

/* The DCT scale, the decoded size and the size of the image the crop is taken from: what
 * check_crop reads. */
static void plan_sizes(const SampleGeometry *g, Plan *p) {
    p->scale = g->draft_w ? jpegdec_draft_scale((unsigned)g->width, (unsigned)g->height,
                                                (unsigned)g->draft_w, (unsigned)g->draft_h)
                          : 1;
    p->sw = scaled((unsigned)g->width, p->scale);
    p->sh = scaled((unsigned)g->height, p->scale);
    p->cw = g->resize_w ? g->resize_w : (int64_t)p->sw;
    p->ch = g->resize_h ? g->resize_h : (int64_t)p->sh;
}

/* The resampled box and the region read, for a crop check_crop has put inside the image it
 * is taken from (so that no product of its corners with a side overflows). */
static void plan_reach(const SampleGeometry *g, Plan *p) {
    const unsigned sw = p->sw, sh = p->sh;
    const int64_t *c = g->crop;
    unsigned x0, x1, y0, y1;
    if (!g->resize_w) {
        x0 = (unsigned)c[0], y0 = (unsigned)c[1], x1 = (unsigned)c[2], y1 = (unsigned)c[3];
    } else if (g->has_box) {  /* the crop is the whole resampled box (Python's arithmetic) */
        double sx = (double)sw / (double)g->width, sy = (double)sh / (double)g->height;
        double b[4] = {g->box[0] * sx, g->box[1] * sy, g->box[2] * sx, g->box[3] * sy};
        memcpy(p->box, b, sizeof b);
        jpegdec_reach(b[0], b[2], (unsigned)g->resize_w, sw, rs_filter_support(RS_BILINEAR), &x0, &x1);
        jpegdec_reach(b[1], b[3], (unsigned)g->resize_h, sh, rs_filter_support(RS_BILINEAR), &y0, &y1);
    } else {  /* the whole image resampled: the crop's reach */
        double rw = (double)g->resize_w, rh = (double)g->resize_h;
        p->box[0] = p->box[1] = 0;
        p->box[2] = sw;
        p->box[3] = sh;
        jpegdec_reach((double)(c[0] * sw) / rw, (double)(c[2] * sw) / rw,
                      (unsigned)(c[2] - c[0]), sw, rs_filter_support(RS_BILINEAR), &x0, &x1);
        jpegdec_reach((double)(c[1] * sh) / rh, (double)(c[3] * sh) / rh,
                      (unsigned)(c[3] - c[1]), sh, rs_filter_support(RS_BILINEAR), &y0, &y1);
    }
    p->region = g->whole ? (Rect){0, 0, sw, sh} : (Rect){x0, y0, x1, y1};
}

/* The frame decoded as ``p`` says (whole: all of it, the data read to its end). */
static int decode(const unsigned char *data, size_t len, const Plan *p, int whole,
                  unsigned char *frame, size_t frame_len, SampleResult *r) {
    JpegErr err;
    Rect reg = whole ? (Rect){0, 0, p->sw, p->sh} : p->region;
    long trailing = 0;
    int rc = frame_decode(data, len, frame, frame_len, p->scale, &reg, whole, &trailing, &err);
    r->path = whole ? SAMPLE_WHOLE : SAMPLE_REGION;
    r->warnings = err.warnings;
    if (rc == FRAME_COLOUR || rc == FRAME_REFUSED) {
        snprintf(r->message, SAMPLE_MESSAGE, "%s", err.message);
        return r->status = rc == FRAME_COLOUR ? SAMPLE_DECLINED : SAMPLE_REFUSED;
    }
    if (rc != FRAME_OK) return fail(r, "cannot decode the JPEG (%s)", err.message);
    if (whole) jerr_scan(&err, trailing, &r->scan);
    return r->status = SAMPLE_DONE;
}

/* The crop, within the image it is taken from, and ``out`` of its exact size. */
static int check_crop(const SampleGeometry *g, const Plan *p, size_t out_len, SampleResult *r) {
    const int64_t *c = g->crop;
    if (c[0] < 0 || c[1] < 0 || c[0] >= c[2] || c[1] >= c[3] || c[2] > p->cw || c[3] > p->ch)
        return invalid(r, "the crop (%lld, %lld, %lld, %lld) must be a non-empty box within "
                          "%lldx%lld", (long long)c[0], (long long)c[1], (long long)c[2],
                       (long long)c[3], (long long)p->cw, (long long)p->ch);
    if ((uint64_t)out_len != (uint64_t)((c[2] - c[0]) * (c[3] - c[1]) * 3))
        return invalid(r, "out holds %zu bytes, the %lldx%lld crop needs 3 a pixel", out_len,
                       (long long)(c[2] - c[0]), (long long)(c[3] - c[1]));
    return SAMPLE_DONE;
}

static int write_out(const SampleGeometry *g, const Plan *p, const unsigned char *frame,
                     size_t frame_len, unsigned char *out, size_t out_len, SampleResult *r) {
    const int64_t *c = g->crop;
    size_t stride = (size_t)p->sw * 4;
    if (!g->resize_w) {
        frame_pack(frame + (size_t)c[1] * stride + (size_t)c[0] * 4, stride,
                   (size_t)(c[2] - c[0]), (size_t)(c[3] - c[1]), out, g->flip, g->planar);
        return SAMPLE_DONE;
    }
    rs_job job = {.src = frame, .src_len = frame_len, .width = p->sw, .height = p->sh,
                  .stride = (int64_t)stride, .channels = 4,
                  .box = {p->box[0], p->box[1], p->box[2], p->box[3]},
                  .out_width = g->resize_w, .out_height = g->resize_h, .left = c[0],
                  .top = c[1], .cols = c[2] - c[0], .rows = c[3] - c[1], .out = out,
                  .out_len = out_len, .filter = RS_BILINEAR, .kernel = RS_AUTO,
                  .planar = g->planar, .flip = g->flip};
    char message[SAMPLE_MESSAGE];
    int rc = rs_resize(&job, message, sizeof message);
    if (rc != RS_OK) return fail(r, "cannot resample: %s", message);
    return SAMPLE_DONE;
}

int sample_plan(const SampleGeometry *g, size_t out_len, SamplePlan *p, SampleResult *r) {
    if (check_args(g, r) != SAMPLE_DONE) return r->status;
    plan_sizes(g, p);
    if (check_crop(g, p, out_len, r) != SAMPLE_DONE) return r->status;
    plan_reach(g, p);
    return SAMPLE_DONE;
}

int sample_jpeg(const unsigned char *data, size_t len, const SampleGeometry *g,
                unsigned char *out, size_t out_len, SampleResult *r) {
    memset(r, 0, sizeof *r);
    Plan p;
    if (sample_plan(g, out_len, &p, r) != SAMPLE_DONE) return r->status;
    size_t frame_len = (size_t)p.sw * p.sh * 4;
    unsigned char *frame = scratch_reserve(&frame_mem, frame_len);
    if (frame == NULL) return fail(r, "out of memory for a %ux%u frame", p.sw, p.sh);
    int rc = decode(data, len, &p, g->whole, frame, frame_len, r);
    if (!g->whole && (rc == SAMPLE_FAILED || (rc == SAMPLE_DONE && r->warnings)))
        rc = decode(data, len, &p, 1, frame, frame_len, r);  /* as Pillow: decode it all */
    if (rc != SAMPLE_DONE) return rc;
    return r->status = write_out(g, &p, frame, frame_len, out, out_len, r);
}

void sample_trim(void) { scratch_trim(&frame_mem, SCRATCH_KEEP); }
