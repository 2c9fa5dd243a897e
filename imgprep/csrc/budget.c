/* The per-image budget (see budget.h). */
#include "budget.h"

#include "jerr.h"

static long long blocks_of(jpeg_component_info *c) {
    return (long long)c->width_in_blocks * (long long)c->height_in_blocks;
}

/* libjpeg calls it every iMCU row while it reads multi-scan data, and every few rows of
 * output: a new scan adds its components' blocks to the count. */
static void monitor(j_common_ptr common) {
    if (!common->is_decompressor) return;
    j_decompress_ptr cinfo = (j_decompress_ptr)common;
    Budget *b = (Budget *)cinfo->progress;
    if (cinfo->input_scan_number == b->scan) return;
    b->scan = cinfo->input_scan_number;
    if (b->scan > BUDGET_MAX_SCANS)
        jerr_refuse(common, "a JPEG of more than %d scans (a legal progressive image has "
                            "about 10): refused before decoding them all", BUDGET_MAX_SCANS);
    for (int i = 0; i < cinfo->comps_in_scan && i < MAX_COMPS_IN_SCAN; i++)
        b->block_scans += blocks_of(cinfo->cur_comp_info[i]);
    if (b->block_scans > BUDGET_MAX_BLOCK_SCANS)
        jerr_refuse(common, "a JPEG whose %d scans decode over %lld blocks of 8x8 (%dx%d "
                            "in %d components): refused before decoding them all", b->scan,
                    BUDGET_MAX_BLOCK_SCANS, (int)cinfo->image_width, (int)cinfo->image_height,
                    cinfo->num_components);
}

void budget_attach(j_decompress_ptr cinfo, Budget *b) {
    b->pub.progress_monitor = monitor;
    b->pub.pass_counter = b->pub.pass_limit = 0;
    b->pub.completed_passes = b->pub.total_passes = 0;
    b->scan = 0;
    b->block_scans = 0;
    cinfo->progress = &b->pub;
}

/* Refuses a table a component uses that holds a 0. */
static void check_quant(j_decompress_ptr cinfo) {
    for (int ci = 0; ci < cinfo->num_components; ci++) {
        int t = cinfo->comp_info[ci].quant_tbl_no;
        JQUANT_TBL *q = t >= 0 && t < NUM_QUANT_TBLS ? cinfo->quant_tbl_ptrs[t] : NULL;
        for (int k = 0; q != NULL && k < DCTSIZE2; k++)
            if (q->quantval[k] == 0)
                jerr_refuse((j_common_ptr)cinfo, "quantisation table %d holds a 0 (illegal "
                                                 "in JPEG: the image decodes flat)", t);
    }
}

void budget_header(j_decompress_ptr cinfo, size_t len) {
    long long blocks = 0, padded = 0;
    for (int ci = 0; ci < cinfo->num_components; ci++) {
        jpeg_component_info *c = &cinfo->comp_info[ci];
        long long wb = c->width_in_blocks, hb = c->height_in_blocks;
        long long h = c->h_samp_factor, v = c->v_samp_factor;
        blocks += wb * hb;
        padded += (wb + h - 1) / h * h * ((hb + v - 1) / v * v);
    }
    long long per_byte = cinfo->arith_code ? BUDGET_ARITH_BLOCKS_PER_BYTE
                                           : BUDGET_BLOCKS_PER_BYTE;
    if (blocks > per_byte * (long long)len)
        jerr_refuse((j_common_ptr)cinfo, "the header declares %dx%d (%lld blocks of 8x8) but "
                    "the file holds only %zu bytes, too few for that image (at least %lld): "
                    "cut short or forged", (int)cinfo->image_width, (int)cinfo->image_height,
                    blocks, len, (blocks + per_byte - 1) / per_byte);
    check_quant(cinfo);
    cinfo->mem->max_memory_to_use = (long)(padded * DCTSIZE2 * (long long)sizeof(JCOEF) +
                                           BUDGET_MEMORY_SLACK);
}
