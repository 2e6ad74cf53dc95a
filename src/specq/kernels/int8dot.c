/* Integer-weight linear layers with int8 activations, for x86 CPUs with AVX2 (see kernels/int8dot.py
 * for why this is hand-written: no library op on x86 multiplies int8 activations by grouped 4-bit
 * weights, and torch's packed int4/int8 CPU ops dequantize to float, so their cost grows with
 * every verify row).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k] for rows r < M, outputs n < N, inputs k < K, where
 *   - x is float32, quantized here per row and per block of 32 values to int8: x ~ d_a[b] * q_a
 *     (d_a = max|x| / 127), the scheme of llama.cpp's Q8_0;
 *   - w is stored per group g of G inputs (G 16 or a multiple of 32) as
 *       4-bit: w = d_w[g] * u + m_w[g], u in [0, 15];
 *       8-bit: w = d_w[g] * c (+ m_w[g] when offsets are given), c in [-128, 127];
 *     in panels of 8 outputs, one per 32-bit lane of a vector (the layout of llama.cpp's repacked
 *     Q4_0 8x8 kernels): per block of 32 inputs, 4-bit codes take 4 chunks of 32 bytes, chunk j
 *     holding for each output o (bytes 4o..4o+3) inputs 8j..8j+3 in the low nibbles and 8j+4..8j+7
 *     in the high ones; 8-bit codes take 8 chunks, chunk j holding inputs 4j..4j+3 of each output.
 *     Scales and offsets are [panel][group][8]. N is padded to a multiple of 8 with zeros.
 * Four activation bytes broadcast to every lane meet four inputs of each of the 8 outputs in one
 * vpmaddubsw: a panel needs no horizontal sums, and the unpacked weights serve up to 4 rows.
 * Each block's integer dot product is exact; it is scaled by d_w * d_a into the output's float
 * lane (groups of 16: each half of the block by its own d_w), and the m_w term uses the group's sum
 * of the quantized x.
 *
 * Every row is computed by the same sequence of operations whatever M is and wherever the row
 * sits in the batch, so a verify row equals the same position computed as a one-row step bit for
 * bit (speculative decoding is lossless only if it does). Compile with -ffp-contract=off so the
 * compiler cannot fuse differently in differently inlined copies.
 */
#include "panel.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32
#define ROW_TILE 4  /* rows sharing a panel's unpacked weights */

/* x [M, K] -> q [M, K] int8, d [M, K/32] (block scales), and when s != NULL s [M, K/G]: the sum of
 * the quantized values over each group, sum(d * q), for the offset term. Using the
 * quantized sum (not the exact one) makes the result exactly sum(w * d * q): the offset
 * m = -8 * scale then cancels the rounding it would otherwise amplify (llama.cpp's Q8_1 does
 * the same). */
static void quantize_rows(const float *x, int M, int K, int G, int8_t *q, float *d, float *s) {
    for (int r = 0; r < M; r++) {
        const float *xr = x + (size_t)r * K;
        for (int b = 0; b < K / QBLOCK; b++) {
            const float *xb = xr + b * QBLOCK;
            float amax = 0.0f;
            for (int i = 0; i < QBLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
            float scale = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            d[(size_t)r * (K / QBLOCK) + b] = scale;
            int8_t *qb = q + (size_t)r * K + b * QBLOCK;
            for (int i = 0; i < QBLOCK; i++) qb[i] = (int8_t)nearbyintf(xb[i] * inv);
        }
        if (s) {
            const int span = G < QBLOCK ? G : QBLOCK;  /* a group's inputs under one block scale */
            for (int g = 0; g < K / G; g++) {
                float sum = 0.0f;
                for (int start = g * G; start < (g + 1) * G; start += span) {
                    int total = 0;
                    for (int i = start; i < start + span; i++) total += q[(size_t)r * K + i];
                    sum += d[(size_t)r * (K / QBLOCK) + start / QBLOCK] * (float)total;
                }
                s[(size_t)r * (K / G) + g] = sum;
            }
        }
    }
}

/* Four consecutive int8 activations broadcast to all eight 32-bit lanes. */
static inline __m256i broadcast4(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, sizeof v);
    return _mm256_set1_epi32(v);
}

/* The exact integer dot products of `rows` rows with chunks [j0, j1) of one block's codes `wb`
 * (activations `qb`, rows K apart), added to dots[r] as eight 32-bit lanes.
 * vpmaddubsw multiplies unsigned by signed bytes: 4-bit codes are unsigned already, and a block's
 * eight products of 4-bit codes sum in 16 bits without overflow (8 * 2 * 15 * 127 < 32768); 8-bit
 * codes go in as |w| with w's sign moved onto the activations, widened to 32 bits at every step. */
static inline __attribute__((always_inline)) void chunk_dots(
        int bits, int rows, int j0, int j1, const uint8_t *wb, const int8_t *qb, int K, __m256i *dots) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    if (bits == 4) {
        __m256i sums[ROW_TILE];
        UNROLL
        for (int r = 0; r < rows; r++) sums[r] = _mm256_setzero_si256();
        for (int j = j0; j < j1; j++) {
            __m256i packed = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
            __m256i lo = _mm256_and_si256(packed, low), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + (size_t)r * K + 8 * j;
                sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(lo, broadcast4(a)));
                sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(hi, broadcast4(a + 4)));
            }
        }
        UNROLL
        for (int r = 0; r < rows; r++) dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(sums[r], ones));
    } else {
        for (int j = j0; j < j1; j++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
            __m256i u = _mm256_sign_epi8(w, w);  /* |w| as unsigned bytes (-128 becomes 128) */
            UNROLL
            for (int r = 0; r < rows; r++) {
                __m256i a = _mm256_sign_epi8(broadcast4(qb + (size_t)r * K + 4 * j), w);
                dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones));
            }
        }
    }
}

