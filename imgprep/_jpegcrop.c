/* Crop-aware JPEG decoding with libjpeg-turbo's partial decompression.
 *
 * Results are the module's struct sequences (ProbeResult, DecodeResult, ConvertResult,
 * FrameResult, SampleResult: imgprep/csrc/results.c); codes and limits its constants.
 *
 * probe(data, check=False) -> ProbeResult(width, height, code, report)
 *     Reads the headers. code 0: a sequential (not progressive) YCbCr or grayscale JPEG whose
 *     bytes after the start of scan hold only entropy-coded data, restart markers and the
 *     final EOI, so that stopping early cannot hide an error a full decode would raise.
 *     Other codes name why the fast path declines (see imgprep/jpegcrop.py). ``report`` is
 *     None, or with ``check`` what reading every scan's coefficients to the end found (no
 *     pixels made: any colour space, progressive too; below).
 *
 * decode(data, frame, scale, x0, y0, x1, y1, whole=False) -> DecodeResult(left, top, right,
 *                                                                          bottom, report)
 *     Decodes, at 1/scale, the rows and iMCU columns that cover [x0, x1) x [y0, y1) (output
 *     pixels) into ``frame``, a writable RGBX buffer of the whole scaled image (4 bytes a
 *     pixel, rows of scaled-width pixels), at their place in the image. The same library,
 *     DCT and upsampling as a full decode, so the pixels of that region are the full
 *     decode's (tested on every region shape, subsampling and scale). Returns the region
 *     actually written and the report; with ``whole`` the rest of the data is read to the
 *     end too (the rows below the region entropy-decoded only, the last one written), so
 *     that the report covers the whole file.
 *
 *     report: {"warnings": libjpeg's warnings (corrupt data), "first": the first one's text,
 *     "eof": the data ran out before an EOI marker, "hit_marker": a marker came before the
 *     scan's last block, "padding": the most bytes skipped before one marker, "trailing":
 *     bytes after the EOI marker (whole or check only), "error": libjpeg's error ("" if
 *     none; probe's check only: decode raises)}.
 *
 * pack(src, src_width, x0, y0, width, height, out, flip, planar)
 *     Copies the width x height pixels at (x0, y0) of a 4-byte-a-pixel image (RGBX: the
 *     frame above, or a Pillow image exported through the Arrow C data interface) into
 *     ``out`` as RGB, rows of pixels (HWC) or three planes (CHW), mirrored when ``flip``:
 *     one pass instead of a flip, a split and a copy.
 *
 * augment(out, width, height, planar, ops[, kernel])
 *     Carries a list of augmentation ops out in place on one RGB image (three planes or rows
 *     of pixels), each equal to stock Pillow's own call (imgprep/csrc/augment_py.c,
 *     imgprep/augment.py); augment_kernel(kernel) names the kernel that runs.
 *
 * Every argument is range-checked here, in signed arithmetic with overflow checks, before
 * any byte is touched (ValueError otherwise). Built for the stable ABI (3.11+), so one build
 * serves later Pythons, with -Wall -Wextra -Werror in development (setup.py). The GIL is
 * released while libjpeg runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#include "csrc/augment.h"
#include "csrc/bindings.h"
#include "csrc/bounds.h"
#include "csrc/budget.h"
#include "csrc/convert.h"
#include "csrc/frame.h"
#include "csrc/jerr.h"
#include "csrc/probe.h"
#include "csrc/rawformat.h"
#include "csrc/resample.h"
#include "csrc/results.h"
#include "csrc/sample.h"

#include "csrc/libjpeg_info.h"


static PyObject *report(const JpegErr *err, long trailing, int with_error) {
    Scan scan;
    jerr_scan(err, trailing, &scan);
    return scan_dict(&scan, with_error ? err->message : "", with_error && err->refused);
}

static PyObject *probe(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    int check = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &check)) return NULL;
    if ((unsigned long long)view.len > (unsigned long long)ULONG_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "the data is too large for libjpeg");
        return NULL;
    }
    ProbeResult r;
    Py_BEGIN_ALLOW_THREADS
    probe_jpeg(view.buf, (size_t)view.len, check, &r);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyObject *rep = check ? report(&r.err, r.trailing, r.failed) : Py_NewRef(Py_None);
    if (rep == NULL) return NULL;
    return named_result(RESULT_PROBE, Py_BuildValue("lliN", r.width, r.height, r.code, rep));
}

/* An int argument in [lo, hi], or -1 with ValueError naming it. */
static int in_range(const char *name, long long v, long long lo, long long hi) {
    if (v >= lo && v <= hi) return 0;
    PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld], not %lld", name, lo, hi, v);
    return -1;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data, frame;
    int scale, whole = 0;
    long long x0, y0, x1, y1;
    if (!PyArg_ParseTuple(args, "y*w*iLLLL|p", &data, &frame, &scale, &x0, &y0, &x1, &y1,
                          &whole))
        return NULL;
    PyObject *result = NULL;
    const long long most = JPEG_MAX_DIMENSION;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyErr_SetString(PyExc_ValueError, "scale must be 1, 2, 4 or 8");
    } else if (in_range("x0", x0, 0, most - 1) < 0 || in_range("y0", y0, 0, most - 1) < 0 ||
               in_range("x1", x1, x0 + 1, most) < 0 || in_range("y1", y1, y0 + 1, most) < 0) {
        /* the message is set: x1 > x0 and y1 > y0, so the region is not empty */
    } else if ((unsigned long long)data.len > (unsigned long long)ULONG_MAX) {
        PyErr_SetString(PyExc_ValueError, "the data is too large for libjpeg");
    } else {
        JpegErr err;
        Rect r = {(unsigned)x0, (unsigned)y0, (unsigned)x1, (unsigned)y1};
        long trailing = 0;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = frame_decode(data.buf, (size_t)data.len, frame.buf, (size_t)frame.len, scale, &r,
                          whole, &trailing, &err);
        Py_END_ALLOW_THREADS
        if (rc != 0) {
            PyErr_Format(PyExc_ValueError, "cannot decode the JPEG (%s)", err.message);
        } else {
            PyObject *rep = report(&err, trailing, 0);
            if (rep != NULL)
                result = named_result(RESULT_DECODE, Py_BuildValue("IIIIN", r.x0, r.y0, r.x1,
                                                                   r.y1, rep));
        }
    }
    PyBuffer_Release(&frame);
    PyBuffer_Release(&data);
    return result;
}

