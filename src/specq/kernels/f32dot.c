/* Float32 linear layers for a few rows on x86 CPUs with AVX2 (see kernels/f32dot.py for why it is
 * hand-written).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k] for rows r < M, outputs n < N, inputs k < K, with w stored in
 * panels of 8 outputs: panel p holds, for each input k in order, the 8 weights w[8p..8p+7, k] (one
 * vector), so a broadcast x[r, k] times one vector is one FMA for 8 outputs and the weights stream
 * through memory once per tile of up to 4 rows. N is padded to a multiple of 8 with zeros.
 *
 * Every (row, output) is summed in the same order whatever M is (even inputs into one
 * accumulator, odd ones into another, then the two added), so a verify row equals the same
 * position computed as a one-row step bit for bit. Compile with -ffp-contract=off (the FMAs are
 * explicit).
 */
#include <immintrin.h>
#include <string.h>

#define PANEL 8
#define UNROLL _Pragma("GCC unroll 4")

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
        if (valid == PANEL) {
            _mm256_storeu_ps(y + (size_t)r * N, out);
        } else {
            float lanes[PANEL];
            _mm256_storeu_ps(lanes, out);
            memcpy(y + (size_t)r * N, lanes, sizeof(float) * valid);
        }
    }
}

/* y [M, N] = x [M, K] w^T, w in the panel layout above; panels split across `threads` OpenMP threads. */
void linear_f32(const float *x, int M, int K, int N, const float *w, float *y, int threads) {
    const int panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int p = 0; p < panels; p++) {
        const float *wp = w + (size_t)p * K * PANEL;
        float *yp = y + (size_t)p * PANEL;
        int valid = N - p * PANEL < PANEL ? N - p * PANEL : PANEL, r = 0;
        for (; r + 4 <= M; r += 4) float_panel(4, K, wp, x + (size_t)r * K, yp + (size_t)r * N, N, valid);
        if (r + 2 <= M) { float_panel(2, K, wp, x + (size_t)r * K, yp + (size_t)r * N, N, valid); r += 2; }
        if (r < M) float_panel(1, K, wp, x + (size_t)r * K, yp + (size_t)r * N, N, valid);
    }
}
