/* Crop-aware JPEG decoding with libjpeg-turbo's partial decompression.
 *
 * probe(data) -> (width, height, code)
 *     Reads the headers. code 0: a sequential (not progressive) YCbCr or grayscale JPEG whose
 *     bytes after the start of scan hold only entropy-coded data, restart markers and the
 *     final EOI, so that stopping early cannot hide an error a full decode would raise.
 *     Other codes name why the fast path declines (see imgprep/jpegcrop.py).
 *
 * decode(data, frame, scale, x0, y0, x1, y1) -> (left, top, right, bottom, warnings)
 *     Decodes, at 1/scale, the rows and iMCU columns that cover [x0, x1) x [y0, y1) (output
 *     pixels) into ``frame``, a writable RGBX buffer of the whole scaled image (4 bytes a
 *     pixel, rows of scaled-width pixels), at their place in the image. The same library,
 *     DCT and upsampling as a full decode, so the pixels of that region are the full
 *     decode's (tested on every region shape, subsampling and scale). Returns the region actually written and the count of libjpeg warnings
 *     (corrupt data); the caller decodes the whole image instead when it is not zero.
 *
 * pack(src, src_width, x0, y0, width, height, out, flip, planar)
 *     Copies the width x height pixels at (x0, y0) of a 4-byte-a-pixel image (RGBX: the
 *     frame above, or a Pillow image exported through the Arrow C data interface) into
 *     ``out`` as RGB, rows of pixels (HWC) or three planes (CHW), mirrored when ``flip``:
 *     one pass instead of a flip, a split and a copy.
 *
 * Built for the stable ABI (3.11+), so one build serves later Pythons. The GIL is released
 * while libjpeg runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#include "csrc/bindings.h"
#include "csrc/resample.h"

enum { FAST = 0, PROGRESSIVE = 1, COLOR = 2, TAIL = 3, BROKEN = 4 };

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;
    char message[JMSG_LENGTH_MAX];
} ErrorMgr;

static void on_error(j_common_ptr cinfo) {
    ErrorMgr *err = (ErrorMgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) ((ErrorMgr *)cinfo->err)->warnings++;
}

static void setup(struct jpeg_decompress_struct *cinfo, ErrorMgr *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warnings = 0;
    err->message[0] = '\0';
    jpeg_create_decompress(cinfo);
}

/* Whether the bytes from ``p`` to the end are entropy-coded data with restart markers only,
 * then EOI as the last two bytes. */
static int clean_tail(const unsigned char *p, const unsigned char *end) {
    if (end - p < 2 || end[-2] != 0xFF || end[-1] != 0xD9) return 0;
    end -= 2;
    while (p < end) {
        const unsigned char *ff = memchr(p, 0xFF, (size_t)(end - p));
        if (ff == NULL) return 1;
        p = ff + 1;
        while (p < end && *p == 0xFF) p++;  /* fill bytes */
        if (p == end) return 0;
        if (*p != 0x00 && (*p < 0xD0 || *p > 0xD7)) return 0;  /* a marker: not RSTn */
        p++;
    }
    return 1;
}

static PyObject *probe(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    struct jpeg_decompress_struct cinfo;
    ErrorMgr err;
    volatile int code = FAST;
    volatile long width = 0, height = 0;
    setup(&cinfo, &err);
    if (setjmp(err.jump)) {
        code = BROKEN;
    } else {
        jpeg_mem_src(&cinfo, view.buf, (unsigned long)view.len);
        jpeg_read_header(&cinfo, TRUE);
        width = (long)cinfo.image_width;
        height = (long)cinfo.image_height;
        if (cinfo.progressive_mode || cinfo.arith_code)
            code = PROGRESSIVE;
        else if (!((cinfo.num_components == 3 && cinfo.jpeg_color_space == JCS_YCbCr) ||
                   (cinfo.num_components == 1 && cinfo.jpeg_color_space == JCS_GRAYSCALE)))
            code = COLOR;
        else if (!clean_tail(cinfo.src->next_input_byte,
                             (const unsigned char *)view.buf + view.len))
            code = TAIL;
    }
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&view);
    return Py_BuildValue("lli", width, height, code);
}