/* The Arrow C data interface's array (https://arrow.apache.org/docs/format/CDataInterface.html),
 * a stable ABI: Pillow exports an image as a fixed-size list of 4 uint8 a pixel. */
struct ArrowArray {
    int64_t length, null_count, offset, n_buffers, n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* The pixels of an Arrow-exported 4-byte-a-pixel image, or NULL with an exception set. */
static const unsigned char *arrow_pixels(PyObject *capsule, Py_ssize_t *len) {
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a == NULL) return NULL;
    const struct ArrowArray *values = a->n_children == 1 && a->children != NULL
        ? a->children[0] : NULL;
    int64_t bytes;
    if (a->release == NULL || values == NULL || values->n_buffers != 2 ||
        values->buffers == NULL || values->buffers[1] == NULL || a->length < 0 ||
        a->offset < 0 || values->offset < 0 || __builtin_mul_overflow(a->length, 4, &bytes) ||
        bytes > PY_SSIZE_T_MAX || a->offset > (INT64_MAX - values->offset) / 4) {
        PyErr_SetString(PyExc_ValueError, "not a 4-byte-a-pixel image exported by Pillow");
        return NULL;
    }
    *len = (Py_ssize_t)bytes;
    return (const unsigned char *)values->buffers[1] + values->offset + a->offset * 4;
}

/* Whether the box (x0, y0, w, h) lies inside ``len`` bytes of rows ``src_w`` pixels wide,
 * 4 bytes a pixel, and ``out_len`` is w x h x 3; else -1 with ValueError. Every value is a
 * checked Py_ssize_t: none wraps. */
