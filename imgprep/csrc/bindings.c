/* Python bindings of the convert path (imgprep/csrc/bindings.h): arguments are checked here,
 * the work runs without the GIL in the plain C files beside this one.
 *
 * encode(pixels, width, height, channels, quality, sampling=()) -> bytes
 *     ``pixels``: width x height pixels, ``channels`` bytes each (3: RGB, 4: RGBX), in rows;
 *     the JPEG that convert writes for them (imgprep/csrc/encode.h); ``sampling``: () or
 *     the Y, Cb and Cr components' (h, v) sampling factors, 1..4 each, as six ints.
 *
 * convert(data, size, resize, filter, quality, exif_transpose, whole, histogram, pixels,
 *         max_pixels, bomb_pixels) -> (status, message, jpeg, width, height, components, mpf,
 *                                      path, levels, rgb, out_width, out_height, scan)
 *     A JPEG's bytes to convert's output (imgprep/csrc/convert.h): ``status`` 0 converted
 *     (``jpeg`` the output), 1 declined (decode it with Pillow, then call ``finish``), 2
 *     failed (``message`` says why). ``resize`` 0: center-crop, 1: short-side; ``whole``:
 *     never decode only a region. ``levels`` (when ``histogram``): the output's R, G, B level
 *     counts as 768 native int64; ``rgb`` (when ``pixels``): the output's pixels, in rows;
 *     ``scan``: what reading the JPEG's data to its end found, {"warnings": libjpeg's
 *     warnings, "first": the first one's text, "eof": the data ran out before an EOI marker,
 *     "hit_marker": a marker came before the scan's last block, "padding": the most bytes
 *     skipped before one marker, "trailing": bytes after the EOI marker, "error": ""} (all
 *     zero for pixels from ``finish``).
 *
 * finish(rgb, width, height, orig_width, orig_height, size, resize, filter, quality,
 *        histogram, pixels, max_pixels) -> the same tuple
 *     The same from pixels decoded elsewhere (``rgb``: width x height x 3 bytes, in rows).
 *
 * frame(data, size, resize, filter, exif_transpose, whole, max_pixels, bomb_pixels)
 *     -> (status, message, rgbx, width, height, box, out_width, out_height, path)
 *     The decode stage alone: the decoded pixels as displayed, and the box the resample
 *     reads of them.
 */
#define Py_LIMITED_API 0x030B0000
#include "bindings.h"

#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "convert.h"
#include "encode.h"
#include "bounds.h"
#include "results.h"


/* Checks the options that every entry takes; 0, or -1 with an exception set. */
PyObject *none_or_raise(int ok, int nomem, const char *message) {
    if (ok) return Py_NewRef(Py_None);
    if (nomem) return PyErr_NoMemory();
    PyErr_SetString(PyExc_ValueError, message);
    return NULL;
}

static int check_opts(const ConvertOpts *o) {
    if (o->size < 1 || o->size > MAX_SIDE)
        PyErr_Format(PyExc_ValueError, "size must be 1..%d, not %d", MAX_SIDE, o->size);
    else if (o->resize != CENTER_CROP && o->resize != SHORT_SIDE)
        PyErr_Format(PyExc_ValueError, "resize must be 0 (center-crop) or 1 (short-side), "
                                       "not %d", o->resize);
    else if (!convert_filter_known(o->filter))
        PyErr_Format(PyExc_ValueError, "no resampling filter %d", o->filter);
    else if (o->quality < 1 || o->quality > 100)
        PyErr_Format(PyExc_ValueError, "quality must be 1..100, not %d", o->quality);
    else if (o->max_pixels < 1)
        PyErr_SetString(PyExc_ValueError, "max_pixels must be at least 1");
    else
        return 0;
    return -1;
}

static PyObject *bytes_or_none(const void *p, size_t n, int want) {
    return want ? PyBytes_FromStringAndSize(p, (Py_ssize_t)n) : Py_NewRef(Py_None);
}

/* ``r`` as the module's ConvertResult, the thread's scratch given back after (it holds the
 * outputs until then). */
static PyObject *answer(const ConvertResult *r, int want_levels, int want_pixels) {
    int ok = r->status == CONVERTED;
    PyObject *jpeg = bytes_or_none(r->jpeg, r->jpeg_len, ok);
    PyObject *levels = bytes_or_none(r->histogram, sizeof r->histogram, ok && want_levels);
    size_t n = (size_t)r->out_width * r->out_height * 3;
    PyObject *rgb = bytes_or_none(r->pixels, n, ok && want_pixels);
    PyObject *scan = scan_dict(&r->scan, "", 0);
    PyObject *out = NULL;
    if (jpeg != NULL && levels != NULL && rgb != NULL && scan != NULL)
        out = named_result(RESULT_CONVERT, Py_BuildValue(
            "isOIIiiiOOIIO", r->status, r->message, jpeg, r->width, r->height, r->components,
            r->mpf, r->path, levels, rgb, r->out_width, r->out_height, scan));
    Py_XDECREF(scan);
    Py_XDECREF(jpeg);
    Py_XDECREF(levels);
    Py_XDECREF(rgb);
    convert_trim();
    return out;
}

PyObject *scan_dict(const Scan *s, const char *error, int refused) {
    return Py_BuildValue("{s:i,s:s,s:i,s:i,s:l,s:l,s:s,s:i}", "warnings", s->warnings,
                         "first", s->first, "eof", s->eof, "hit_marker", s->hit_marker,
                         "padding", s->padding, "trailing", s->trailing, "error", error,
                         "refused", refused);
}

