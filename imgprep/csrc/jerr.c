/* libjpeg error handling for the convert path (see jerr.h). */
#include "jerr.h"

#include <string.h>

#include <jerror.h>

static void on_error(j_common_ptr cinfo) {
    JpegErr *err = (JpegErr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return;  /* trace messages */
    JpegErr *err = (JpegErr *)cinfo->err;
    if (err->warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->first);
    switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF: err->eof = 1; break;
    case JWRN_HIT_MARKER: err->hit_marker = 1; break;
    case JWRN_EXTRANEOUS_DATA:
        if (cinfo->err->msg_parm.i[0] > err->padding) err->padding = cinfo->err->msg_parm.i[0];
        break;
    default: break;
    }
}

void jerr_init(struct jpeg_error_mgr **slot, JpegErr *err) {
    *slot = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warnings = err->eof = err->hit_marker = 0;
    err->padding = 0;
    err->message[0] = err->first[0] = '\0';
}
