/* Every decoder layer of a cached pass in one call (`decoder_layers`, see kernels/decoder.py for why
 * it is hand-written), for float32 models on x86 CPUs with AVX2 or AVX-512 whose linear layers all
 * run on int8dot or f32dot (compiled into the same object): RMSNorm, the rows' attention (rotary
 * embedding, the cache write, and each row's softmax attention over exactly the keys it sees, on a
 * sliding layer the last `window` of them), the gated activation (SiLU or tanh-approximated GELU)
 * and, where a layer has them, q/k/v biases, per-head q/k norms and norms after attention and
 * feed-forward. No Python runs between the kernels of a pass.
 *
 * Every row is computed by the same sequence of operations whatever the number of rows and
 * wherever the row sits, so a verify row equals the same position computed as a one-row step bit
 * for bit. Compile with -ffp-contract=off: the rotary embedding then rounds as torch's
 * `x * cos + rotate_half(x) * sin` does.
 *
 * Across variants: the dot products (attention scores, the norm's sum of squares) are summed in
 * vectors of 8 lanes with AVX2 and 16 with AVX-512, so the two variants' results differ in
 * rounding; the elementwise loops and the attention's weighted sum of values round alike in both.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vec vset1(float a) { return _mm512_set1_ps(a); }
static inline vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline void vstore(float *p, vec a) { _mm512_storeu_ps(p, a); }

/* sum(a[i] * b[i]) over i < K: sixteen lanes in a fixed order (the last K % 16 masked in), then
 * the lanes summed. */
static inline float dot(const float *a, const float *b, int K) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    if (i < K) {
        __mmask16 tail = (__mmask16)((1u << (K - i)) - 1);
        acc = _mm512_mask_add_ps(acc, tail, acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, a + i),
                                                               _mm512_maskz_loadu_ps(tail, b + i)));
    }
    return _mm512_reduce_add_ps(acc);
}
#else
#define LANES 8
typedef __m256 vec;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vec vset1(float a) { return _mm256_set1_ps(a); }
static inline vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline void vstore(float *p, vec a) { _mm256_storeu_ps(p, a); }

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* sum(a[i] * b[i]) over i < K: eight lanes in a fixed order, then the scalar tail. */
static inline float dot(const float *a, const float *b, int K) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= K; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    float sum = hsum8(acc);
    for (; i < K; i++) sum += a[i] * b[i];
    return sum;
}
#endif

#define UNROLL4 _Pragma("GCC unroll 4")  /* fully: the partial sums stay in registers */

/* o[d] for `vectors` (a constant at each call) vectors of outputs from d on: sum over the keys in
 * order of p[j] * v_j[d], multiplied then added (so each element rounds as a plain loop over the
 * keys would), the partial sums kept in registers across all keys. */
static inline __attribute__((always_inline)) void weighted_vectors(
        int vectors, const float *p, int keys, const float *vh, const int *slots, int D, int d, float *o) {
    vec acc[4];
    UNROLL4
    for (int c = 0; c < vectors; c++) acc[c] = vzero();
    for (int j = 0; j < keys; j++) {
        const float *v = vh + (size_t)(slots ? slots[j] : j) * D + d;
        vec weight = vset1(p[j]);
        UNROLL4
        for (int c = 0; c < vectors; c++) acc[c] = vadd(acc[c], vmul(weight, vload(v + c * LANES)));
    }
    UNROLL4
    for (int c = 0; c < vectors; c++) vstore(o + d + c * LANES, acc[c]);
}

/* o [D] = sum_j p[j] * v_j over the `keys` value rows v_j = vh[slots ? slots[j] : j]: four vectors
 * of outputs at a time, then one, then a scalar tail, each element summed in the same order. */
