/* Scratch memory that a thread reuses from one image to the next, so that the hot path
 * neither allocates nor faults in fresh pages per image. */
#ifndef IMGPREP_SCRATCH_H
#define IMGPREP_SCRATCH_H

#include <stddef.h>
#include <stdlib.h>

typedef struct {
    unsigned char *data;
    size_t cap;
} Scratch;

/* At least ``n`` bytes (what they held is lost), or NULL when memory is short. */
static inline unsigned char *scratch_reserve(Scratch *s, size_t n) {
    if (n <= s->cap) return s->data;
    free(s->data);
    s->data = malloc(n);
    s->cap = s->data != NULL ? n : 0;
    return s->data;
}

/* Gives the memory back when it grew past ``keep`` bytes (a rare huge image). */
static inline void scratch_trim(Scratch *s, size_t keep) {
    if (s->cap > keep) {
        free(s->data);
        s->data = NULL;
        s->cap = 0;
    }
}

#endif
