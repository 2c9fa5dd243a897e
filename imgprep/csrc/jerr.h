/* libjpeg error handling for the convert path: errors jump back to the caller's setjmp,
 * warnings are counted (never printed, the first kept as text) and sorted by what they say of
 * the file: its data ran out (cut short), a marker came before the scan's last block, or
 * bytes that are not image data were skipped before a marker (padding). */
#ifndef IMGPREP_JERR_H
#define IMGPREP_JERR_H

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;     /* libjpeg warnings (corrupt data) so far */
    int eof;          /* libjpeg ran out of data before an EOI marker */
    int hit_marker;   /* a marker came before the scan's last block */
    long padding;     /* the most bytes skipped before one marker */
    int refused;      /* the image broke its budget (imgprep/csrc/budget.h): message says how */
    char message[JMSG_LENGTH_MAX];  /* the error */
    char first[JMSG_LENGTH_MAX];    /* the first warning */
} JpegErr;

/* What reading a JPEG's data to its end found (libjpeg's warnings, sorted as above). */
typedef struct {
    int warnings, eof, hit_marker;
    long padding, trailing;       /* trailing: bytes after the EOI marker */
    char first[JMSG_LENGTH_MAX];  /* the first warning */
} Scan;

/* ``err``'s findings and the ``trailing`` bytes as a Scan. */
void jerr_scan(const JpegErr *err, long trailing, Scan *out);

/* Points ``err`` at ``cinfo`` (a compress or decompress object, before its create call). */
void jerr_init(struct jpeg_error_mgr **slot, JpegErr *err);

/* Writes the reason into ``msg`` (``len`` bytes) and returns ``code``: how every core says
 * why it failed. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
int fail_with(int code, char *msg, size_t len, const char *fmt, ...);

/* Ends the decode of ``cinfo`` (whose error manager is a JpegErr) as libjpeg's errors do,
 * with ``refused`` set and the reason in ``message``. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3), noreturn))
#endif
void jerr_refuse(j_common_ptr cinfo, const char *fmt, ...);

#endif