static void weighted_sum(const float *p, int keys, const float *vh, const int *slots, int D, float *o) {
    int d = 0;
    for (; d + 4 * LANES <= D; d += 4 * LANES) weighted_vectors(4, p, keys, vh, slots, D, d, o);
    for (; d + LANES <= D; d += LANES) weighted_vectors(1, p, keys, vh, slots, D, d, o);
    for (; d < D; d++) {
        float sum = 0.0f;
        for (int j = 0; j < keys; j++) sum += p[j] * vh[(size_t)(slots ? slots[j] : j) * D + d];
        o[d] = sum;
    }
}

/* y = x / sqrt(mean(x^2) + eps) * w per row of x [M, K] (y may be x). */
static void rms_norm(const float *x, int M, int K, const float *w, float eps, float *y) {
    for (int r = 0; r < M; r++) {
        const float *xr = x + (size_t)r * K;
        float *yr = y + (size_t)r * K;
        float inv = 1.0f / sqrtf(dot(xr, xr, K) / (float)K + eps);
        for (int i = 0; i < K; i++) yr[i] = xr[i] * inv * w[i];
    }
}

/* gelu(x) with tanh's approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). */
static inline float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

enum { SILU, GELU_TANH };  /* the gate's activation, as decoder.py's ACTIVATIONS numbers them */

