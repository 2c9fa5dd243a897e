/* The module's named results: what crosses from C into Python is a struct sequence (a tuple
 * whose fields have names: ``r.status``, ``r.width``), one type per entry, made at import and
 * added to the module (``imgprep._jpegcrop.ConvertResult`` ...). */
#ifndef IMGPREP_RESULTS_H
#define IMGPREP_RESULTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { RESULT_CONVERT, RESULT_FRAME, RESULT_PROBE, RESULT_DECODE, RESULT_SAMPLE,
       RESULT_RAW, RESULT_CROP,
       RESULT_KINDS };

/* Makes the types and adds them to ``module``; 0, or -1 with an exception set. */
int results_add_types(PyObject *module);

/* ``tuple`` (its reference taken; NULL passes through) as the named result ``kind``. */
PyObject *named_result(int kind, PyObject *tuple);

#endif
