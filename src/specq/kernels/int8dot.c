/* Integer-weight linear layers with int8 activations, for x86 CPUs with AVX2 (see kernels/int8dot.py
 * for why this is hand-written: no library op on x86 multiplies int8 activations by grouped 4-bit
 * weights, and torch's packed int4/int8 CPU ops dequantize to float, so their cost grows with
 * every verify row).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k] for rows r < M, outputs n < N, inputs k < K, where
 *   - x is float32, quantized here per row and per block of 32 values to int8: x ~ d_a[b] * q_a
 *     (d_a = max|x| / 127), the scheme of llama.cpp's Q8_0;
 *   - w is stored per output n and per group g of G inputs (G a multiple of 32) as
 *       4-bit: w = d_w[g] * u + m_w[g], u in [0, 15], 16 bytes per block of 32 (low nibbles are
 *              values 0-15, high nibbles values 16-31: the layout of llama.cpp's Q4 blocks);
 *       8-bit: w = d_w[g] * c, c in [-128, 127].
 * Each block of 32 is an exact integer dot product (vpmaddubsw + vpmaddwd), scaled by
 * d_w * d_a into eight float lanes; the m_w term uses the group's sum of the quantized x.
 *
 * Every row is computed by the same sequence of operations whatever M is and wherever the row
 * sits in the batch, so a verify row equals the same position computed as a one-row step bit for
 * bit (speculative decoding is lossless only if it does). Compile with -ffp-contract=off so the
 * compiler cannot fuse differently in differently inlined copies.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32
/* Tiles are 1 row x 4 outputs or 2 rows x 2 outputs: four accumulators, and at most 12 of the
 * 16 vector registers in use, so nothing spills to the stack. */
#define ROW_TILE 2
#define COL_TILE 4
/* Full unrolling of the tile loops keeps the accumulators in registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* x [M, K] -> q [M, K] int8, d [M, K/32] (block scales), and when s != NULL s [M, K/G]: the sum of
 * the quantized values over each group, sum(d * q), for the 4-bit offset term. Using the
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
            for (int g = 0; g < K / G; g++) {
                float sum = 0.0f;
                for (int b = g * (G / QBLOCK); b < (g + 1) * (G / QBLOCK); b++) {
                    int total = 0;
                    for (int i = 0; i < QBLOCK; i++) total += q[(size_t)r * K + b * QBLOCK + i];
                    sum += d[(size_t)r * (K / QBLOCK) + b] * (float)total;
                }
                s[(size_t)r * (K / G) + g] = sum;
            }
        }
    }
}

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* Eight int32 lanes of sum(u * a) over a block of 32, as floats; u unsigned (< 128), a signed. */
static inline __m256 block_dot(__m256i u, __m256i a) {
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones));
}

/* A tile of `cols` (<= COL_TILE) consecutive outputs times `rows` (<= ROW_TILE) consecutive rows,
 * one accumulator each: a weight block is unpacked once and reused from a register by every row,
 * and the independent accumulators keep the FMA pipeline full even for one row. The sequence of
 * operations on one (row, output) accumulator is the same in every tile shape. `bits` (4 or 8) is
 * a constant at every call, so each width compiles to its own straight-line code. vpmaddubsw
 * multiplies unsigned by signed bytes: 4-bit codes are unsigned already; 8-bit codes go in as
 * |w| with w's sign moved onto the activations. */