static int check_box(Py_ssize_t src_w, Py_ssize_t x0, Py_ssize_t y0, Py_ssize_t w,
                     Py_ssize_t h, Py_ssize_t len, Py_ssize_t out_len) {
    Py_ssize_t stride, last, end, need;
    if (src_w < 1 || x0 < 0 || y0 < 0 || w < 1 || h < 1) {
        PyErr_Format(PyExc_ValueError, "the box must have x0, y0 >= 0 and width, height, "
                     "src_width >= 1 (got x0=%zd y0=%zd width=%zd height=%zd src_width=%zd)",
                     x0, y0, w, h, src_w);
        return -1;
    }
    if (w > src_w || x0 > src_w - w || __builtin_mul_overflow(src_w, (Py_ssize_t)4, &stride) ||
        __builtin_add_overflow(y0, h - 1, &last) ||
        __builtin_mul_overflow(last, stride, &end) ||
        __builtin_add_overflow(end, (x0 + w) * 4, &end) || end > len) {
        PyErr_Format(PyExc_ValueError, "the box (x0=%zd y0=%zd width=%zd height=%zd) lies "
                     "outside the source image (%zd pixels wide, %zd bytes)", x0, y0, w, h,
                     src_w, len);
        return -1;
    }
    if (__builtin_mul_overflow(w, h, &need) || __builtin_mul_overflow(need, (Py_ssize_t)3,
                                                                      &need) ||
        need != out_len) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes, the %zdx%zd box needs 3 a pixel",
                     out_len, w, h);
        return -1;
    }
    return 0;
}

