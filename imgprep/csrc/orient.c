/* EXIF orientation (see orient.h). Payloads are untrusted: every offset is checked against
 * the payload's length before it is read. */
#include "orient.h"

#include <string.h>

static const char EXIF_HEAD[6] = {'E', 'x', 'i', 'f', 0, 0};
enum { TAG_ORIENTATION = 0x0112, TYPE_SHORT = 3, TYPE_LONG = 4, ENTRY = 12 };

static uint32_t get16(const unsigned char *p, int le) {
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : (uint32_t)p[0] << 8 | (uint32_t)p[1];
}

static uint32_t get32(const unsigned char *p, int le) {
    return le ? get16(p, 1) | get16(p + 2, 1) << 16 : get16(p, 0) << 16 | get16(p + 2, 0);
}

int exif_orientation(const unsigned char *p, size_t n) {
    while (n >= sizeof EXIF_HEAD && memcmp(p, EXIF_HEAD, sizeof EXIF_HEAD) == 0) {
        p += sizeof EXIF_HEAD;  /* Pillow strips the header as often as it repeats */
        n -= sizeof EXIF_HEAD;
    }
    if (n < 8) return -1;
    int le;
    if (p[0] == 'I' && p[1] == 'I') le = 1;
    else if (p[0] == 'M' && p[1] == 'M') le = 0;
    else return -1;
    if (get16(p + 2, le) != 42) return -1;
    uint32_t ifd = get32(p + 4, le);
    if (ifd > n || n - ifd < 2) return -1;
    uint32_t count = get16(p + ifd, le);
    const unsigned char *e = p + ifd + 2, *end = p + n;
    for (uint32_t i = 0; i < count && end - e >= ENTRY; i++, e += ENTRY) {
        if (get16(e, le) != TAG_ORIENTATION) continue;
        uint32_t type = get16(e + 2, le), values = get32(e + 4, le);
        if (values != 1) return 0;  /* a tuple: no transpose */
        if (type == TYPE_SHORT) return (int)get16(e + 8, le);
        if (type == TYPE_LONG) {
            uint32_t v = get32(e + 8, le);
            return v > 8 ? 0 : (int)v;
        }
        return 0;
    }
    return -1;
}

int xmp_orientation(const unsigned char *p, size_t n) {
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof key - 1;
    for (size_t i = 0; i + k <= n; i++) {
        if (p[i] != 't' || memcmp(p + i, key, k) != 0) continue;
        const unsigned char *q = p + i + k;
        size_t left = n - i - k;
        if (left >= 3 && q[0] == '=' && q[1] == '"' && q[2] >= '0' && q[2] <= '9')
            return q[2] - '0';
        if (left >= 2 && q[0] == '>' && q[1] >= '0' && q[1] <= '9') return q[1] - '0';
    }
    return -1;
}

int orientation_swaps(int orientation) { return orientation >= 5 && orientation <= 8; }

/* Where the stored pixel (u, v) of a ``w`` x ``h`` image lands when shown: x = a*u + b*v + c,
 * y = d*u + e*v + f. Pillow's methods: 2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM,
 * 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90. */
typedef struct {
    long a, b, c, d, e, f;
} Affine;

static Affine affine(int orientation, long w, long h) {
    switch (orientation) {
    case 2: return (Affine){-1, 0, w - 1, 0, 1, 0};
    case 3: return (Affine){-1, 0, w - 1, 0, -1, h - 1};
    case 4: return (Affine){1, 0, 0, 0, -1, h - 1};
    case 5: return (Affine){0, 1, 0, 1, 0, 0};
    case 6: return (Affine){0, -1, h - 1, 1, 0, 0};
    case 7: return (Affine){0, -1, h - 1, -1, 0, w - 1};
    case 8: return (Affine){0, 1, 0, -1, 0, w - 1};
    default: return (Affine){1, 0, 0, 0, 1, 0};
    }
}

int inverse_orientation(int orientation) {
    return orientation == 6 ? 8 : orientation == 8 ? 6 : orientation;
}

Rect turn_rect(int orientation, unsigned width, unsigned height, Rect r) {
    Affine m = affine(orientation, width, height);
    long x[2] = {r.x0, (long)r.x1 - 1}, y[2] = {r.y0, (long)r.y1 - 1};
    long x0 = 0, x1 = 0, y0 = 0, y1 = 0;
    for (int i = 0; i < 4; i++) {  /* the corners */
        long u = x[i & 1], v = y[i >> 1];
        long tx = m.a * u + m.b * v + m.c, ty = m.d * u + m.e * v + m.f;
        if (i == 0 || tx < x0) x0 = tx;
        if (i == 0 || tx > x1) x1 = tx;
        if (i == 0 || ty < y0) y0 = ty;
        if (i == 0 || ty > y1) y1 = ty;
    }
    return (Rect){(unsigned)x0, (unsigned)y0, (unsigned)x1 + 1, (unsigned)y1 + 1};
}

void transpose_rgbx(int orientation, const unsigned char *src, unsigned width, unsigned height,
                    size_t stride, unsigned char *dst) {
    Affine m = affine(orientation, width, height);
    size_t out_w = orientation_swaps(orientation) ? height : width;
    for (unsigned v = 0; v < height; v++) {
        const unsigned char *row = src + v * stride;
        long x = m.b * (long)v + m.c, y = m.e * (long)v + m.f;
        for (unsigned u = 0; u < width; u++, x += m.a, y += m.d)
            memcpy(dst + ((size_t)y * out_w + (size_t)x) * 4, row + (size_t)u * 4, 4);
    }
}
