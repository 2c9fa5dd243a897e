/* What the extension knows of the libjpeg it runs on (libjpeg_info.c). */
#ifndef IMGPREP_LIBJPEG_INFO_H
#define IMGPREP_LIBJPEG_INFO_H

#include <Python.h>

/* Adds LIBJPEG_TURBO_VERSION, LIBJPEG_LINKED_IN and simd() to ``module``; 0, or -1 with an
 * exception set. */
int imgprep_add_libjpeg_info(PyObject *module);

#endif
