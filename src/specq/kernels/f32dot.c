/* Float32 linear layers for a few rows on x86 CPUs with AVX2 (see kernels/f32dot.py for why it is
 * hand-written).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k] for rows r < M, outputs n < N, inputs k < K, with w stored in
 * panels of 8 outputs: panel p holds, for each input k in order, the 8 weights w[8p..8p+7, k] (one
 * vector), so a broadcast x[r, k] times one vector is one FMA for 8 outputs, and the weights stream
 * through memory once per tile of up to 4 rows (a panel's later tiles find them in cache).
 *
 * Each (row, output) sums its even inputs into one accumulator and its odd ones into another,
 * added at the end: the same order whatever M is, so a verify row equals the same position
 * computed as a one-row step bit for bit. A tile's rows give it 2 to 8 independent FMA chains; a
 * lone row's two chains wait on FMA latency, which a one-row step streaming from memory hides but
 * a leftover row after a 2-row tile would not (3 rows then cost more than 4), so several rows go
 * in tiles of 4, 3 and 2 only. Compile with -ffp-contract=off (the FMAs are explicit).
 */
#include "panel.h"

static inline __attribute__((always_inline)) void float_panel(
        int rows, int K, const float *w, const float *x, float *y, int N, int valid) {
    __m256 even[4], odd[4];
    UNROLL
    for (int r = 0; r < rows; r++) even[r] = odd[r] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 2 <= K; k += 2) {
        __m256 w0 = _mm256_loadu_ps(w + (size_t)k * PANEL), w1 = _mm256_loadu_ps(w + (size_t)(k + 1) * PANEL);
        UNROLL
        for (int r = 0; r < rows; r++) {
            even[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * K + k), w0, even[r]);
            odd[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * K + k + 1), w1, odd[r]);
        }
    }
    if (k < K) {
        __m256 w0 = _mm256_loadu_ps(w + (size_t)k * PANEL);
        UNROLL
        for (int r = 0; r < rows; r++) even[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(x + (size_t)r * K + k), w0, even[r]);
    }
    UNROLL
    for (int r = 0; r < rows; r++) {
        __m256 out = _mm256_add_ps(even[r], odd[r]);
        store_panel(y + (size_t)r * N, out, valid);
    }
}

/* y [M, N] = x [M, K] w^T, w in the panel layout above; panels split across `threads` OpenMP threads.
 * One row goes alone; more go in tiles of 4, and the last 2, 3 or 5 in tiles of 2 and 3. */
void linear_f32(const float *x, int M, int K, int N, const float *w, float *y, int threads) {
    const int panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < panels; p++) {
        const float *wp = w + (size_t)p * K * PANEL;
        float *yp = y + (size_t)p * PANEL;
        int valid = N - p * PANEL < PANEL ? N - p * PANEL : PANEL;
        for (int r = 0; r < M;) {
            int left = M - r, rows = left == 1 ? 1 : left == 5 ? 3 : left >= 4 ? 4 : left;
            const float *xr = x + (size_t)r * K;
            float *yr = yp + (size_t)r * N;
            switch (rows) {  /* constant row counts: each tile compiles to straight-line code */
                case 4: float_panel(4, K, wp, xr, yr, N, valid); break;
                case 3: float_panel(3, K, wp, xr, yr, N, valid); break;
                case 2: float_panel(2, K, wp, xr, yr, N, valid); break;
                default: float_panel(1, K, wp, xr, yr, N, valid);
            }
            r += rows;
        }
    }
}
