/* The per-image budget every libjpeg decode of the extension runs under: what a JPEG may cost
 * is set by the bytes it holds, not by the size its header claims. Checked on the headers,
 * before anything of the image's size is allocated, then scan by scan while libjpeg reads:
 *
 *  - bytes: a Huffman-coded image spends at least one bit on each 8x8 block of each
 *    component (every block has a DC code, one bit at the least), so a header declaring more
 *    blocks than 8 a byte of the file is cut short or forged; an arithmetic-coded image may
 *    pack at most BUDGET_ARITH_BLOCKS_PER_BYTE blocks a byte (a stated limit: adaptive
 *    coding has no such floor, but no photograph comes near it);
 *  - time: at most BUDGET_MAX_SCANS scans (libjpeg-turbo's own TJFLAG_LIMITSCANS), and at
 *    most BUDGET_MAX_BLOCK_SCANS blocks decoded over all scans (each scan counts the blocks
 *    of the components it codes; about 10 ns each);
 *  - memory: libjpeg's limit (max_memory_to_use) at the whole-image coefficient buffer the
 *    declared blocks need plus BUDGET_MEMORY_SLACK, so no allocation outgrows the header the
 *    bytes vouch for;
 *  - quantisation: a table entry of 0 is illegal (T.81 B.2.4.1) and decodes flat: refused.
 *
 * Refusals jump to the caller's setjmp like libjpeg's errors, with JpegErr.refused set and
 * the reason in JpegErr.message (imgprep/csrc/jerr.h). The module exports the limits
 * (imgprep.jpegbudget reads them). */
#ifndef IMGPREP_BUDGET_H
#define IMGPREP_BUDGET_H

#include <stddef.h>
#include <stdio.h>

#include <jpeglib.h>

enum {
    BUDGET_MAX_SCANS = 500,
    BUDGET_BLOCKS_PER_BYTE = 8,
    BUDGET_ARITH_BLOCKS_PER_BYTE = 512,
};
#define BUDGET_MAX_BLOCK_SCANS (1LL << 26)
#define BUDGET_MEMORY_SLACK (32LL << 20)

typedef struct {
    struct jpeg_progress_mgr pub;
    int scan;              /* the last scan counted */
    long long block_scans; /* blocks decoded so far, over all scans */
} Budget;

/* Installs ``b`` as ``cinfo``'s progress monitor (after jpeg_create_decompress). */
void budget_attach(j_decompress_ptr cinfo, Budget *b);

/* After jpeg_read_header of ``len`` bytes: the header's rules above, and libjpeg's memory
 * limit; refuses (longjmp) what breaks them. */
void budget_header(j_decompress_ptr cinfo, size_t len);

#endif
