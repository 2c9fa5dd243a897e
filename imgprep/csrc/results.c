/* The module's named results (see results.h). */
#define Py_LIMITED_API 0x030B0000
#include "results.h"

#include <string.h>

#define F(name, doc) {name, doc}
static PyStructSequence_Field convert_fields[] = {
    F("status", "0 converted, 1 declined (decode it with Pillow, then finish), 2 failed"),
    F("message", "why it failed or was declined"), F("jpeg", "the output JPEG, or None"),
    F("width", "the original's width, as stored"), F("height", "the original's height"),
    F("components", "1 (Pillow's L) or 3 (RGB)"), F("mpf", "an APP2 MPF segment"),
    F("path", "PATH_REGION, PATH_WHOLE or PATH_PIXELS"),
    F("levels", "the output's R, G, B level counts (768 native int64), or None"),
    F("rgb", "the output's pixels in rows, or None"), F("out_width", "the output's width"),
    F("out_height", "the output's height"), F("scan", "what reading the data found"),
    {NULL, NULL}};
static PyStructSequence_Field frame_fields[] = {
    F("status", "as ConvertResult's"), F("message", "why not"),
    F("rgbx", "the decoded pixels as displayed, or None"), F("width", "their width"),
    F("height", "their height"), F("box", "the box the resample reads, in their pixels"),
    F("out_width", "the output's width"), F("out_height", "the output's height"),
    F("path", "PATH_REGION or PATH_WHOLE"), {NULL, NULL}};
static PyStructSequence_Field probe_fields[] = {
    F("width", "as the header says"), F("height", "as the header says"),
    F("code", "PROBE_FAST, or why the fast path declines"),
    F("report", "with check: what reading every scan found; else None"), {NULL, NULL}};
static PyStructSequence_Field decode_fields[] = {
    F("left", "the region written"), F("top", ""), F("right", ""), F("bottom", ""),
    F("report", "what the reading found"), {NULL, NULL}};
static PyStructSequence_Field sample_fields[] = {
    F("status", "SAMPLE_DONE, SAMPLE_DECLINED, SAMPLE_FAILED or SAMPLE_REFUSED"),
    F("path", "SAMPLE_REGION or SAMPLE_WHOLE"), F("message", "why it failed or was declined"),
    F("scan", "a whole decode's reading to the end, or None"), {NULL, NULL}};
static PyStructSequence_Field raw_fields[] = {
    F("status", "SAMPLE_DONE, SAMPLE_FAILED or SAMPLE_REFUSED"),
    F("message", "why it failed or was refused"), F("record", "the record's bytes, or None"),
    F("mode", "RAW_RGB24 or RAW_YUV420: what was stored"), F("width", "the image's width"),
    F("height", "its height"), {NULL, NULL}};
static PyStructSequence_Field crop_fields[] = {
    F("left", "the box drawn"), F("top", ""), F("right", ""), F("bottom", ""),
    F("flip", "mirrored left to right"), {NULL, NULL}};
#undef F

static PyStructSequence_Desc descs[RESULT_KINDS] = {
    {"imgprep._jpegcrop.ConvertResult", "convert's and finish's answer", convert_fields, 13},
    {"imgprep._jpegcrop.FrameResult", "convert's decode stage alone", frame_fields, 9},
    {"imgprep._jpegcrop.ProbeResult", "a JPEG's headers and the fast path's test",
     probe_fields, 4},
    {"imgprep._jpegcrop.DecodeResult", "a region decoded into a frame", decode_fields, 5},
    {"imgprep._jpegcrop.SampleResult", "the loader's one call a sample", sample_fields, 4},
    {"imgprep._jpegcrop.RawRecordResult", "a JPEG made a stored-pixel record", raw_fields, 6},
    {"imgprep._jpegcrop.CropDrawResult", "a random-resized crop drawn", crop_fields, 5},
};
static PyTypeObject *types[RESULT_KINDS];

int results_add_types(PyObject *module) {
    for (int k = 0; k < RESULT_KINDS; k++) {
        if (types[k] == NULL && (types[k] = PyStructSequence_NewType(&descs[k])) == NULL)
            return -1;
        const char *dot = strrchr(descs[k].name, '.');
        if (PyModule_AddObjectRef(module, dot + 1, (PyObject *)types[k]) < 0) return -1;
    }
    return 0;
}

PyObject *named_result(int kind, PyObject *tuple) {
    if (tuple == NULL) return NULL;
    PyObject *out = PyStructSequence_New(types[kind]);
    Py_ssize_t n = PyTuple_Size(tuple);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++)
        PyStructSequence_SetItem(out, i, Py_NewRef(PyTuple_GetItem(tuple, i)));
    Py_DECREF(tuple);
    return out;
}
