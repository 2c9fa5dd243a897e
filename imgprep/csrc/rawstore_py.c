/* Stored pixels' calls, listed in _jpegcrop.c's method table (imgprep/csrc/rawformat.h says
 * what a record is).
 *
 * raw_record(jpeg, mode, max_pixels) -> RawRecordResult(status, message, record, mode, width,
 *                                                       height)
 *     The JPEG's full-scale decode as a record of ``mode`` (RAW_RGB24, or RAW_YUV420: its own
 *     Y, Cb and Cr planes where it is YCbCr 4:2:0, else RGB24, which ``mode`` then says);
 *     status SAMPLE_DONE with ``record`` (bytes), SAMPLE_FAILED or SAMPLE_REFUSED (the
 *     per-image budget, or more than ``max_pixels`` pixels; 0: no limit) with ``message``.
 *     (imgprep/csrc/rawstore.h)
 *
 * raw_sample(record, width, height, resize, box, crop, flip, planar, max_pixels, out,
 *            kernel=-1) -> SampleResult(status, path, message, None)
 *     The loader's call for a stored-pixel sample: ``width`` x ``height`` as the record's
 *     header says (the geometry was drawn from it), ``resize``, ``box``, ``crop``, ``flip``,
 *     ``planar`` and ``out`` as sample()'s (imgprep/csrc/sample_py.c). status SAMPLE_DONE, or
 *     SAMPLE_FAILED when the record is not one (its header, or a length that is not its
 *     header's); a geometry that is none or does not fit the record raises ValueError before
 *     any pixel is read. ``kernel``: the resampler's, as resize()'s (-1: the best here).
 *     (imgprep/csrc/rawsample.h)
 *
 * The GIL is released while each runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "bindings.h"
#include "rawsample.h"
#include "rawstore.h"
#include "results.h"

PyObject *py_raw_record(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    int mode;
    unsigned long long max_pixels;
    if (!PyArg_ParseTuple(args, "y*iK", &data, &mode, &max_pixels)) return NULL;
    RawStored r;
    Py_BEGIN_ALLOW_THREADS
    raw_store(data.buf, (size_t)data.len, mode, max_pixels, &r);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyObject *record = r.status == SAMPLE_DONE
        ? PyBytes_FromStringAndSize((const char *)r.record, (Py_ssize_t)r.len)
        : Py_NewRef(Py_None);
    raw_store_trim();
    if (record == NULL) return NULL;
    return named_result(RESULT_RAW, Py_BuildValue("isNiII", r.status, r.message, record,
                                                  r.mode, r.width, r.height));
}

PyObject *py_raw_sample(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data, out;
    PyObject *box;
    unsigned long long max_pixels;
    long long kernel = -1;
    SampleGeometry g;
    memset(&g, 0, sizeof g);
    if (!PyArg_ParseTuple(args, "y*LL(LL)O(LLLL)ppKw*|L", &data, &g.width, &g.height,
                          &g.resize_w, &g.resize_h, &box, &g.crop[0], &g.crop[1], &g.crop[2],
                          &g.crop[3], &g.flip, &g.planar, &max_pixels, &out, &kernel))
        return NULL;
    g.max_pixels = max_pixels;
    g.has_box = box != Py_None;
    PyObject *result = NULL;
    if (g.has_box && (!PyTuple_Check(box) ||
                      !PyArg_ParseTuple(box, "dddd", &g.box[0], &g.box[1], &g.box[2],
                                        &g.box[3]))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "box must be None or a tuple of four floats");
    } else {
        SampleResult r;
        Py_BEGIN_ALLOW_THREADS
        sample_raw(data.buf, (size_t)data.len, &g, out.buf, (size_t)out.len, kernel, &r);
        sample_raw_trim();
        Py_END_ALLOW_THREADS
        if (r.status == SAMPLE_INVALID)
            PyErr_SetString(PyExc_ValueError, r.message);
        else
            result = named_result(RESULT_SAMPLE, Py_BuildValue("iisO", r.status, r.path,
                                                               r.message, Py_None));
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&data);
    return result;
}
