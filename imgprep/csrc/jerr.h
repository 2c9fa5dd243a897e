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
    char message[JMSG_LENGTH_MAX];  /* the error */
    char first[JMSG_LENGTH_MAX];    /* the first warning */
} JpegErr;

/* Points ``err`` at ``cinfo`` (a compress or decompress object, before its create call). */
void jerr_init(struct jpeg_error_mgr **slot, JpegErr *err);

#endif
