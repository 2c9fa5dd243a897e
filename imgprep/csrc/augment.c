/* The augmentation's entry (augment.h): checks, the kernel, then the ops in order. Ops that
 * are a lookup table of the current pixels (posterize, solarize, solarize_add, invert,
 * brightness, and contrast, autocontrast and equalize once their statistics are known) are
 * composed into one pending table per channel, so a run of them costs one pass over the
 * image (the statistics are taken through the pending table); the other ops first apply it,
 * fused into the copy of the source that affine reads, which is always planar (with a
 * border: aug_impl.h) so that every kernel reads three planes. Color and Sharpness work in
 * place on a planar image, and on the copy otherwise (where their loops vectorise too);
 * nearest translations move rows within the image (aug_shift), with no copy. */
#include "augment.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "aug_impl.h"
#include "bounds.h"
#include "scratch.h"
#include "simd.h"

static _Thread_local Scratch aug_mem;  /* the source copy (aug_copy_bytes), then the rows */

static const signed char ARITY[AUG_OP_KINDS] = {
    [AUG_OP_IDENTITY] = 0, [AUG_OP_AFFINE] = 6, [AUG_OP_BRIGHTNESS] = 1,
    [AUG_OP_COLOR] = 1, [AUG_OP_CONTRAST] = 1, [AUG_OP_SHARPNESS] = 1,
    [AUG_OP_POSTERIZE] = 1, [AUG_OP_SOLARIZE] = 1, [AUG_OP_SOLARIZE_ADD] = 2,
    [AUG_OP_AUTOCONTRAST] = 0, [AUG_OP_EQUALIZE] = 0, [AUG_OP_INVERT] = 0,
};

__attribute__((format(printf, 3, 4)))
static int invalid(char *msg, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return AUG_INVALID;
}

static int check_op(const AugOp *op, size_t i, char *msg, size_t len) {
    if (op->kind < 0 || op->kind >= AUG_OP_KINDS)
        return invalid(msg, len, "op %zu: no op kind %d (0..%d)", i, op->kind, AUG_OP_KINDS - 1);
    if (op->nargs != ARITY[op->kind])
        return invalid(msg, len, "op %zu (kind %d) takes %d arguments, not %d", i, op->kind,
                       ARITY[op->kind], op->nargs);
    for (int k = 0; k < op->nargs; k++)
        if (!isfinite(op->args[k]) || fabs(op->args[k]) > AUG_MAX_ARG)
            return invalid(msg, len, "op %zu (kind %d): argument %d is %g; each must be finite "
                           "and at most %d in size", i, op->kind, k, op->args[k], AUG_MAX_ARG);
    double bits = op->nargs ? op->args[0] : 0;
    if (op->kind == AUG_OP_POSTERIZE && (bits != floor(bits) || bits < 0 || bits > 8))
        return invalid(msg, len, "op %zu: posterize keeps 0..8 bits, not %g", i, bits);
    if (op->kind != AUG_OP_AFFINE) return AUG_OK;
    if (op->resample != AUG_NEAREST && op->resample != AUG_BILINEAR &&
        op->resample != AUG_BICUBIC)
        return invalid(msg, len, "op %zu: affine resamples with filter %d, %d or %d (nearest, "
                       "bilinear, bicubic), not %d", i, AUG_NEAREST, AUG_BILINEAR, AUG_BICUBIC,
                       op->resample);
    for (int c = 0; c < 3; c++)
        if (op->fill[c] < 0 || op->fill[c] > 255)
            return invalid(msg, len, "op %zu: affine's fill must be three values in 0..255, "
                           "not (%d, %d, %d)", i, op->fill[0], op->fill[1], op->fill[2]);
    return AUG_OK;
}

