/* The resampler's Python bindings, listed in _jpegcrop.c's method table.
 *
 * resize(src, width, height, stride, channels, box, out_width, out_height, window, out,
 *        filter, flip, planar, kernel[, part]) -> None
 *     ``src``: a buffer of rows of ``width`` RGB (channels 3) or RGBX (4) pixels, ``stride``
 *     bytes apart; ``box``: (left, top, right, bottom) floats; ``window``: (left, top, cols,
 *     rows) of the out_width x out_height result, written into ``out`` (a writable buffer of
 *     exactly rows * cols * 3 bytes) as HWC, or CHW when ``planar``, mirrored when ``flip``.
 *     ``filter``: Pillow's number; ``kernel``: -1 (the best this CPU runs), 0 portable,
 *     1 AVX2, 2 AVX-512. Every integer is read signed and checked, buffer sizes come from
 *     the buffer protocol: a wrong argument raises ValueError (TypeError for a wrong type).
 *     ``part``: (origin_x, origin_y, full_width, full_height) when ``src`` is only the part
 *     at that origin of a larger image, ``box`` in that image's coordinates (resample.h).
 *     The GIL is released while it runs.
 *
 * resample_kernel(kernel) -> str
 *     The name of the kernel ``kernel`` runs as here ("portable", "avx2", "avx512");
 *     ValueError when this CPU cannot run it.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "bindings.h"
#include "resample.h"

/* ``o`` as a 64-bit integer; ValueError (naming ``name``) when it does not fit. */
static int as_int(PyObject *o, const char *name, int64_t *v) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        PyErr_Format(PyExc_ValueError, "%s is out of range", name);
        return -1;
    }
    if (x == -1 && PyErr_Occurred()) return -1;
    *v = (int64_t)x;
    return 0;
}

PyObject *rs_py_resize(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer src, out;
    PyObject *w, *h, *stride, *channels, *ow, *oh, *left, *top, *cols, *rows, *filter, *kernel;
    PyObject *ox = NULL, *oy = NULL, *fw = NULL, *fh = NULL;
    rs_job job;
    memset(&job, 0, sizeof job);
    if (!PyArg_ParseTuple(args, "y*OOOO(dddd)OO(OOOO)w*OppO|(OOOO)", &src, &w, &h, &stride,
                          &channels, &job.box[0], &job.box[1], &job.box[2], &job.box[3], &ow,
                          &oh, &left, &top, &cols, &rows, &out, &filter, &job.flip, &job.planar,
                          &kernel, &ox, &oy, &fw, &fh))
        return NULL;
    int ok = as_int(w, "width", &job.width) == 0 && as_int(h, "height", &job.height) == 0 &&
             as_int(stride, "stride", &job.stride) == 0 &&
             as_int(channels, "channels", &job.channels) == 0 &&
             as_int(ow, "out_width", &job.out_width) == 0 &&
             as_int(oh, "out_height", &job.out_height) == 0 &&
             as_int(left, "window left", &job.left) == 0 &&
             as_int(top, "window top", &job.top) == 0 &&
             as_int(cols, "window cols", &job.cols) == 0 &&
             as_int(rows, "window rows", &job.rows) == 0 &&
             as_int(filter, "filter", &job.filter) == 0 &&
             as_int(kernel, "kernel", &job.kernel) == 0 &&
             (ox == NULL || (as_int(ox, "origin x", &job.origin_x) == 0 &&
                             as_int(oy, "origin y", &job.origin_y) == 0 &&
                             as_int(fw, "full width", &job.full_width) == 0 &&
                             as_int(fh, "full height", &job.full_height) == 0));
    PyObject *result = NULL;
    if (ok) {
        char message[256];
        int rc;
        job.src = src.buf;
        job.src_len = (size_t)src.len;
        job.out = out.buf;
        job.out_len = (size_t)out.len;
        Py_BEGIN_ALLOW_THREADS
        rc = rs_resize(&job, message, sizeof message);
        Py_END_ALLOW_THREADS
        result = none_or_raise(rc == RS_OK, rc == RS_ENOMEM, message);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&src);
    return result;
}

PyObject *rs_py_kernel(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *o;
    int64_t requested;
    if (!PyArg_ParseTuple(args, "O", &o) || as_int(o, "kernel", &requested) < 0) return NULL;
    int kernel = rs_resolve_kernel(requested);
    if (kernel < 0) {
        PyErr_Format(PyExc_ValueError, "kernel %lld cannot run here (this CPU runs up to %s)",
                     (long long)requested, rs_kernel_name(rs_resolve_kernel(RS_AUTO)));
        return NULL;
    }
    return PyUnicode_FromString(rs_kernel_name(kernel));
}
