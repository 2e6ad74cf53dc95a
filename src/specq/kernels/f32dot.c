/* Float32 linear layers for a few rows on x86 CPUs with AVX2 or AVX-512 (see kernels/f32dot.py for
 * why it is hand-written).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k] for rows r < M, outputs n < N, inputs k < K, with w stored in
 * panels of F32_PANEL outputs, one per float lane of a vector (8 with AVX2, 16 with AVX-512;
 * `f32_panel_width` tells the Python side): panel p holds, for each input k in order, the weights
 * of its outputs for k (one vector), so a broadcast x[r, k] times one vector is one FMA for a whole
 * panel, and the weights stream through memory once per tile of rows (a panel's later tiles find
 * them in cache).
 *
 * Each (row, output) sums its even inputs into one accumulator and its odd ones into another,
 * added at the end: the same order whatever M is, so a verify row equals the same position
 * computed as a one-row step bit for bit; and the same order whatever the vector width, so the
 * AVX2 and AVX-512 variants give the same bits too. A tile's rows give it 2 to 2 * MAX_TILE
 * independent FMA chains; a lone row's two chains wait on FMA latency, which a one-row step
 * streaming from memory hides but a leftover row after a 2-row tile would not (3 rows then cost
 * more than 4), so several rows go in tiles of 2 and more only. AVX-512's 32 registers hold tiles
 * of 8 rows (AVX2's 16, of 4): fewer passes over a panel. Compile with -ffp-contract=off (the FMAs
 * are explicit).
 */
#include "panel.h"

#if defined(__AVX512F__)
#define F32_PANEL 16
#define MAX_TILE 8
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vec vbroadcast(const float *p) { return _mm512_set1_ps(*p); }
static inline vec vfmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
/* All 16 lanes, or the first `valid` in the last panel of a layer whose outputs are not a multiple of 16. */
static inline void store(float *y, vec out, int valid) {
    _mm512_mask_storeu_ps(y, (__mmask16)((1u << valid) - 1), out);
}
#else
#define F32_PANEL PANEL
#define MAX_TILE 4
typedef __m256 vec;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vec vbroadcast(const float *p) { return _mm256_broadcast_ss(p); }
static inline vec vfmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline void store(float *y, vec out, int valid) { store_panel(y, out, valid); }
#endif
#define UNROLL_TILE _Pragma("GCC unroll 8")  /* a tile's row loops, fully: its accumulators stay in registers */

int f32_panel_width(void) { return F32_PANEL; }

static inline __attribute__((always_inline)) void float_panel(
        int rows, int K, const float *w, const float *x, float *y, int N, int valid) {
    vec even[MAX_TILE], odd[MAX_TILE];
    UNROLL_TILE
    for (int r = 0; r < rows; r++) even[r] = odd[r] = vzero();
    int k = 0;
    for (; k + 2 <= K; k += 2) {
        vec w0 = vload(w + (size_t)k * F32_PANEL), w1 = vload(w + (size_t)(k + 1) * F32_PANEL);
        UNROLL_TILE
        for (int r = 0; r < rows; r++) {
            even[r] = vfmadd(vbroadcast(x + (size_t)r * K + k), w0, even[r]);
            odd[r] = vfmadd(vbroadcast(x + (size_t)r * K + k + 1), w1, odd[r]);
        }
    }
    if (k < K) {
        vec w0 = vload(w + (size_t)k * F32_PANEL);
        UNROLL_TILE
        for (int r = 0; r < rows; r++) even[r] = vfmadd(vbroadcast(x + (size_t)r * K + k), w0, even[r]);
    }
    UNROLL_TILE
    for (int r = 0; r < rows; r++) store(y + (size_t)r * N, vadd(even[r], odd[r]), valid);
}

/* How many of the `left` rows the next tile takes: one row alone, else up to MAX_TILE, but never
 * leaving a lone row behind a full tile (MAX_TILE + 1 rows split in two tiles). */
static inline int tile_rows(int left) {
    return left == 1 ? 1 : left == MAX_TILE + 1 ? (MAX_TILE + 2) / 2 : left >= MAX_TILE ? MAX_TILE : left;
}

/* y [M, N] = x [M, K] w^T, w in the panel layout above; panels split across `threads` OpenMP threads. */
void linear_f32(const float *x, int M, int K, int N, const float *w, float *y, int threads) {
    const int panels = (N + F32_PANEL - 1) / F32_PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < panels; p++) {
        const float *wp = w + (size_t)p * K * F32_PANEL;
        float *yp = y + (size_t)p * F32_PANEL;
        int valid = N - p * F32_PANEL < F32_PANEL ? N - p * F32_PANEL : F32_PANEL;
        for (int r = 0; r < M;) {
            int rows = tile_rows(M - r);
            const float *xr = x + (size_t)r * K;
            float *yr = yp + (size_t)r * N;
            switch (rows) {  /* constant row counts: each tile compiles to straight-line code */
#if MAX_TILE >= 8
                case 8: float_panel(8, K, wp, xr, yr, N, valid); break;
                case 7: float_panel(7, K, wp, xr, yr, N, valid); break;
                case 6: float_panel(6, K, wp, xr, yr, N, valid); break;
                case 5: float_panel(5, K, wp, xr, yr, N, valid); break;
#endif
                case 4: float_panel(4, K, wp, xr, yr, N, valid); break;
                case 3: float_panel(3, K, wp, xr, yr, N, valid); break;
                case 2: float_panel(2, K, wp, xr, yr, N, valid); break;
                default: float_panel(1, K, wp, xr, yr, N, valid);
            }
            r += rows;
        }
    }
}