static int check(const AugImage *im, const AugOp *ops, size_t n, char *msg, size_t len) {
    if (im->width < 1 || im->height < 1 || im->width > MAX_SIDE || im->height > MAX_SIDE)
        return invalid(msg, len, "the image's size %lldx%lld is outside 1..%d",
                       (long long)im->width, (long long)im->height, MAX_SIDE);
    size_t need = (size_t)im->width * (size_t)im->height * 3;  /* < 2^34: no overflow */
    if (im->len != need)
        return invalid(msg, len, "the image holds %zu bytes; %lldx%lld RGB needs %zu", im->len,
                       (long long)im->width, (long long)im->height, need);
    if (n > AUG_MAX_OPS)
        return invalid(msg, len, "%zu ops in one call; at most %d", n, AUG_MAX_OPS);
    for (size_t i = 0; i < n; i++)
        if (check_op(&ops[i], i, msg, len) != AUG_OK) return AUG_INVALID;
    return AUG_OK;
}

/* The lookup tables not yet applied to the pixels, per channel. */
typedef struct {
    Lut t;
    int identity;
} Pending;

static void pending_reset(Pending *p) {
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 256; i++) p->t[c][i] = (uint8_t)i;
    p->identity = 1;
}

/* ``next`` after what is pending. */
static void pending_then(Pending *p, const Lut next) {
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 256; i++) p->t[c][i] = next[c][p->t[c][i]];
    p->identity = 0;
}

static void pending_then1(Pending *p, const uint8_t next[256]) {
    Lut all;
    for (int c = 0; c < 3; c++) memcpy(all[c], next, 256);
    pending_then(p, all);
}

typedef struct {
    Planes img, src;      /* the image; the planar copy of its source, inside its border */
    ptrdiff_t *rows;      /* two rows' offsets (the nearest paths), or sharpness's rows */
    Pending pending;
    int kernel;           /* AUG_KERNEL_PORTABLE or AUG_KERNEL_AVX2 */
} Run;

/* The source copy = the pixels with what is pending applied, planar; nothing pending after. */
static void take_copy(Run *r) {
    aug_apply_lut(&r->src, &r->img, r->pending.identity ? NULL : r->pending.t, r->kernel);
    pending_reset(&r->pending);
}

static void step(Run *r, const AugOp *op) {
    uint8_t t[256];
    Lut lut;
    uint64_t hist[3][256];
    float factor = op->nargs ? (float)op->args[0] : 0.0f;  /* Pillow's blend takes a float */
    switch (op->kind) {
    case AUG_OP_POSTERIZE: aug_lut_posterize(t, (int)op->args[0]); break;
    case AUG_OP_SOLARIZE: aug_lut_solarize(t, op->args[0]); break;
    case AUG_OP_SOLARIZE_ADD: aug_lut_solarize_add(t, op->args[0], op->args[1]); break;
    case AUG_OP_INVERT: aug_lut_invert(t); break;
    case AUG_OP_BRIGHTNESS: aug_lut_blend(t, 0, factor); break;
    case AUG_OP_CONTRAST:
        aug_lut_blend(t, aug_gray_mean(&r->img, r->pending.identity ? NULL : r->pending.t),
                      factor);
        break;
    case AUG_OP_AUTOCONTRAST:
    case AUG_OP_EQUALIZE:
        if (op->kind == AUG_OP_AUTOCONTRAST && r->pending.identity)
            aug_extremes(&r->img, hist);  /* all that autocontrast reads of a histogram */
        else
            aug_histogram(&r->img, r->pending.identity ? NULL : r->pending.t, hist);
        for (int c = 0; c < 3; c++) {
            if (op->kind == AUG_OP_EQUALIZE)
                aug_lut_equalize(lut[c], hist[c]);
            else
                aug_lut_autocontrast(lut[c], hist[c]);
        }
        pending_then(&r->pending, lut);
        return;
    case AUG_OP_COLOR:
        if (r->img.px == 1) {  /* in place */
            if (!r->pending.identity) aug_apply_lut(&r->img, &r->img, r->pending.t, r->kernel);
            pending_reset(&r->pending);
            aug_color(&r->img, factor, r->kernel);
        } else {  /* on the planar copy, where it vectorises, and back */
            take_copy(r);
            aug_color(&r->src, factor, r->kernel);
            aug_apply_lut(&r->img, &r->src, NULL, r->kernel);
        }
        return;
    case AUG_OP_SHARPNESS:
        if (r->img.px == 1) {  /* in place, a row's bytes kept before they are written */
            if (!r->pending.identity) aug_apply_lut(&r->img, &r->img, r->pending.t, r->kernel);
            pending_reset(&r->pending);
            aug_sharpness(&r->img, &r->img, factor, r->rows, r->kernel);
        } else {
            take_copy(r);
            aug_sharpness(&r->img, &r->src, factor, r->rows, r->kernel);
        }
        return;
    case AUG_OP_AFFINE:
        if (op->resample == AUG_NEAREST && op->args[0] == 1.0 && op->args[1] == 0.0 &&
            op->args[3] == 0.0 && op->args[4] == 1.0) {  /* a translation: in place */
            if (!r->pending.identity) aug_apply_lut(&r->img, &r->img, r->pending.t, r->kernel);
            pending_reset(&r->pending);
            if (aug_shift(&r->img, op->args, op->fill, r->rows,
                          (int32_t *)(void *)(r->rows + r->img.w)))
                return;
        }
        take_copy(r);
        aug_affine(&r->img, &r->src, op->args, op->resample, op->fill, r->rows, r->kernel);
        return;
    default:  /* identity */
        return;
    }
    pending_then1(&r->pending, t);
}