typedef struct {
    JDIMENSION left, top, right, bottom;
} Region;

/* The decode proper; returns 0, or -1 with the libjpeg message in err->message. */
static int decode_region(const unsigned char *data, size_t len, unsigned char *frame,
                         size_t frame_len, int scale, Region *r, ErrorMgr *err) {
    struct jpeg_decompress_struct cinfo;
    setup(&cinfo, err);
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = JCS_EXT_RGBX;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)scale;
    jpeg_start_decompress(&cinfo);
    JDIMENSION w = cinfo.output_width, h = cinfo.output_height;
    if ((size_t)w * h * 4 > frame_len) {
        snprintf(err->message, JMSG_LENGTH_MAX, "frame holds %zu bytes, the image needs %zu",
                 frame_len, (size_t)w * h * 4);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    /* libjpeg-turbo rounds the columns out to iMCU boundaries, and fancy upsampling treats
     * the cropped columns' outer edges as the image's edges: one more column on each side
     * keeps them out of the region. Skipped rows keep their context (libjpeg reads what
     * the upsampler needs), and rows past ``bottom`` only feed the rows above them. */
    JDIMENSION left = r->left > 0 ? r->left - 1 : 0;
    JDIMENSION right = r->right + 1 < w ? r->right + 1 : w;
    JDIMENSION top = r->top, bottom = r->bottom < h ? r->bottom : h;
    JDIMENSION width = right - left;
    if (top >= bottom || left >= right) {
        snprintf(err->message, JMSG_LENGTH_MAX, "the region lies outside the %ux%u image",
                 (unsigned)w, (unsigned)h);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (left > 0 || right < w) jpeg_crop_scanline(&cinfo, &left, &width);
    if (top > 0) jpeg_skip_scanlines(&cinfo, top);
    while (cinfo.output_scanline < bottom) {
        JSAMPROW row = frame + ((size_t)cinfo.output_scanline * w + left) * 4;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    r->left = left;
    r->top = top;
    r->right = left + width;
    r->bottom = bottom;
    return 0;
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data, frame;
    int scale;
    unsigned int x0, y0, x1, y1;
    if (!PyArg_ParseTuple(args, "y*w*iIIII", &data, &frame, &scale, &x0, &y0, &x1, &y1))
        return NULL;
    PyObject *result = NULL;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyErr_SetString(PyExc_ValueError, "scale must be 1, 2, 4 or 8");
    } else if (x0 >= x1 || y0 >= y1) {
        PyErr_SetString(PyExc_ValueError, "the region must not be empty");
    } else {
        ErrorMgr err;
        Region r = {x0, y0, x1, y1};
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = decode_region(data.buf, (size_t)data.len, frame.buf, (size_t)frame.len, scale, &r,
                           &err);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            PyErr_Format(PyExc_ValueError, "cannot decode the JPEG (%s)", err.message);
        else
            result = Py_BuildValue("IIIIi", r.left, r.top, r.right, r.bottom, err.warnings);
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
    if (a->release == NULL || a->n_children != 1 || a->children[0]->n_buffers != 2 ||
        a->children[0]->buffers[1] == NULL) {
        PyErr_SetString(PyExc_ValueError, "not a 4-byte-a-pixel image exported by Pillow");
        return NULL;
    }
    const struct ArrowArray *values = a->children[0];
    *len = (Py_ssize_t)(a->length * 4);
    return (const unsigned char *)values->buffers[1] + values->offset + a->offset * 4;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
enum { SHIFT_R = 24, SHIFT_G = 16, SHIFT_B = 8 };
#else
enum { SHIFT_R = 0, SHIFT_G = 8, SHIFT_B = 16 };
#endif

static void pack_rows(const unsigned char *src, size_t stride, unsigned w, unsigned h,
                      unsigned char *out, int flip, int planar) {
    size_t plane = (size_t)w * h;
    ptrdiff_t step = flip ? -4 : 4;
    for (unsigned y = 0; y < h; y++) {
        const unsigned char *p = src + y * stride + (flip ? (size_t)(w - 1) * 4 : 0);
        uint32_t v;
        if (planar) {
            unsigned char *r = out + (size_t)y * w, *g = r + plane, *b = g + plane;
            for (unsigned x = 0; x < w; x++, p += step) {
                memcpy(&v, p, 4);  /* one load; the bytes R, G, B, X in memory order */
                r[x] = (unsigned char)(v >> SHIFT_R);
                g[x] = (unsigned char)(v >> SHIFT_G);
                b[x] = (unsigned char)(v >> SHIFT_B);
            }
        } else {
            unsigned char *d = out + (size_t)y * w * 3;
            for (unsigned x = 0; x + 1 < w; x++, p += step, d += 3) {
                memcpy(&v, p, 4);
                memcpy(d, &v, 4);  /* the 4th byte is overwritten by the next pixel */
            }
            memcpy(d, p, 3);
        }
    }
}

static PyObject *pack(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *src;
    Py_buffer out, view = {0};
    unsigned int src_w, x0, y0, w, h;
    int flip, planar;
    if (!PyArg_ParseTuple(args, "OIIIIIw*pp", &src, &src_w, &x0, &y0, &w, &h, &out, &flip,
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
    if (pixels != NULL) {
        size_t stride = (size_t)src_w * 4;
        if (w == 0 || h == 0 || x0 + w > src_w ||
            (size_t)(y0 + h - 1) * stride + (size_t)(x0 + w) * 4 > (size_t)len) {
            PyErr_SetString(PyExc_ValueError, "the box lies outside the source image");
        } else if ((size_t)out.len != (size_t)w * h * 3) {
            PyErr_Format(PyExc_ValueError, "out holds %zd bytes, the box needs %zu", out.len,
                         (size_t)w * h * 3);
        } else {
            Py_BEGIN_ALLOW_THREADS
            pack_rows(pixels + y0 * stride + (size_t)x0 * 4, stride, w, h, out.buf, flip,
                      planar);
            Py_END_ALLOW_THREADS
            result = Py_NewRef(Py_None);
        }
    }
    if (have_view) PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"probe", probe, METH_VARARGS, "probe(data) -> (width, height, code)"},
    {"decode", decode, METH_VARARGS,
     "decode(data, frame, scale, x0, y0, x1, y1) -> (left, top, right, bottom, warnings)"},
    {"pack", pack, METH_VARARGS,
     "pack(src, src_width, x0, y0, width, height, out, flip, planar) -> None"},
    {"encode", py_encode, METH_VARARGS,
     "encode(pixels, width, height, channels, quality) -> bytes"},
    {"turbo_version", py_turbo_version, METH_NOARGS, "turbo_version() -> int"},
    {"resize", rs_py_resize, METH_VARARGS,
     "resize(src, width, height, stride, channels, box, out_width, out_height, window, out, "
     "filter, flip, planar, kernel) -> None (imgprep/csrc/resample_py.c)"},
    {"resample_kernel", rs_py_kernel, METH_VARARGS, "resample_kernel(kernel) -> str"},
    {"convert", py_convert, METH_VARARGS, "convert(data, ...) -> (status, message, jpeg, ...)"},
    {"finish", py_finish, METH_VARARGS, "finish(rgb, ...) -> (status, message, jpeg, ...)"},
    {"frame", py_frame, METH_VARARGS, "frame(data, ...) -> (status, message, rgbx, ...)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegcrop", "Crop-aware JPEG decoding (libjpeg-turbo).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegcrop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