/* The 8 outputs of one panel for `rows` (<= ROW_TILE, a constant at each call) consecutive rows.
 * `bits` (4 or 8) and `half` (1: groups of 16, two per block of 32; 0: groups of whole blocks) are
 * constants at every call, so each form compiles to its own straight-line code. The sequence of
 * operations on one (row, output) lane is the same in every tile. `wm` NULL: no offsets. */
static inline __attribute__((always_inline)) void panel(
        int bits, int half, int rows, int K, int G, const uint8_t *wq, const float *wd, const float *wm,
        const int8_t *q, const float *d, const float *s, float *y, int N, int valid) {
    const int blocks = K / QBLOCK, groups = K / G, chunks = bits == 4 ? 4 : 8, parts = half ? 2 : 1;
    const int per_group = half ? 1 : G / QBLOCK;  /* blocks per group of whole blocks */
    const size_t block_bytes = (size_t)chunks * 32;
    __m256 acc[ROW_TILE];
    UNROLL
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        for (int h = 0; h < parts; h++) {  /* the block, or each of its halves */
            __m256i dots[ROW_TILE];
            UNROLL
            for (int r = 0; r < rows; r++) dots[r] = _mm256_setzero_si256();
            chunk_dots(bits, rows, h * chunks / parts, (h + 1) * chunks / parts, wq + (size_t)b * block_bytes,
                       q + b * QBLOCK, K, dots);
            __m256 wscale = _mm256_loadu_ps(wd + (size_t)(half ? 2 * b + h : b / per_group) * PANEL);
            UNROLL
            for (int r = 0; r < rows; r++) {
                __m256 scale = _mm256_mul_ps(wscale, _mm256_set1_ps(d[(size_t)r * blocks + b]));
                acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dots[r]), acc[r]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < rows; r++) {
        __m256 out = acc[r];
        if (wm) {  /* the offsets: m_w times the group sums of the quantized x */
            __m256 m = _mm256_setzero_ps();
            for (int g = 0; g < groups; g++)
                m = _mm256_add_ps(m, _mm256_mul_ps(_mm256_loadu_ps(wm + (size_t)g * PANEL), _mm256_set1_ps(s[(size_t)r * groups + g])));
            out = _mm256_add_ps(out, m);
        }
        store_panel(y + (size_t)r * N, out, valid);
    }
}

/* The scratch space for the quantized activations, per call (M * K bytes plus scales). */
typedef struct { int8_t *q; float *d; float *s; } Acts;

static int acts_alloc(Acts *a, int M, int K, int G) {
    if (M == 0) { a->q = NULL; a->d = a->s = NULL; return 1; }  /* nothing to quantize or multiply */
    a->q = malloc((size_t)M * K);
    a->d = malloc(sizeof(float) * (size_t)M * (K / QBLOCK));
    a->s = malloc(sizeof(float) * (size_t)M * (K / G));
    return a->q && a->d && a->s;
}

static void acts_free(Acts *a) { free(a->q); free(a->d); free(a->s); }

/* All M rows of panel p: tiles of 4 rows, then one of 2 and one of 1 for the rest. */
#define SWEEP(BITS, HALF)                                                                    \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                        \
    for (int p = 0; p < panels; p++) {                                                       \
        int valid = N - p * PANEL < PANEL ? N - p * PANEL : PANEL, r = 0;                    \
        for (; r + 4 <= M; r += 4) PANEL_AT(BITS, HALF, 4, r, p, valid);                    \
        if (r + 2 <= M) { PANEL_AT(BITS, HALF, 2, r, p, valid); r += 2; }                    \
        if (r < M) PANEL_AT(BITS, HALF, 1, r, p, valid);                                     \
    }

/* y = x w^T for `bits`-bit weights (4 or 8) in groups of G (16 or a multiple of 32) in the panel
 * layout above; `wm`: the offsets (always for 4 bits; NULL for 8-bit weights without them).
 * Returns 0 on success, -1 when out of memory. Panels are split across `threads` OpenMP threads. */
int linear_a8(int bits, const float *x, int M, int K, int N, int G, const uint8_t *wq, const float *wd,
              const float *wm, float *y, int threads) {
    Acts a;
    if (!acts_alloc(&a, M, K, G)) { acts_free(&a); return -1; }
    quantize_rows(x, M, K, G, a.q, a.d, wm ? a.s : NULL);
    const int groups = K / G, blocks = K / QBLOCK, panels = (N + PANEL - 1) / PANEL;
    const size_t panel_bytes = (size_t)blocks * (bits == 4 ? 4 * 32 : 8 * 32);
#define PANEL_AT(BITS, HALF, ROWS, r, p, valid)                                                              \
    panel(BITS, HALF, ROWS, K, G, wq + (size_t)(p) * panel_bytes, wd + (size_t)(p) * groups * PANEL,           \
          wm ? wm + (size_t)(p) * groups * PANEL : NULL, a.q + (size_t)(r) * K, a.d + (size_t)(r) * blocks,      \
          a.s + (size_t)(r) * groups, y + (size_t)(r) * N + (size_t)(p) * PANEL, N, valid)
    const int half = G < QBLOCK;
    if (bits == 4 && !half) {
        SWEEP(4, 0)
    } else if (bits == 4) {
        SWEEP(4, 1)
    } else if (!half) {
        SWEEP(8, 0)
    } else {
        SWEEP(8, 1)
    }
    acts_free(&a);
    return 0;
}
