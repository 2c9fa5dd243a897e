/* The crop draw's call, listed in _jpegcrop.c's method table (imgprep/csrc/draws.h).
 *
 * crop_draw(capsule, width, height, scale_lo, scale_hi, ratio_lo, ratio_hi, flip)
 *     -> CropDrawResult(left, top, right, bottom, flip)
 *     A random-resized crop box of a ``width`` x ``height`` image (1..MAX_SIDE each) and,
 *     where ``flip``, its horizontal flip, drawn from the numpy BitGenerator whose
 *     ``capsule`` is given, exactly as loaders.transforms.crop_box draws them from its
 *     Generator. The scale and ratio ranges are checked as TrainTransform checks them. The
 *     GIL is held: the draws are the generator's, and take well under a microsecond.
 */
#define Py_LIMITED_API 0x030B0000
#include "bindings.h"

#include <math.h>

#include "bounds.h"
#include "draws.h"
#include "results.h"

PyObject *py_crop_draw(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *capsule;
    int w, h, flip;
    CropSpec spec;
    if (!PyArg_ParseTuple(args, "Oiiddddp", &capsule, &w, &h, &spec.scale_lo, &spec.scale_hi,
                          &spec.ratio_lo, &spec.ratio_hi, &flip))
        return NULL;
    NpBitgen *g = PyCapsule_GetPointer(capsule, "BitGenerator");
    if (g == NULL) return NULL;
    if (w < 1 || h < 1 || w > MAX_SIDE || h > MAX_SIDE)
        return PyErr_Format(PyExc_ValueError, "an image of %dx%d: sides must be 1..%d", w, h,
                            MAX_SIDE);
    if (!(0 < spec.scale_lo && spec.scale_lo <= spec.scale_hi && spec.scale_hi <= 1) ||
        !(0 < spec.ratio_lo && spec.ratio_lo <= spec.ratio_hi && isfinite(spec.ratio_hi)))
        return PyErr_Format(PyExc_ValueError, "scale must be 0 < lo <= hi <= 1 and ratio "
                                              "0 < lo <= hi, finite");
    spec.flip = flip;
    CropDraw d;
    draw_crop(g, w, h, &spec, &d);
    return named_result(RESULT_CROP, Py_BuildValue("iiiiO", d.left, d.top, d.right, d.bottom,
                                                   d.flip ? Py_True : Py_False));
}
