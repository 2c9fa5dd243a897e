/* libjpeg error handling for the convert path: errors jump back to the caller's setjmp,
 * warnings are counted (never printed), and a premature end of the data is noted apart, since
 * it means a truncated file rather than damaged data that still decodes. */
#ifndef IMGPREP_JERR_H
#define IMGPREP_JERR_H

#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warnings;   /* libjpeg warnings (corrupt data) so far */
    int eof;        /* whether libjpeg ran out of data (a truncated file) */
    char message[JMSG_LENGTH_MAX];
} JpegErr;

/* Points ``err`` at ``cinfo`` (a compress or decompress object, before its create call). */
void jerr_init(struct jpeg_error_mgr **slot, JpegErr *err);

#endif
