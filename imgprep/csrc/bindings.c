/* Python bindings of the convert path (imgprep/csrc/bindings.h): arguments are checked here,
 * the work runs without the GIL in the plain C files beside this one.
 *
 * encode(pixels, width, height, channels, quality) -> bytes
 *     ``pixels``: width x height pixels, ``channels`` bytes each (3: RGB, 4: RGBX), in rows;
 *     the JPEG that convert writes for them (imgprep/csrc/encode.h).
 *
 * turbo_version() -> int
 *     The libjpeg-turbo this module was built against, as 2001005 for 2.1.5 (0: not turbo).
 */
#define Py_LIMITED_API 0x030B0000
#include "bindings.h"

#include <stdlib.h>

#include <jpeglib.h>

#include "encode.h"

enum { MAX_SIDE = 65500 };  /* JPEG_MAX_DIMENSION */

PyObject *py_encode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    int width, height, channels, quality;
    if (!PyArg_ParseTuple(args, "y*iiii", &view, &width, &height, &channels, &quality))
        return NULL;
    PyObject *result = NULL;
    if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE) {
        PyErr_Format(PyExc_ValueError, "width and height must be 1..%d, not %dx%d", MAX_SIDE,
                     width, height);
    } else if (channels != 3 && channels != 4) {
        PyErr_Format(PyExc_ValueError, "channels must be 3 (RGB) or 4 (RGBX), not %d", channels);
    } else if (quality < 1 || quality > 100) {
        PyErr_Format(PyExc_ValueError, "quality must be 1..100, not %d", quality);
    } else if ((size_t)view.len != (size_t)width * (size_t)height * (size_t)channels) {
        PyErr_Format(PyExc_ValueError, "pixels hold %zd bytes, %dx%dx%d needs %zu", view.len,
                     width, height, channels, (size_t)width * (size_t)height * (size_t)channels);
    } else {
        OutBuf out = {NULL, 0, 0};
        char message[JMSG_LENGTH_MAX];
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = encode_jpeg(view.buf, (unsigned)width, (unsigned)height,
                         (size_t)width * (size_t)channels, channels, quality, &out, message);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            PyErr_Format(PyExc_ValueError, "cannot encode the JPEG (%s)", message);
        else
            result = PyBytes_FromStringAndSize((const char *)out.data, (Py_ssize_t)out.len);
        free(out.data);
    }
    PyBuffer_Release(&view);
    return result;
}

PyObject *py_turbo_version(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    return PyLong_FromLong(LIBJPEG_TURBO_VERSION_NUMBER);
#else
    return PyLong_FromLong(0);
#endif
}
