/* The convert path's functions in the ``imgprep._jpegcrop`` module (their method-table
 * entries are in imgprep/_jpegcrop.c; what they do is in imgprep/csrc/bindings.c). */
#ifndef IMGPREP_BINDINGS_H
#define IMGPREP_BINDINGS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "jerr.h"

/* What reading a JPEG's data found, as the module reports it: {"warnings", "first", "eof",
 * "hit_marker", "padding", "trailing", "error", "refused"} (``error``: libjpeg's error or the
 * budget's refusal, or ""; ``refused``: 1 for the budget's, imgprep/csrc/budget.h). */
PyObject *scan_dict(const Scan *s, const char *error, int refused);

/* A core's answer to a call that writes in place, for Python: None where ``ok``, else
 * MemoryError where ``nomem``, else ValueError(``message``) (NULL, the error set). */
PyObject *none_or_raise(int ok, int nomem, const char *message);

PyObject *py_encode(PyObject *self, PyObject *args);
PyObject *py_convert(PyObject *self, PyObject *args);
PyObject *py_finish(PyObject *self, PyObject *args);
PyObject *py_frame(PyObject *self, PyObject *args);
/* The loader's per-sample call (imgprep/csrc/sample_py.c). */
PyObject *py_sample(PyObject *self, PyObject *args);
/* The per-sample augmentation ops (imgprep/csrc/augment_py.c). */
PyObject *py_augment(PyObject *self, PyObject *args);
PyObject *py_augment_kernel(PyObject *self, PyObject *args);

/* Stored pixels (imgprep/csrc/rawstore_py.c): a JPEG made a record, a record to a batch row. */
PyObject *py_raw_record(PyObject *self, PyObject *args);
PyObject *py_raw_sample(PyObject *self, PyObject *args);

/* A random-resized crop drawn from a numpy bit generator (imgprep/csrc/draws_py.c). */
PyObject *py_crop_draw(PyObject *self, PyObject *args);

#endif
