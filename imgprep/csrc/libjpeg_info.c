/* What the extension knows of the libjpeg it runs on.
 *
 * LIBJPEG_TURBO_VERSION
 *     libjpeg-turbo's version as a number (2.1.5 -> 2001005), from the jconfig.h the
 *     extension was compiled with; 0 where those headers are not libjpeg-turbo's.
 * LIBJPEG_LINKED_IN
 *     1 when a static libjpeg-turbo is linked into the extension (the wheel's build: setup.py
 *     defines IMGPREP_LIBJPEG_LINKED_IN), so the version above is the code that runs; 0 when
 *     the system's shared libjpeg is loaded at run time.
 * simd() -> int
 *     1 when libjpeg-turbo's SIMD kernels run (decode: IDCT, upsampling, colour conversion;
 *     encode: colour conversion, DCT, Huffman), 0 when any of them does not: a library built
 *     without SIMD (its jsimd_none.c answers 0), a CPU without SSE2, or JSIMD_FORCENONE=1 in
 *     the environment; -1 for a system library, whose SIMD entry points are not exported.
 *     libjpeg-turbo's own dispatch answers (the jsimd_can_* functions each codec calls
 *     before choosing a kernel), so no timing and no guess: what it says is what runs.
 */
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

#include "libjpeg_info.h"

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#define LIBJPEG_TURBO_VERSION_NUMBER 0
#endif

#ifdef IMGPREP_LIBJPEG_LINKED_IN
/* libjpeg-turbo's dispatch (simd/jsimd.h, not installed; the same in 2.x and 3.x). */
extern int jsimd_can_idct_islow(void);
extern int jsimd_can_h2v2_fancy_upsample(void);
extern int jsimd_can_ycc_rgb(void);
extern int jsimd_can_rgb_ycc(void);
extern int jsimd_can_fdct_islow(void);
extern int jsimd_can_huff_encode_one_block(void);
#define LINKED_IN 1
#else
#define LINKED_IN 0
#endif

static PyObject *simd(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
#ifdef IMGPREP_LIBJPEG_LINKED_IN
    int on = jsimd_can_idct_islow() && jsimd_can_h2v2_fancy_upsample() &&
             jsimd_can_ycc_rgb() && jsimd_can_rgb_ycc() && jsimd_can_fdct_islow() &&
             jsimd_can_huff_encode_one_block();
    return PyLong_FromLong(on ? 1 : 0);
#else
    return PyLong_FromLong(-1);
#endif
}

static PyMethodDef methods[] = {
    {"simd", simd, METH_NOARGS, "simd() -> 1 on, 0 off, -1 not known (a system libjpeg)"},
    {NULL, NULL, 0, NULL},
};

int imgprep_add_libjpeg_info(PyObject *module) {
    if (PyModule_AddIntConstant(module, "LIBJPEG_TURBO_VERSION",
                                LIBJPEG_TURBO_VERSION_NUMBER) < 0 ||
        PyModule_AddIntConstant(module, "LIBJPEG_LINKED_IN", LINKED_IN) < 0)
        return -1;
    return PyModule_AddFunctions(module, methods);
}
