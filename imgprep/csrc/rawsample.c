/* The loader's per-sample call for stored pixels (see rawsample.h). */
#include "rawsample.h"

#include <stdio.h>
#include <string.h>

#include "bounds.h"
#include "rawformat.h"
#include "resample.h"
#include "yuvrows.h"

#define fail(r, ...) ((r)->status = fail_with(SAMPLE_FAILED, (r)->message, SAMPLE_MESSAGE, \
                                              __VA_ARGS__))
#define invalid(r, ...) ((r)->status = fail_with(SAMPLE_INVALID, (r)->message, SAMPLE_MESSAGE, \
                                                 __VA_ARGS__))

static _Thread_local Scratch rows_mem;

/* The resample of ``g`` (its box to its size; without a resize, the crop itself at scale 1,
 * which the resampler copies exactly) from ``src``, a source of the record's size. */
static rs_job job_of(const SampleGeometry *g, const SamplePlan *p, unsigned char *out,
                     size_t out_len, int64_t kernel) {
    const int64_t *c = g->crop;
    rs_job job = {.out = out, .out_len = out_len, .filter = RS_BILINEAR, .kernel = kernel,
                  .planar = g->planar, .flip = g->flip, .left = c[0], .top = c[1],
                  .cols = c[2] - c[0], .rows = c[3] - c[1]};
    if (g->resize_w) {
        memcpy(job.box, p->box, sizeof job.box);
        job.out_width = g->resize_w;
        job.out_height = g->resize_h;
    } else {  /* the crop copied: a resample at scale 1 whose window is all of it */
        job.box[0] = (double)c[0], job.box[1] = (double)c[1];
        job.box[2] = (double)c[2], job.box[3] = (double)c[3];
        job.out_width = job.cols, job.out_height = job.rows;
        job.left = job.top = 0;
    }
    return job;
}

/* ``r`` and a pixel around it within the image: the filter's taps of zero weight at the
 * region's edge (a crop copied at scale 1 reads its neighbour with weight 0) must lie in the
 * part too. */
static Rect widened(const Rect *r, unsigned w, unsigned h) {
    return (Rect){r->x0 > 0 ? r->x0 - 1 : 0, r->y0 > 0 ? r->y0 - 1 : 0,
                  r->x1 < w ? r->x1 + 1 : w, r->y1 < h ? r->y1 + 1 : h};
}

int sample_raw(const unsigned char *data, size_t len, const SampleGeometry *g,
               unsigned char *out, size_t out_len, int64_t kernel, SampleResult *r) {
    memset(r, 0, sizeof *r);
    RawImage im;
    const char *why = raw_parse(data, len, &im);
    if (why != NULL) return fail(r, "%s", why);
    if (g->width != (int64_t)im.width || g->height != (int64_t)im.height)
        return invalid(r, "the geometry is of a %lldx%lld image, the record holds %ux%u",
                       (long long)g->width, (long long)g->height, im.width, im.height);
    SampleGeometry at1 = *g;
    at1.draft_w = at1.draft_h = 0;
    at1.whole = 0;
    SamplePlan p;
    if (sample_plan(&at1, out_len, &p, r) != SAMPLE_DONE) return r->status;
    if (rs_resolve_kernel(kernel) < 0)
        return invalid(r, "kernel %lld cannot run on this CPU", (long long)kernel);
    rs_job job = job_of(&at1, &p, out, out_len, kernel);
    YuvRows yuv;
    if (im.mode == RAW_RGB24) {
        job.src = im.pixels;
        job.src_len = (size_t)im.width * im.height * 3;
        job.width = im.width, job.height = im.height;
        job.stride = (int64_t)im.width * 3;
        job.channels = 3;
    } else {  /* only the region the resample reads, its rows made as they are asked for */
        Rect a = widened(&p.region, im.width, im.height);
        if (yuv_rows_init(&yuv, &im, a.x0, a.y0, a.x1 - a.x0, kernel, &rows_mem) != 0)
            return fail(r, "out of memory for a %u-pixel row", a.x1 - a.x0);
        job.make_rows = &yuv.base;
        job.width = a.x1 - a.x0, job.height = a.y1 - a.y0;
        job.origin_x = a.x0, job.origin_y = a.y0;
        job.full_width = im.width, job.full_height = im.height;
        job.channels = 4;
    }
    r->path = SAMPLE_REGION;
    char message[SAMPLE_MESSAGE];
    int rc = rs_resize(&job, message, sizeof message);
    if (rc != RS_OK) return fail(r, "cannot resample: %s", message);
    return r->status = SAMPLE_DONE;
}

void sample_raw_trim(void) { scratch_trim(&rows_mem, SCRATCH_KEEP); }