/* Whether ``op`` reads the source copy or the rows' scratch. */
static int copies(const AugOp *op, int planar) {
    return op->kind == AUG_OP_AFFINE || op->kind == AUG_OP_SHARPNESS ||
           (op->kind == AUG_OP_COLOR && !planar);
}

static int best_kernel(void) {
#ifdef AUG_X86
    if (simd_level() >= SIMD_AVX2) return AUG_KERNEL_AVX2;
#endif
    return AUG_KERNEL_PORTABLE;
}

int aug_resolve_kernel(int64_t requested) {
    int best = best_kernel();
    if (requested == AUG_KERNEL_AUTO) return best;
    if (requested < AUG_KERNEL_PORTABLE || requested > best) return -1;
    return (int)requested;
}

const char *aug_kernel_name(int kernel) {
    static const char *const names[AUG_KERNELS] = {"portable", "avx2"};
    return kernel >= 0 && kernel < AUG_KERNELS ? names[kernel] : NULL;
}

int aug_run(const AugImage *im, const AugOp *ops, size_t n, char *msg, size_t msg_len) {
    if (check(im, ops, n, msg, msg_len) != AUG_OK) return AUG_INVALID;
    int kernel = aug_resolve_kernel(im->kernel);
    if (kernel < 0)
        return invalid(msg, msg_len, "kernel %d cannot run here (this CPU runs up to %s)",
                       im->kernel, aug_kernel_name(best_kernel()));
    int w = (int)im->width, h = (int)im->height;
    Run r = {.img = planes_of(im->pixels, w, h, im->planar), .kernel = kernel};
    int copy = 0;
    for (size_t i = 0; i < n; i++) copy |= copies(&ops[i], im->planar);
    if (copy) {  /* had before any byte changes */
        size_t at = (aug_copy_bytes(w, h) + 15) & ~(size_t)15;
        size_t side = (size_t)(w > h ? w : h);  /* rows: two sides' worth of offsets */
        uint8_t *mem = scratch_reserve(&aug_mem, at + sizeof(ptrdiff_t) * 2 * side + 64);
        if (mem == NULL) {
            snprintf(msg, msg_len, "no memory for a %dx%d image's copy", w, h);
            return AUG_ENOMEM;
        }
        r.src = padded_planes(mem, w, h);
        r.rows = (ptrdiff_t *)(void *)(mem + at);
    }
    pending_reset(&r.pending);
    for (size_t i = 0; i < n; i++) step(&r, &ops[i]);
    if (!r.pending.identity) aug_apply_lut(&r.img, &r.img, r.pending.t, r.kernel);
    return AUG_OK;
}

void aug_trim(void) { scratch_trim(&aug_mem, SCRATCH_KEEP); }
