/* libjpeg error handling for the convert path (see jerr.h). */
#include "jerr.h"

#include <stdarg.h>
#include <string.h>

#include <jerror.h>

static void on_error(j_common_ptr cinfo) {
    JpegErr *err = (JpegErr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* Whether the marker that ended the data a decoder read is a restart marker (RSTn). */
static int restart_next(j_common_ptr cinfo) {
    if (!cinfo->is_decompressor) return 0;
    int m = ((j_decompress_ptr)cinfo)->unread_marker;
    return m >= JPEG_RST0 && m <= JPEG_RST0 + 7;
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return;  /* trace messages */
    JpegErr *err = (JpegErr *)cinfo->err;
    if (err->warnings++ == 0) (*cinfo->err->format_message)(cinfo, err->first);
    switch (cinfo->err->msg_code) {
    case JWRN_JPEG_EOF: err->eof = 1; break;
    case JWRN_HIT_MARKER:
        /* A restart marker: one interval's data ran short, and the decoder resyncs there
         * (damage it decodes around); any other (EOI, the next scan's): the image's data
         * ends before its last block. */
        if (!restart_next(cinfo)) err->hit_marker = 1;
        break;
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
    err->warnings = err->eof = err->hit_marker = err->refused = 0;
    err->padding = 0;
    err->message[0] = err->first[0] = '\0';
}

void jerr_refuse(j_common_ptr cinfo, const char *fmt, ...) {
    JpegErr *err = (JpegErr *)cinfo->err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, JMSG_LENGTH_MAX, fmt, ap);
    va_end(ap);
    err->refused = 1;
    longjmp(err->jump, 1);
}

void jerr_scan(const JpegErr *err, long trailing, Scan *out) {
    out->warnings = err->warnings;
    out->eof = err->eof;
    out->hit_marker = err->hit_marker;
    out->padding = err->padding;
    out->trailing = trailing;
    memcpy(out->first, err->first, sizeof out->first);
}

int fail_with(int code, char *msg, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return code;
}
