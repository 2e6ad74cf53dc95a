/* What specq's panel kernels (int8dot.c, f32dot.c) share: weights in panels of PANEL outputs, one
 * per 32-bit lane of an AVX2 vector, so a panel's results for one row are one vector. */
#ifndef SPECQ_PANEL_H
#define SPECQ_PANEL_H
#include <immintrin.h>
#include <string.h>

#define PANEL 8
/* Full unrolling of the row loops keeps a tile's accumulators in registers. */
#define UNROLL _Pragma("GCC unroll 4")

/* One row's results for a panel into y: all 8 lanes, or the first `valid` of them in the last
 * panel of a layer whose outputs are not a multiple of 8. */
static inline void store_panel(float *y, __m256 out, int valid) {
    if (valid == PANEL) {
        _mm256_storeu_ps(y, out);
    } else {
        float lanes[PANEL];
        _mm256_storeu_ps(lanes, out);
        memcpy(y, lanes, sizeof(float) * valid);
    }
}

#endif