/* y [M, I] = act(gate) * up, from gu [M, 2I] (gate, then up, per row). */
static void gated(const float *gu, int M, int I, int act, float *y) {
    for (int r = 0; r < M; r++) {
        const float *g = gu + (size_t)r * 2 * I, *u = g + I;
        float *yr = y + (size_t)r * I;
        if (act == GELU_TANH)
            for (int i = 0; i < I; i++) yr[i] = gelu_tanh(g[i]) * u[i];
        else
            for (int i = 0; i < I; i++) yr[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* x [D] rotated by the angles whose cos and sin are given: x * cos + rotate_half(x) * sin, where
 * rotate_half(x) = (-x[D/2:], x[:D/2]). */
static inline void rotate(const float *x, const float *cos, const float *sin, int D, float *out) {
    int half = D / 2;
    for (int j = 0; j < half; j++) out[j] = x[j] * cos[j] + (-x[j + half]) * sin[j];
    for (int j = half; j < D; j++) out[j] = x[j] * cos[j] + x[j - half] * sin[j];
}

/* The attention of n rows written at slots start..start+n-1 of one layer's cache.
 *   qkv [n, (H + 2 Hkv) D]: each row's queries, keys and values, heads in order, not yet rotated;
 *   cos, sin [n, D]: each row's rotary angles;
 *   k_cache, v_cache [Hkv, capacity, D]: rotated keys and values of the slots before `start`; the
 *     rows' own are written here;
 *   seen: NULL for a chain (row i sees slots 0..start+i), else for each row i the slots
 *     seen[offsets[i]..offsets[i+1]) in order (a token tree: the prefix and the row's ancestors);
 *   window: 0, or a sliding layer's window: each row sees only the last `window` of those slots;
 *   out [n, H D]: per row and head, softmax(q k^T * scale) v over the seen slots.
 * Query head h reads key/value head h / (H / Hkv). Returns 0, or -1 when out of memory. */
static int attend_rows(const float *qkv, int n, int H, int Hkv, int D, const float *cos, const float *sin,
                       float *k_cache, float *v_cache, int capacity, int start, const int *seen, const int *offsets,
                       int window, float scale, float *out, int threads) {
    const size_t row = (size_t)(H + 2 * Hkv) * D;
    float *q = malloc(sizeof(float) * (size_t)n * H * D);
    int most = 0;
    for (int i = 0; i < n; i++) {
        int keys = seen ? offsets[i + 1] - offsets[i] : start + i + 1;
        if (keys > most) most = keys;
    }
    float *scores = malloc(sizeof(float) * (size_t)most * n * H);
    if (!q || !scores) { free(q); free(scores); return -1; }
    for (int i = 0; i < n; i++) {
        const float *r = qkv + i * row, *c = cos + (size_t)i * D, *s = sin + (size_t)i * D;
        for (int h = 0; h < H; h++) rotate(r + (size_t)h * D, c, s, D, q + ((size_t)i * H + h) * D);
        for (int h = 0; h < Hkv; h++) {
            size_t slot = ((size_t)h * capacity + start + i) * D;
            rotate(r + (size_t)(H + h) * D, c, s, D, k_cache + slot);
            for (int j = 0; j < D; j++) v_cache[slot + j] = r[(size_t)(H + Hkv + h) * D + j];
        }
    }
    const int group = H / Hkv;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < n * H; t++) {
        int i = t / H, h = t % H, kv = h / group;
        int keys = seen ? offsets[i + 1] - offsets[i] : start + i + 1;
        int skip = window && keys > window ? keys - window : 0;  /* the path's keys before the window */
        keys -= skip;
        const int *slots = seen ? seen + offsets[i] + skip : NULL;
        size_t first = seen ? 0 : (size_t)skip * D;  /* a chain's keys are the consecutive slots from `skip` */
        const float *qh = q + (size_t)t * D;
        const float *kh = k_cache + (size_t)kv * capacity * D + first, *vh = v_cache + (size_t)kv * capacity * D + first;
        float *p = scores + (size_t)t * most;
        float top = -INFINITY;
        for (int j = 0; j < keys; j++) {
            p[j] = dot(qh, kh + (size_t)(slots ? slots[j] : j) * D, D) * scale;
            top = fmaxf(top, p[j]);
        }
        float total = 0.0f;
        for (int j = 0; j < keys; j++) {
            p[j] = expf(p[j] - top);
            total += p[j];
        }
        float *o = out + (size_t)i * H * D + (size_t)h * D;
        weighted_sum(p, keys, vh, slots, D, o);
        for (int d = 0; d < D; d++) o[d] /= total;
    }
    free(q);
    free(scores);
    return 0;
}

/* ------------------------------------------------------------------ whole layers in one call */

/* int8dot.c and f32dot.c, compiled into the same shared object. */
int linear_a8(int bits, const float *x, int M, int K, int N, int G, const uint8_t *wq, const float *wd,
              const float *wm, const int8_t *ws, float *y, int threads);
void linear_f32(const float *x, int M, int K, int N, const float *w, float *y, int threads);

typedef struct { int bits, group; const uint8_t *codes; const float *d, *m; const int8_t *sub; } QuantWeight;
typedef struct {
    const float *attention_norm, *ffn_norm;
    QuantWeight wqkv, wo, w13, w2;
    /* NULL where the architecture has none: a q/k/v bias (Qwen2), per-head q/k norms (Qwen3, Gemma 3),
     * norms of the attention and feed-forward outputs (Gemma 3) */
    const float *qkv_bias, *q_norm, *k_norm, *post_attention_norm, *post_ffn_norm;
    int window;  /* 0, or a sliding layer's window */
    int local_rope;  /* whether the layer rotates by the local rope tables (Gemma 3's sliding layers) */
} Layer;

/* bits 4, 6 or 8: int8dot's codes and scales; bits 32: f32dot's float panels in `codes`. */
static int linear(const QuantWeight *w, const float *x, int M, int K, int N, float *y, int threads) {
    if (w->bits == 32) {
        linear_f32(x, M, K, N, (const float *)w->codes, y, threads);
        return 0;
    }
    return linear_a8(w->bits, x, M, K, N, w->group, w->codes, w->d, w->m, w->sub, y, threads);
}

static void add_into(float *x, const float *y, size_t count) {
    for (size_t i = 0; i < count; i++) x[i] = x[i] + y[i];
}

/* What `Attention.projected` does to the q/k/v linear layer's output qkv [n, (H + 2 Hkv) D], in
 * place and in its order: the bias added, then each head's queries and keys normalized (the norm
 * weights both given, or neither). */
static void project(float *qkv, int n, int H, int Hkv, int D, const float *bias, const float *q_norm,
                    const float *k_norm, float eps) {
    const size_t width = (size_t)(H + 2 * Hkv) * D;
    for (int r = 0; r < n; r++) {
        float *row = qkv + r * width;
        if (bias) add_into(row, bias, width);
        if (q_norm) {
            rms_norm(row, H, D, q_norm, eps, row);
            rms_norm(row + (size_t)H * D, Hkv, D, k_norm, eps, row + (size_t)H * D);
        }
    }
}

/* One sequence's rows in a pass: `rows` rows (consecutive in x) written at `start` of its own
 * cache, whose layer 0 is k, v [Hkv, capacity, D] and each next layer layer_stride floats further;
 * seen, offsets as in attend_rows. */
typedef struct {
    int rows, start, capacity;
    long layer_stride;
    float *k, *v;
    const int *seen, *offsets;
} Part;

/* The L decoder layers of a cached pass, x [n, hidden] updated in place, for a model whose linear
 * layers all run on int8dot or f32dot: what `Block.forward` computes, with a layer's q/k/v bias, q/k
 * norms, post-norms, window and local rope where it has them; `act` the gate's activation (SILU or
 * GELU_TANH); local_cos, local_sin [n, D] the rows' angles on layers with `local_rope` (else NULL).
 * The n rows may be several sequences' (`parts`, in order): the linear layers run once over all of
 * them (each weight read once), and each part attends to its own cache only. The other arguments
 * are those of attend_rows, rms_norm and linear_a8. Returns 0, or -1 when out of memory. */
int decoder_layers(int L, const Layer *layers, float *x, int n, int hidden, int H, int Hkv, int D, int inter,
                   float eps, float scale, int act, const float *cos, const float *sin, const float *local_cos,
                   const float *local_sin, int parts, const Part *part, int threads) {
    const int width = (H + 2 * Hkv) * D, q_size = H * D;
    float *h = malloc(sizeof(float) * (size_t)n * (2 * hidden + width + q_size + 3 * inter));
    if (!h) return -1;
    float *qkv = h + (size_t)n * hidden, *att = qkv + (size_t)n * width, *o = att + (size_t)n * q_size;
    float *gate_up = o + (size_t)n * hidden, *gated_out = gate_up + (size_t)n * 2 * inter;
    int failed = 0;
    for (int l = 0; l < L && !failed; l++) {
        const Layer *w = layers + l;
        const float *rope_cos = w->local_rope ? local_cos : cos, *rope_sin = w->local_rope ? local_sin : sin;
        rms_norm(x, n, hidden, w->attention_norm, eps, h);
        failed |= linear(&w->wqkv, h, n, hidden, width, qkv, threads);
        project(qkv, n, H, Hkv, D, w->qkv_bias, w->q_norm, w->k_norm, eps);
        for (int p = 0, at = 0; p < parts; at += part[p].rows, p++) {
            const Part *s = part + p;
            failed |= attend_rows(qkv + (size_t)at * width, s->rows, H, Hkv, D, rope_cos + (size_t)at * D,
                                  rope_sin + (size_t)at * D, s->k + l * s->layer_stride, s->v + l * s->layer_stride,
                                  s->capacity, s->start, s->seen, s->offsets, w->window, scale,
                                  att + (size_t)at * q_size, threads);
        }
        failed |= linear(&w->wo, att, n, q_size, hidden, o, threads);
        if (w->post_attention_norm) rms_norm(o, n, hidden, w->post_attention_norm, eps, o);
        add_into(x, o, (size_t)n * hidden);
        rms_norm(x, n, hidden, w->ffn_norm, eps, h);
        failed |= linear(&w->w13, h, n, hidden, 2 * inter, gate_up, threads);
        gated(gate_up, n, inter, act, gated_out);
        failed |= linear(&w->w2, gated_out, n, inter, hidden, o, threads);
        if (w->post_ffn_norm) rms_norm(o, n, hidden, w->post_ffn_norm, eps, o);
        add_into(x, o, (size_t)n * hidden);
    }
    free(h);
    return failed ? -1 : 0;
}
