/* The augmentation's Python binding, listed in _jpegcrop.c's method table
 * (imgprep/csrc/augment.h; imgprep/augment.py is its Python side).
 *
 * augment(out, width, height, planar, ops[, kernel]) -> None
 *     ``out``: a writable C-contiguous buffer of exactly width x height x 3 bytes, an RGB
 *     image as three planes (``planar``) or as rows of pixels, changed in place; ``ops``: a
 *     tuple of at most AUG_MAX_OPS ops, carried out in order, each a tuple (kind, args,
 *     resample, fill): ``kind`` an AUG_OP_* code, ``args`` a tuple of numbers (augment.h says
 *     which, each finite and at most AUG_MAX_ARG in size), ``resample`` AUG_NEAREST,
 *     AUG_BILINEAR or AUG_BICUBIC and ``fill`` three ints in 0..255 (both read and checked
 *     for affine only); ``kernel``: AUG_KERNEL_AUTO (-1, the default: the best this CPU
 *     runs), AUG_KERNEL_PORTABLE or AUG_KERNEL_AVX2, each giving the same bytes. Every
 *     argument is checked before a byte is touched: ValueError (TypeError for a wrong type);
 *     MemoryError where the image's copy cannot be had. The GIL is released while the ops
 *     run.
 *
 * augment_kernel(kernel) -> str
 *     The name of the kernel ``kernel`` runs as here ("portable", "avx2"); ValueError when
 *     this CPU cannot run it.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

#include "augment.h"
#include "bindings.h"

/* The op ``item`` (the ``i``th) into ``op``; -1 with an exception set. */
static int read_op(PyObject *item, Py_ssize_t i, AugOp *op) {
    PyObject *args;
    if (!PyTuple_Check(item)) {
        PyErr_Format(PyExc_TypeError, "op %zd must be a tuple (kind, args, resample, fill)", i);
        return -1;
    }
    if (!PyArg_ParseTuple(item, "iO!i(iii)", &op->kind, &PyTuple_Type, &args, &op->resample,
                          &op->fill[0], &op->fill[1], &op->fill[2]))
        return -1;
    Py_ssize_t n = PyTuple_Size(args);
    if (n > AUG_MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "op %zd has %zd arguments; no op takes more than %d", i,
                     n, AUG_MAX_ARGS);
        return -1;
    }
    op->nargs = (int)n;
    for (Py_ssize_t k = 0; k < n; k++) {
        double v = PyFloat_AsDouble(PyTuple_GetItem(args, k));
        if (v == -1.0 && PyErr_Occurred()) return -1;
        op->args[k] = v;
    }
    return 0;
}

PyObject *py_augment(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer out;
    long long width, height;
    int planar;
    PyObject *ops;
    int kernel = AUG_KERNEL_AUTO;
    if (!PyArg_ParseTuple(args, "w*LLpO!|i", &out, &width, &height, &planar, &PyTuple_Type,
                          &ops, &kernel))
        return NULL;
    AugOp list[AUG_MAX_OPS];
    memset(list, 0, sizeof list);
    Py_ssize_t n = PyTuple_Size(ops);
    int ok = n <= AUG_MAX_OPS;
    if (!ok)
        PyErr_Format(PyExc_ValueError, "%zd ops in one call; at most %d", n, AUG_MAX_OPS);
    for (Py_ssize_t i = 0; ok && i < n; i++)
        ok = read_op(PyTuple_GetItem(ops, i), i, &list[i]) == 0;
    PyObject *result = NULL;
    if (ok) {
        AugImage im = {.pixels = out.buf, .len = (size_t)out.len, .width = width,
                       .height = height, .planar = planar, .kernel = kernel};
        char message[AUG_MESSAGE];
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = aug_run(&im, list, (size_t)n, message, sizeof message);
        aug_trim();
        Py_END_ALLOW_THREADS
        result = none_or_raise(rc == AUG_OK, rc == AUG_ENOMEM, message);
    }
    PyBuffer_Release(&out);
    return result;
}

PyObject *py_augment_kernel(PyObject *Py_UNUSED(self), PyObject *args) {
    long long requested;
    if (!PyArg_ParseTuple(args, "L", &requested)) return NULL;
    int kernel = aug_resolve_kernel(requested);
    if (kernel < 0) {
        PyErr_Format(PyExc_ValueError, "kernel %lld cannot run here (this CPU runs up to %s)",
                     requested, aug_kernel_name(aug_resolve_kernel(AUG_KERNEL_AUTO)));
        return NULL;
    }
    return PyUnicode_FromString(aug_kernel_name(kernel));
}
