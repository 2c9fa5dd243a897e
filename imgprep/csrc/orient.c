/* EXIF orientation (see orient.h). Payloads are untrusted: every offset is checked against
 * the payload's length before it is read. */
#include "orient.h"

#include <string.h>

static const char EXIF_HEAD[6] = {'E', 'x', 'i', 'f', 0, 0};
enum { TAG_ORIENTATION = 0x0112, ENTRY = 12, IN_ENTRY = 4 };
/* TIFF's types: Pillow reads these (TiffImagePlugin's _load_dispatch) and skips the others. */
enum {
    T_BYTE = 1, T_ASCII, T_SHORT, T_LONG, T_RATIONAL, T_SBYTE, T_UNDEFINED, T_SSHORT, T_SLONG,
    T_SRATIONAL, T_FLOAT, T_DOUBLE, T_IFD, T_LONG8 = 16
};

static uint32_t get16(const unsigned char *p, int le) {
    return le ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : (uint32_t)p[0] << 8 | (uint32_t)p[1];
}

static uint32_t get32(const unsigned char *p, int le) {
    return le ? get16(p, 1) | get16(p + 2, 1) << 16 : get16(p, 0) << 16 | get16(p + 2, 0);
}

static uint64_t get64(const unsigned char *p, int le) {
    return le ? get32(p, 1) | (uint64_t)get32(p + 4, 1) << 32
              : (uint64_t)get32(p, 0) << 32 | get32(p + 4, 0);
}

/* ``u``'s low ``bits`` read as a two's-complement number. */
static int64_t sign_extend(uint32_t u, unsigned bits) {
    uint32_t top = (uint32_t)1 << (bits - 1);
    return (int64_t)(u & (top - 1)) - (int64_t)(u & top);
}

/* The size of one value of a type Pillow reads, else 0. */
static unsigned unit_size(uint32_t type) {
    switch (type) {
    case T_BYTE: case T_ASCII: case T_SBYTE: case T_UNDEFINED: return 1;
    case T_SHORT: case T_SSHORT: return 2;
    case T_LONG: case T_SLONG: case T_FLOAT: case T_IFD: return 4;
    case T_RATIONAL: case T_SRATIONAL: case T_DOUBLE: case T_LONG8: return 8;
    default: return 0;
    }
}

static int whole(double d) { return d >= 1 && d <= 8 && d == (int)d ? (int)d : 0; }

/* What ``exif_transpose`` makes of a tag's first value ``v`` of ``type``: it looks the value
 * up among the ints 2..8, which a number of any type equals when Python says so (a rational
 * or a float with a whole value among them; a rational over 0 is NaN, equal to none), and
 * bytes (BYTE, UNDEFINED) or text (ASCII) never. 1..8, or 0. */
static int value_orientation(uint32_t type, const unsigned char *v, int le) {
    int64_t num, den = 1;
    switch (type) {
    case T_SHORT: num = get16(v, le); break;
    case T_LONG: case T_IFD: num = get32(v, le); break;
    case T_SBYTE: num = sign_extend(v[0], 8); break;
    case T_SSHORT: num = sign_extend(get16(v, le), 16); break;
    case T_SLONG: num = sign_extend(get32(v, le), 32); break;
    case T_RATIONAL:
        num = get32(v, le);
        den = get32(v + 4, le);
        break;
    case T_SRATIONAL:
        num = sign_extend(get32(v, le), 32);
        den = sign_extend(get32(v + 4, le), 32);
        break;
    case T_LONG8: {
        uint64_t u = get64(v, le);
        return u >= 1 && u <= 8 ? (int)u : 0;
    }
    case T_FLOAT: {
        uint32_t bits = get32(v, le);
        float f;
        memcpy(&f, &bits, sizeof f);
        return whole(f);
    }
    case T_DOUBLE: {
        uint64_t bits = get64(v, le);
        double d;
        memcpy(&d, &bits, sizeof d);
        return whole(d);
    }
    default: return 0;
    }
    if (den == 0 || num % den != 0) return 0;
    int64_t q = num / den;
    return q >= 1 && q <= 8 ? (int)q : 0;
}

/* The byte order of the TIFF header Pillow accepts at ``p`` (1: little-endian, 0: big), or -1
 * where its Exif reading raises: a header it does not know, one cut short, or BigTIFF's (it
 * reads the first IFD's offset past the 8 bytes it has). */
static int byte_order(const unsigned char *p, size_t n) {
    static const unsigned char known[][4] = {
        {'I', 'I', 42, 0}, {'I', 'I', 0, 42}, {'M', 'M', 0, 42}, {'M', 'M', 42, 0},
        {'M', 'M', 0, 43},  /* read as a TIFF: Pillow looks for BigTIFF's 43 in byte 2 */
    };
    if (n < 8) return -1;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (memcmp(p, known[i], 4) == 0) return p[0] == 'I';
    return -1;
}

int exif_orientation(const unsigned char *p, size_t n) {
    while (n >= sizeof EXIF_HEAD && memcmp(p, EXIF_HEAD, sizeof EXIF_HEAD) == 0) {
        p += sizeof EXIF_HEAD;  /* Pillow strips the header as often as it repeats */
        n -= sizeof EXIF_HEAD;
    }
    if (n == 0) return -1;
    int le = byte_order(p, n);
    if (le < 0) return 0;
    /* Pillow's ImageFileDirectory_v2.load: a short read ends it, keeping what it read */
    uint32_t ifd = get32(p + 4, le);
    if (ifd > n || n - ifd < 2) return -1;
    uint32_t count = get16(p + ifd, le), type = 0;
    const unsigned char *value = NULL;
    size_t at = (size_t)ifd + 2;
    for (uint32_t i = 0; i < count && n - at >= ENTRY; i++, at += ENTRY) {
        const unsigned char *e = p + at;
        uint32_t t = get16(e + 2, le);
        uint64_t size = (uint64_t)get32(e + 4, le) * unit_size(t);
        const unsigned char *v = e + 8;
        if (size > IN_ENTRY) {  /* stored at an offset */
            uint32_t offset = get32(e + 8, le);
            if (offset > n || size > n - offset) break;
            v = p + offset;
        }
        if (size == 0) continue;  /* a type Pillow skips, or no values */
        if (get16(e, le) == TAG_ORIENTATION) {  /* the last copy is kept */
            value = v;
            type = t;
        }
    }
    return value == NULL ? -1 : value_orientation(type, value, le);
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