PyObject *py_encode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    int width, height, channels, quality, sampling[6] = {0};
    PyObject *factors = NULL;
    if (!PyArg_ParseTuple(args, "y*iiii|O!", &view, &width, &height, &channels, &quality,
                          &PyTuple_Type, &factors))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t nf = factors != NULL ? PyTuple_Size(factors) : 0;
    int bad_factor = nf != 0 && nf != 6;
    for (Py_ssize_t i = 0; !bad_factor && i < nf; i++) {
        long f = PyLong_AsLong(PyTuple_GetItem(factors, i));
        bad_factor = f < 1 || f > 4;
        sampling[i] = (int)f;
    }
    if (PyErr_Occurred()) {
        /* a factor that is not an int: the exception is set */
    } else if (bad_factor) {
        PyErr_SetString(PyExc_ValueError, "sampling must be () or six factors in 1..4 "
                                          "(h, v of Y, Cb, Cr)");
    } else if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE) {
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
                         (size_t)width * (size_t)channels, channels, quality,
                         nf ? sampling : NULL, &out, message);
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

PyObject *py_convert(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    ConvertOpts o;
    int want_pixels;
    unsigned long long max_pixels, bomb_pixels;
    if (!PyArg_ParseTuple(args, "y*iiiippppKK", &data, &o.size, &o.resize, &o.filter,
                          &o.quality, &o.exif_transpose, &o.whole, &o.histogram, &want_pixels,
                          &max_pixels, &bomb_pixels))
        return NULL;
    o.max_pixels = max_pixels;
    o.bomb_pixels = bomb_pixels;
    ConvertResult r;
    int ok = check_opts(&o) == 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        convert_jpeg(data.buf, (size_t)data.len, &o, &r);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    return ok ? answer(&r, o.histogram, want_pixels) : NULL;
}

PyObject *py_finish(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    ConvertOpts o = {0};
    int width, height, orig_width, orig_height, want_pixels;
    unsigned long long max_pixels;
    if (!PyArg_ParseTuple(args, "y*iiiiiiiippK", &view, &width, &height, &orig_width,
                          &orig_height, &o.size, &o.resize, &o.filter, &o.quality, &o.histogram,
                          &want_pixels, &max_pixels))
        return NULL;
    o.max_pixels = max_pixels;
    PyObject *result = NULL;
    if (check_opts(&o) != 0) {
        /* the exception is set */
    } else if (width < 1 || height < 1 || orig_width < 1 || orig_height < 1) {
        PyErr_Format(PyExc_ValueError, "sizes must be at least 1, not %dx%d (original %dx%d)",
                     width, height, orig_width, orig_height);
    } else if ((size_t)view.len != (size_t)width * (size_t)height * 3) {
        PyErr_Format(PyExc_ValueError, "rgb holds %zd bytes, %dx%d RGB needs %zu", view.len,
                     width, height, (size_t)width * (size_t)height * 3);
    } else {
        ConvertResult r;
        Py_BEGIN_ALLOW_THREADS
        convert_rgb(view.buf, (unsigned)width, (unsigned)height, (unsigned)orig_width,
                    (unsigned)orig_height, &o, &r);
        Py_END_ALLOW_THREADS
        result = answer(&r, o.histogram, want_pixels);
    }
    PyBuffer_Release(&view);
    return result;
}

PyObject *py_frame(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    ConvertOpts o = {0};
    unsigned long long max_pixels, bomb_pixels;
    if (!PyArg_ParseTuple(args, "y*iiiKppK", &data, &o.size, &o.resize, &o.filter,
                          &max_pixels, &o.exif_transpose, &o.whole, &bomb_pixels))
        return NULL;
    o.quality = 90;
    o.max_pixels = max_pixels;
    o.bomb_pixels = bomb_pixels;
    PyObject *result = NULL;
    if (check_opts(&o) == 0) {
        ConvertResult r;
        Decoded d;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = convert_decode(data.buf, (size_t)data.len, &o, &r, &d);
        Py_END_ALLOW_THREADS
        if (rc != CONVERTED) {
            result = named_result(RESULT_FRAME, Py_BuildValue(
                "isOIIOIIi", rc, r.message, Py_None, 0u, 0u, Py_None, 0u, 0u, r.path));
        } else {
            PyObject *rgbx = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((size_t)d.shown.width *
                                                                         d.shown.height * 4));
            if (rgbx != NULL) {
                unsigned char *p = (unsigned char *)PyBytes_AsString(rgbx);
                for (unsigned y = 0; y < d.shown.height; y++)
                    memcpy(p + (size_t)y * d.shown.width * 4,
                           d.shown.pixels + (size_t)y * d.shown.stride,
                           (size_t)d.shown.width * 4);
                result = named_result(RESULT_FRAME, Py_BuildValue(
                    "isNII(dddd)IIi", rc, r.message, rgbx, d.shown.width, d.shown.height,
                    d.box[0] - d.shown.x, d.box[1] - d.shown.y, d.box[2] - d.shown.x,
                    d.box[3] - d.shown.y, d.out_width, d.out_height, r.path));
            }
        }
        convert_trim();
    }
    PyBuffer_Release(&data);
    return result;
}
