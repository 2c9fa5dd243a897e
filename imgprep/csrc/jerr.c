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
    err->warnings++;
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) err->eof = 1;
}

void jerr_init(struct jpeg_error_mgr **slot, JpegErr *err) {
    *slot = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->warnings = 0;
    err->eof = 0;
    err->message[0] = '\0';
}
