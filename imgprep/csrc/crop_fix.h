/* Whether libjpeg may crop a decode's columns (jpeg_crop_scanline) at the scale set. Before
 * 3.0.0, libjpeg-turbo's jpeg_crop_scanline() miscalculated the downsampled width of a
 * component whose DCT is scaled apart from the others' (how libjpeg carries out 2x4 and 4x2
 * upsampling at scales 1/2 and 1/4), leaving it part-upsampled: the colour converter then
 * read uninitialised memory. The bundled libjpeg-turbo has the fix backported
 * (tools/libjpeg_turbo.py writes imgprep_backports.h); on another 2.x library such an
 * image is decoded at full width instead (rows are still skipped). */
#ifndef IMGPREP_CROP_FIX_H
#define IMGPREP_CROP_FIX_H

#include <stdio.h>

#include <jpeglib.h>

#if defined(__has_include)
#if __has_include(<imgprep_backports.h>)
#include <imgprep_backports.h>
#endif
#endif

#ifndef LIBJPEG_TURBO_VERSION_NUMBER
#define LIBJPEG_TURBO_VERSION_NUMBER 0
#endif

/* After jpeg_start_decompress. */
static inline int crop_columns_exact(j_decompress_ptr cinfo) {
#if defined(IMGPREP_BACKPORT_CROP_SCANLINE) || LIBJPEG_TURBO_VERSION_NUMBER >= 3000000
    (void)cinfo;
    return 1;
#else
    for (int ci = 0; ci < cinfo->num_components; ci++)
#if JPEG_LIB_VERSION >= 70
        if (cinfo->comp_info[ci].DCT_h_scaled_size != cinfo->min_DCT_h_scaled_size)
#else
        if (cinfo->comp_info[ci].DCT_scaled_size != cinfo->min_DCT_scaled_size)
#endif
            return 0;
    return 1;
#endif
}

#endif