static inline __attribute__((always_inline)) void tile(
        int bits, int rows, int cols, int K, int G, const uint8_t *wq, const float *wd, const float *wm,
        const int8_t *q, const float *d, const float *s, float *y, int N) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const int blocks = K / QBLOCK, per_group = G / QBLOCK, groups = K / G;
    const size_t row_bytes = bits == 4 ? K / 2 : K, block_bytes = bits == 4 ? QBLOCK / 2 : QBLOCK;
    __m256 acc[ROW_TILE][COL_TILE];
    UNROLL
    for (int r = 0; r < rows; r++)
        UNROLL
        for (int c = 0; c < cols; c++) acc[r][c] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        __m256i u[COL_TILE], w[COL_TILE];  /* unsigned codes; 8-bit: the signed codes too */
        UNROLL
        for (int c = 0; c < cols; c++) {
            const uint8_t *block = wq + (size_t)c * row_bytes + b * block_bytes;
            if (bits == 4) {
                __m128i packed = _mm_loadu_si128((const __m128i *)block);
                u[c] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
            } else {
                w[c] = _mm256_loadu_si256((const __m256i *)block);
                u[c] = _mm256_sign_epi8(w[c], w[c]);  /* |w| as unsigned bytes (-128 becomes 128) */
            }
        }
        UNROLL
        for (int r = 0; r < rows; r++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(q + (size_t)r * K + b * QBLOCK));
            float da = d[(size_t)r * blocks + b];
            UNROLL
            for (int c = 0; c < cols; c++) {
                __m256 scale = _mm256_set1_ps(wd[(size_t)c * groups + b / per_group] * da);
                __m256i signed_a = bits == 4 ? a : _mm256_sign_epi8(a, w[c]);
                acc[r][c] = _mm256_fmadd_ps(scale, block_dot(u[c], signed_a), acc[r][c]);
            }
        }
    }
    UNROLL
    for (int r = 0; r < rows; r++)
        UNROLL
        for (int c = 0; c < cols; c++) {
            float sum = hsum8(acc[r][c]);
            if (bits == 4) {  /* the offsets: m_w times the group sums of the quantized x */
                float m = 0.0f;
                for (int g = 0; g < groups; g++) m += wm[(size_t)c * groups + g] * s[(size_t)r * groups + g];
                sum += m;
            }
            y[(size_t)r * N + c] = sum;
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

/* Outputs [n0, n0 + cols) for all M rows: tiles of 1 row x 4 outputs when M == 1, else of
 * 2 rows x 2 outputs (an odd last row goes 1 x 2); outputs past the last full tile go 1 x 1. */
#define SWEEP(TILE, N, M)                                                                   \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                       \
    for (int n0 = 0; n0 < (N); n0 += COL_TILE) {                                            \
        if (n0 + COL_TILE > (N)) {                                                          \
            for (int n = n0; n < (N); n++)                                                  \
                for (int r = 0; r < (M); r++) TILE(1, 1, r, n);                             \
        } else if ((M) == 1) {                                                              \
            TILE(1, 4, 0, n0);                                                              \
        } else {                                                                            \
            for (int c = 0; c < COL_TILE; c += 2) {                                         \
                int r = 0;                                                                  \
                for (; r + 2 <= (M); r += 2) TILE(2, 2, r, n0 + c);                         \
                if (r < (M)) TILE(1, 2, r, n0 + c);                                         \
            }                                                                               \
        }                                                                                   \
    }

/* y = x w^T for `bits`-bit weights (4 or 8; `wm` is used for 4 only). Returns 0 on success, -1
 * when out of memory. Output tiles are split across `threads` OpenMP threads. */
int linear_a8(int bits, const float *x, int M, int K, int N, int G, const uint8_t *wq, const float *wd,
              const float *wm, float *y, int threads) {
    Acts a;
    if (!acts_alloc(&a, M, K, G)) { acts_free(&a); return -1; }
    quantize_rows(x, M, K, G, a.q, a.d, bits == 4 ? a.s : NULL);
    const int groups = K / G, blocks = K / QBLOCK;
    const size_t row_bytes = bits == 4 ? K / 2 : K;
#define TILE(BITS, ROWS, COLS, r, n) tile(BITS, ROWS, COLS, K, G, wq + (size_t)(n) * row_bytes, wd + (size_t)(n) * groups, \
                                          BITS == 4 ? wm + (size_t)(n) * groups : NULL, a.q + (size_t)(r) * K, a.d + (size_t)(r) * blocks, \
                                          a.s + (size_t)(r) * groups, y + (size_t)(r) * N + (n), N)
#define TILE4(ROWS, COLS, r, n) TILE(4, ROWS, COLS, r, n)
#define TILE8(ROWS, COLS, r, n) TILE(8, ROWS, COLS, r, n)
    if (bits == 4) {
        SWEEP(TILE4, N, M)
    } else {
        SWEEP(TILE8, N, M)
    }
    acts_free(&a);
    return 0;
}