static PyObject *pack(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *src;
    Py_buffer out, view = {0};
    Py_ssize_t src_w, x0, y0, w, h;
    int flip, planar;
    if (!PyArg_ParseTuple(args, "Onnnnnw*pp", &src, &src_w, &x0, &y0, &w, &h, &out, &flip,
                          &planar))
        return NULL;
    const unsigned char *pixels;
    Py_ssize_t len = 0;
    int have_view = 0;
    if (PyCapsule_CheckExact(src)) {
        pixels = arrow_pixels(src, &len);
    } else if (PyObject_GetBuffer(src, &view, PyBUF_SIMPLE) == 0) {
        have_view = 1;
        pixels = view.buf;
        len = view.len;
    } else {
        pixels = NULL;
    }
    PyObject *result = NULL;
    if (pixels != NULL && check_box(src_w, x0, y0, w, h, len, out.len) == 0) {
        size_t stride = (size_t)src_w * 4;
        Py_BEGIN_ALLOW_THREADS
        frame_pack(pixels + (size_t)y0 * stride + (size_t)x0 * 4, stride, (size_t)w, (size_t)h,
                   out.buf, flip, planar);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    if (have_view) PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"probe", probe, METH_VARARGS, "probe(data, check=False) -> ProbeResult(width, height, code, report)"},
    {"decode", decode, METH_VARARGS, "decode(data, frame, scale, x0, y0, x1, y1, whole=False) "
     "-> DecodeResult(left, top, right, bottom, report)"},
    {"pack", pack, METH_VARARGS,
     "pack(src, src_width, x0, y0, width, height, out, flip, planar) -> None"},
    {"encode", py_encode, METH_VARARGS,
     "encode(pixels, width, height, channels, quality, sampling=()) -> bytes"},
    {"resize", rs_py_resize, METH_VARARGS,
     "resize(src, width, height, stride, channels, box, out_width, out_height, window, out, "
     "filter, flip, planar, kernel) -> None (imgprep/csrc/resample_py.c)"},
    {"resample_kernel", rs_py_kernel, METH_VARARGS, "resample_kernel(kernel) -> str"},
    {"convert", py_convert, METH_VARARGS, "convert(data, ...) -> ConvertResult"},
    {"finish", py_finish, METH_VARARGS, "finish(rgb, ...) -> ConvertResult"},
    {"frame", py_frame, METH_VARARGS, "frame(data, ...) -> FrameResult"},
    {"sample", py_sample, METH_VARARGS, "sample(data, width, height, draft, resize, box, crop, "
     "flip, planar, whole, max_pixels, out) -> SampleResult(status, path, message, scan) "
     "(imgprep/csrc/sample_py.c)"},
    {"augment", py_augment, METH_VARARGS, "augment(out, width, height, planar, ops[, kernel]) "
     "-> None (imgprep/csrc/augment_py.c)"},
    {"augment_kernel", py_augment_kernel, METH_VARARGS, "augment_kernel(kernel) -> str"},
    {"raw_record", py_raw_record, METH_VARARGS, "raw_record(jpeg, mode, max_pixels) -> "
     "RawRecordResult(status, message, record, mode, width, height) "
     "(imgprep/csrc/rawstore_py.c)"},
    {"raw_sample", py_raw_sample, METH_VARARGS, "raw_sample(record, width, height, resize, "
     "box, crop, flip, planar, max_pixels, out, kernel=-1) -> SampleResult "
     "(imgprep/csrc/rawstore_py.c)"},
    {"crop_draw", py_crop_draw, METH_VARARGS, "crop_draw(capsule, width, height, scale_lo, "
     "scale_hi, ratio_lo, ratio_hi, flip) -> CropDrawResult (imgprep/csrc/draws_py.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegcrop", "Crop-aware JPEG decoding (libjpeg-turbo).", -1,
    methods, NULL, NULL, NULL, NULL,
};

/* The status codes and limits of the cores, exported so that Python reads them rather than
 * copies them: imgprep.convert.native, imgprep.jpegcrop, imgprep.budget and imgprep.augment
 * (its op codes and filters, imgprep/csrc/augment.h). */
static const struct {
    const char *name;
    long value;
} CONSTANTS[] = {
    {"CONVERTED", CONVERTED}, {"DECLINED", DECLINED}, {"FAILED", FAILED},
    {"PATH_REGION", PATH_REGION}, {"PATH_WHOLE", PATH_WHOLE}, {"PATH_PIXELS", PATH_PIXELS},
    {"SAMPLE_DONE", SAMPLE_DONE}, {"SAMPLE_DECLINED", SAMPLE_DECLINED},
    {"SAMPLE_FAILED", SAMPLE_FAILED}, {"SAMPLE_REFUSED", SAMPLE_REFUSED},
    {"SAMPLE_REGION", SAMPLE_REGION}, {"SAMPLE_WHOLE", SAMPLE_WHOLE},
    {"PROBE_FAST", PROBE_FAST}, {"PROBE_PROGRESSIVE", PROBE_PROGRESSIVE},
    {"PROBE_COLOR", PROBE_COLOR}, {"PROBE_TAIL", PROBE_TAIL}, {"PROBE_BROKEN", PROBE_BROKEN},
    {"MAX_SIDE", MAX_SIDE},
    {"RAW_HEADER", RAW_HEADER}, {"RAW_VERSION", RAW_VERSION}, {"RAW_RGB24", RAW_RGB24},
    {"RAW_YUV420", RAW_YUV420},
    {"BUDGET_MAX_SCANS", BUDGET_MAX_SCANS}, {"BUDGET_MAX_BLOCK_SCANS", BUDGET_MAX_BLOCK_SCANS},
    {"BUDGET_BLOCKS_PER_BYTE", BUDGET_BLOCKS_PER_BYTE},
    {"BUDGET_ARITH_BLOCKS_PER_BYTE", BUDGET_ARITH_BLOCKS_PER_BYTE},
    {"AUG_OP_IDENTITY", AUG_OP_IDENTITY}, {"AUG_OP_AFFINE", AUG_OP_AFFINE},
    {"AUG_OP_BRIGHTNESS", AUG_OP_BRIGHTNESS}, {"AUG_OP_COLOR", AUG_OP_COLOR},
    {"AUG_OP_CONTRAST", AUG_OP_CONTRAST}, {"AUG_OP_SHARPNESS", AUG_OP_SHARPNESS},
    {"AUG_OP_POSTERIZE", AUG_OP_POSTERIZE}, {"AUG_OP_SOLARIZE", AUG_OP_SOLARIZE},
    {"AUG_OP_SOLARIZE_ADD", AUG_OP_SOLARIZE_ADD}, {"AUG_OP_AUTOCONTRAST", AUG_OP_AUTOCONTRAST},
    {"AUG_OP_EQUALIZE", AUG_OP_EQUALIZE}, {"AUG_OP_INVERT", AUG_OP_INVERT},
    {"AUG_NEAREST", AUG_NEAREST}, {"AUG_BILINEAR", AUG_BILINEAR}, {"AUG_BICUBIC", AUG_BICUBIC},
    {"AUG_MAX_OPS", AUG_MAX_OPS}, {"AUG_MAX_ARG", AUG_MAX_ARG},
    {"AUG_KERNEL_PORTABLE", AUG_KERNEL_PORTABLE}, {"AUG_KERNEL_AVX2", AUG_KERNEL_AVX2},
};

static int add_constants(PyObject *m) {
    for (size_t i = 0; i < sizeof CONSTANTS / sizeof CONSTANTS[0]; i++)
        if (PyModule_AddIntConstant(m, CONSTANTS[i].name, CONSTANTS[i].value) < 0) return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__jpegcrop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0 ||
                      imgprep_add_libjpeg_info(m) < 0 || add_constants(m) < 0 ||
                      results_add_types(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
