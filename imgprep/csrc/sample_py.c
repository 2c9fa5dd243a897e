/* The loader's per-sample call, listed in _jpegcrop.c's method table (imgprep/csrc/sample.h).
 *
 * sample(data, width, height, draft, resize, box, crop, flip, planar, whole, max_pixels, out)
 *     -> SampleResult(status, path, message, scan)
 *     ``data``: a JPEG's bytes, whose header says ``width`` x ``height``; ``draft``: (w, h)
 *     asked of Pillow's draft, or (0, 0); ``resize``: (w, h) the box is resampled to (bilinear),
 *     or (0, 0); ``box``: (left, top, right, bottom) floats in the original's pixels, or None
 *     (the whole image); ``crop``: (left, top, right, bottom) of the resampled image (of the
 *     decoded one without a resize); ``out``: a writable buffer of exactly the crop's
 *     width x height x 3 bytes, written as HWC, or CHW when ``planar``, mirrored when
 *     ``flip``. ``whole``: decode all of it and read the data to its end (a file the
 *     crop-aware probe declines). ``max_pixels``: a larger original fails (0: no limit).
 *     The statuses are the module's SAMPLE_* constants.
 *     status 0: done (path 0: a region was decoded, 1: the whole image, read to its end:
 *     ``scan`` says what that found, as probe's report; else None); 1: declined (a colour
 *     space libjpeg makes no RGB of: decode it with Pillow); 2: failed (``message``); 3:
 *     refused, the image breaks its budget (imgprep/csrc/budget.h; ``message``).
 *     Bad arguments raise ValueError (checked before any byte is read); the GIL is released
 *     while it runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "bindings.h"
#include "results.h"
#include "sample.h"

/* What ``sample_jpeg`` did, as the module's SampleResult. */
static PyObject *sample_result(const SampleResult *r) {
    PyObject *scan = r->status == SAMPLE_DONE && r->path == SAMPLE_WHOLE
        ? scan_dict(&r->scan, "", 0) : Py_NewRef(Py_None);
    if (scan == NULL) return NULL;
    return named_result(RESULT_SAMPLE, Py_BuildValue("iisN", r->status, r->path, r->message,
                                                     scan));
}

/* ``box`` (None or four floats) into ``g``; -1 with an exception set. */
static int read_box(PyObject *box, SampleGeometry *g) {
    g->has_box = box != Py_None;
    if (!g->has_box) return 0;
    if (!PyTuple_Check(box)) {
        PyErr_SetString(PyExc_TypeError, "box must be None or a tuple of four floats");
        return -1;
    }
    return PyArg_ParseTuple(box, "dddd", &g->box[0], &g->box[1], &g->box[2], &g->box[3]) ? 0
                                                                                        : -1;
}

PyObject *py_sample(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data, out;
    PyObject *box;
    unsigned long long max_pixels;
    SampleGeometry g;
    memset(&g, 0, sizeof g);
    if (!PyArg_ParseTuple(args, "y*LL(LL)(LL)O(LLLL)pppKw*", &data, &g.width, &g.height,
                          &g.draft_w, &g.draft_h, &g.resize_w, &g.resize_h, &box, &g.crop[0],
                          &g.crop[1], &g.crop[2], &g.crop[3], &g.flip, &g.planar, &g.whole,
                          &max_pixels, &out))
        return NULL;
    g.max_pixels = max_pixels;
    PyObject *result = NULL;
    SampleResult r;
    if (read_box(box, &g) == 0) {
        Py_BEGIN_ALLOW_THREADS
        sample_jpeg(data.buf, (size_t)data.len, &g, out.buf, (size_t)out.len, &r);
        sample_trim();
        Py_END_ALLOW_THREADS
        if (r.status == SAMPLE_INVALID)
            PyErr_SetString(PyExc_ValueError, r.message);
        else
            result = sample_result(&r);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return result;
}
