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
 * Across variants: the dot products (attention scores, the norm's sum of squares) and the softmax's
 * sum are summed in vectors of 8 lanes with AVX2 and 16 with AVX-512, so the two variants' results
 * differ in rounding; the elementwise loops (the softmax's exponential included) and the
 * attention's weighted sum of values round alike in both.
 *
 * Attention is hand-scheduled for grouped-query models at long contexts: the query heads that share
 * a key/value head are scored and summed together, so each cached key and value is read once per
 * row rather than once per query head, and the softmax's exponentials run in vectors.
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

static inline vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec vmin(vec a, vec b) { return _mm512_min_ps(a, b); }
static inline float vsum(vec a) { return _mm512_reduce_add_ps(a); }
static inline float vtop(vec a) { return _mm512_reduce_max_ps(a); }
static inline vec vfloor(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
static inline vec vpow2i(vec n) {  /* 2^n for whole n in [-127, 127] */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec vload_part(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }

/* The lane sums of a[0..15] as one vector (lane t: the sum of a[t]'s lanes), by a transposing tree
 * of adds: 45 operations for sixteen sums where sixteen reductions take about twice as many. */
static inline vec lane_sums(const vec *a) {
    vec s[8], u[4], v[2];
    for (int k = 0; k < 8; k++)  /* per 128 bits: a[2k] and a[2k + 1], lanes 0 + 2 and 1 + 3 */
        s[k] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm512_unpackhi_ps(a[2 * k], a[2 * k + 1]));
    for (int k = 0; k < 4; k++) {  /* per 128 bits: the four sums of a[4k..4k + 3] */
        __m512d x = _mm512_castps_pd(s[2 * k]), y = _mm512_castps_pd(s[2 * k + 1]);
        u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    for (int k = 0; k < 2; k++)  /* the four 128-bit quarters summed in pairs */
        v[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x88), _mm512_shuffle_f32x4(v[0], v[1], 0xDD));
}

/* sum(a[i] * b[i]) over i < K: sixteen lanes in a fixed order (the last K % 16 masked in), then the
 * lanes summed. */
static inline float dot(const float *a, const float *b, int K) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= K; i += 16) acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    if (i < K) {
        __mmask16 tail = (__mmask16)((1u << (K - i)) - 1);
        acc = _mm512_mask_add_ps(acc, tail, acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, a + i), _mm512_maskz_loadu_ps(tail, b + i)));
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

static inline vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec vdiv(vec a, vec b) { return _mm256_div_ps(a, b); }
static inline vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec vmin(vec a, vec b) { return _mm256_min_ps(a, b); }
static inline float vsum(vec a) { return hsum8(a); }
static inline float vtop(vec a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
static inline vec vfloor(vec a) { return _mm256_floor_ps(a); }
static inline vec vpow2i(vec n) {  /* 2^n for whole n in [-127, 127] */
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vload_part(const float *p, int n) {
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* The lane sums of a[0..7] as one vector (lane t: the sum of a[t]'s lanes), by a transposing tree of
 * adds. */
static inline vec lane_sums(const vec *a) {
    vec s[4], u[2];
    for (int k = 0; k < 4; k++)  /* per 128 bits: a[2k] and a[2k + 1], lanes 0 + 2 and 1 + 3 */
        s[k] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * k], a[2 * k + 1]), _mm256_unpackhi_ps(a[2 * k], a[2 * k + 1]));
    for (int k = 0; k < 2; k++) {  /* per 128 bits: the four sums of a[4k..4k + 3] */
        __m256d x = _mm256_castps_pd(s[2 * k]), y = _mm256_castps_pd(s[2 * k + 1]);
        u[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
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

/* p_h[t] = scale * (q_h . k_t) for the `count` (<= LANES) keys k_t, t < count, and the `heads`
 * query vectors q_h = q + h D, the scores of head h stored from p + h stride; the keys at
 * k0 + t D (consecutive slots) or, when k0 is NULL, at k[t]. A key's products run down its own
 * lanes (fused multiply-adds over the D inputs, LANES at a time, the last D % LANES masked in) and
 * `lane_sums` sums them for all the block's keys at once: a score rounds the same whatever keys
 * share its block, how they are addressed, or how many rows the pass has. */
static inline __attribute__((always_inline)) const float *key_at(const float *k0, const float *const *k, int t, int D) {
    return k0 ? k0 + (size_t)t * D : k[t];
}

static inline __attribute__((always_inline)) void scores_of(int heads, const float *q, const float *k0,
                                                            const float *const *k, int count, int D, float scale,
                                                            float *p, int stride) {
    for (int h = 0; h < heads; h++) {
        const float *qh = q + (size_t)h * D;
        vec acc[LANES];
        for (int t = 0; t < LANES; t++) acc[t] = vzero();
        int d = 0;
        for (; d + LANES <= D; d += LANES) {
            vec qv = vload(qh + d);
            for (int t = 0; t < LANES; t++) acc[t] = vfma(qv, vload(key_at(k0, k, t, D) + d), acc[t]);
        }
        if (d < D) {
            vec qv = vload_part(qh + d, D - d);
            for (int t = 0; t < LANES; t++) acc[t] = vfma(qv, vload_part(key_at(k0, k, t, D) + d, D - d), acc[t]);
        }
        vec scores = vmul(lane_sums(acc), vset1(scale));
        float *ph = p + (size_t)h * stride;
        if (count == LANES) {
            vstore(ph, scores);
        } else {
            float part[LANES];
            vstore(part, scores);
            for (int t = 0; t < count; t++) ph[t] = part[t];
        }
    }
}

/* scores_of for the keys in cache slots slot[t] (or first + t when slot is NULL) of kh [slots, D].
 * A full block of consecutive slots is addressed from one pointer where the head size is a common
 * one (a constant, so each key's offset is an immediate): sixteen key pointers do not fit in the
 * general registers beside the loop's own, and reloading them slows the products they feed. */
static void block_scores(int heads, const float *q, const float *kh, const int *slot, int first, int count, int D,
                         float scale, float *p, int stride) {
    if (!slot && count == LANES) {
        const float *k0 = kh + (size_t)first * D;
        switch (D) {
            case 64: scores_of(heads, q, k0, NULL, LANES, 64, scale, p, stride); return;
            case 128: scores_of(heads, q, k0, NULL, LANES, 128, scale, p, stride); return;
            case 256: scores_of(heads, q, k0, NULL, LANES, 256, scale, p, stride); return;
            default: break;
        }
    }
    const float *k[LANES];
    for (int t = 0; t < LANES; t++)  /* past count: not stored */
        k[t] = kh + (size_t)(slot ? slot[t < count ? t : 0] : first + (t < count ? t : 0)) * D;
    scores_of(heads, q, NULL, k, count, D, scale, p, stride);
}

/* e^x per lane (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n), within two
 * ulp of expf for x in [-87, 88], x clamped to that range. Each lane's result depends on that
 * lane only, so a value rounds alike wherever it sits in a row. */
static inline vec vexp(vec x) {
    x = vmin(vmax(x, vset1(-87.0f)), vset1(88.0f));
    vec n = vfloor(vadd(vmul(x, vset1(1.44269504088896341f)), vset1(0.5f)));
    vec r = vadd(vadd(x, vmul(n, vset1(-0.693359375f))), vmul(n, vset1(2.12194440e-4f)));
    vec y = vset1(1.9875691500e-4f);
    y = vadd(vmul(y, r), vset1(1.3981999507e-3f));
    y = vadd(vmul(y, r), vset1(8.3334519073e-3f));
    y = vadd(vmul(y, r), vset1(4.1665795894e-2f));
    y = vadd(vmul(y, r), vset1(1.6666665459e-1f));
    y = vadd(vmul(y, r), vset1(5.0000001201e-1f));
    y = vadd(vadd(vmul(vmul(y, r), r), r), vset1(1.0f));
    return vmul(y, vpow2i(n));
}

/* p [keys] <- exp(p - max(p)); returns their sum, in a fixed order for a given count. */
static float softmax_numerators(float *p, int keys) {
    int full = keys - keys % LANES;
    vec top_lanes = vset1(-INFINITY);
    for (int j = 0; j < full; j += LANES) top_lanes = vmax(top_lanes, vload(p + j));
    float top = vtop(top_lanes);
    for (int j = full; j < keys; j++) top = fmaxf(top, p[j]);
    vec top_v = vset1(top), sums = vzero();
    for (int j = 0; j < full; j += LANES) {
        vec e = vexp(vsub(vload(p + j), top_v));
        vstore(p + j, e);
        sums = vadd(sums, e);
    }
    float total = vsum(sums);
    if (full < keys) {  /* the tail through the same lanes' code, padded */
        float rest[LANES];
        for (int j = 0; j < LANES; j++) rest[j] = full + j < keys ? p[full + j] : top;
        vstore(rest, vexp(vsub(vload(rest), top_v)));
        for (int j = 0; j < keys - full; j++) {
            p[full + j] = rest[j];
            total += rest[j];
        }
    }
    return total;
}

#if defined(__AVX512F__)
#define SUM_HEADS 4  /* heads whose weighted sums share each load of a value vector */
#else
#define SUM_HEADS 2
#endif
#define WEIGHTED 64  /* sums gathered per call of weighted_sum: a task's heads of one row at least */

/* One weighted sum of value vectors: o [D] = sum over j < keys of p[j] * v_j (one query head of one
 * row, before the softmax's division). */
typedef struct { const float *p; float *o; int keys; } Weighted;

/* w[s].o[d..] for `vectors` vectors of outputs from d on, for `sums` sums (both constants at each
 * call): sum over the keys in order of p[j] * v_j[d], one fused multiply-add per key (so each
 * element rounds as a plain fmaf loop over its keys would, on either variant), the partial sums kept
 * in registers. The keys all the sums take share each load of a value vector; each sum then goes on
 * alone over the keys left of its own. */
static inline __attribute__((always_inline)) void weighted_vectors(
        int sums, int vectors, const Weighted *w, const float *vh, const int *slots, int D, int d) {
    vec acc[SUM_HEADS][4];
    int common = w[0].keys;
    for (int s = 0; s < sums; s++) {
        if (w[s].keys < common) common = w[s].keys;
        UNROLL4
        for (int c = 0; c < vectors; c++) acc[s][c] = vzero();
    }
    for (int j = 0; j < common; j++) {
        const float *v = vh + (size_t)(slots ? slots[j] : j) * D + d;
        vec values[4];
        UNROLL4
        for (int c = 0; c < vectors; c++) values[c] = vload(v + c * LANES);
        for (int s = 0; s < sums; s++) {
            vec weight = vset1(w[s].p[j]);
            UNROLL4
            for (int c = 0; c < vectors; c++) acc[s][c] = vfma(weight, values[c], acc[s][c]);
        }
    }
    for (int s = 0; s < sums; s++) {
        for (int j = common; j < w[s].keys; j++) {
            const float *v = vh + (size_t)(slots ? slots[j] : j) * D + d;
            vec weight = vset1(w[s].p[j]);
            UNROLL4
            for (int c = 0; c < vectors; c++) acc[s][c] = vfma(weight, vload(v + c * LANES), acc[s][c]);
        }
        UNROLL4
        for (int c = 0; c < vectors; c++) vstore(w[s].o + d + c * LANES, acc[s][c]);
    }
}

/* weighted_vectors over d in [d, d + vectors LANES) for any number of sums, SUM_HEADS at a time. */
static inline __attribute__((always_inline)) void weighted_span(
        int sums, int vectors, const Weighted *w, const float *vh, const int *slots, int D, int d) {
    for (int s = 0; s < sums; s += SUM_HEADS) {
        if (sums - s >= SUM_HEADS) weighted_vectors(SUM_HEADS, vectors, w + s, vh, slots, D, d);
#if SUM_HEADS == 4
        else if (sums - s == 3) weighted_vectors(3, vectors, w + s, vh, slots, D, d);
        else if (sums - s == 2) weighted_vectors(2, vectors, w + s, vh, slots, D, d);
#endif
        else weighted_vectors(1, vectors, w + s, vh, slots, D, d);
    }
}

/* Each w[s].o [D] = sum_j w[s].p[j] * v_j over its keys, the value rows v_j = vh[slots ? slots[j] : j]:
 * four vectors of outputs at a time, then one, then a scalar tail, each element summed over the
 * keys in order. */
static void weighted_sum(int sums, const Weighted *w, const float *vh, const int *slots, int D) {
    int d = 0;
    for (; d + 4 * LANES <= D; d += 4 * LANES) weighted_span(sums, 4, w, vh, slots, D, d);
    for (; d + LANES <= D; d += LANES) weighted_span(sums, 1, w, vh, slots, D, d);
    for (; d < D; d++)
        for (int s = 0; s < sums; s++) {
            float sum = 0.0f;
            for (int j = 0; j < w[s].keys; j++) sum = fmaf(w[s].p[j], vh[(size_t)(slots ? slots[j] : j) * D + d], sum);
            w[s].o[d] = sum;
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

/* The model's final norm after the layers, exported: the same rms_norm as every layer's own (a torch
 * op between two C calls costs a short pass more than its arithmetic). */
void rms_norm_rows(const float *x, int M, int K, const float *w, float eps, float *y) {
    rms_norm(x, M, K, w, eps, y);
}

enum { SILU, GELU_TANH };  /* the gate's activation, as decoder.py's ACTIVATIONS numbers them */

/* act(g) * u per lane: SiLU, g / (1 + e^-g), or GELU with tanh's approximation,
 * 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) with tanh(z) = 1 - 2 / (e^2z + 1). */
static inline vec gate_times_up(vec g, vec u, int act) {
    if (act == GELU_TANH) {
        vec z = vmul(vset1(0.7978845608028654f), vadd(g, vmul(vmul(vmul(vset1(0.044715f), g), g), g)));
        vec tanh_z = vsub(vset1(1.0f), vdiv(vset1(2.0f), vadd(vexp(vadd(z, z)), vset1(1.0f))));
        return vmul(vmul(vmul(vset1(0.5f), g), vadd(vset1(1.0f), tanh_z)), u);
    }
    return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), u);
}

#define GATED_SPAN 512  /* elements of a row per task */

/* y [M, I] = act(gate) * up, from gu [M, 2I] (gate, then up, per row), in vectors (a row's tail
 * through the same code, padded), spans of rows split over the threads. */
static void gated(const float *gu, int M, int I, int act, float *y, int threads) {
    const int spans = (I + GATED_SPAN - 1) / GATED_SPAN;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < M * spans; t++) {
        const int r = t / spans, from = t % spans * GATED_SPAN, to = from + GATED_SPAN < I ? from + GATED_SPAN : I;
        const float *g = gu + (size_t)r * 2 * I, *u = g + I;
        float *yr = y + (size_t)r * I;
        int i = from;
        for (; i + LANES <= to; i += LANES) vstore(yr + i, gate_times_up(vload(g + i), vload(u + i), act));
        if (i < to) {
            float gs[LANES] = {0}, us[LANES] = {0}, out[LANES];
            for (int j = 0; i + j < to; j++) gs[j] = g[i + j], us[j] = u[i + j];
            vstore(out, gate_times_up(vload(gs), vload(us), act));
            for (int j = 0; i + j < to; j++) yr[i + j] = out[j];
        }
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
    /* A task is some of the query heads of one key/value head for one row, or for a chain without a
     * window (where every row sees the slots from 0 on) for a set of rows: each key and value is read
     * once for all of its heads, and a block of keys once for all of its rows. The heads are split
     * only as far as the threads need, and a thread's tasks go over the rows of one key/value head,
     * whose keys then stay in its cache. */
    const int group = H / Hkv, shared = !seen && !window;
    int split = 1, sets = shared ? 1 : n;
    while (split < group && (group % split || sets * Hkv * split < threads || group / split > WEIGHTED)) split++;
    if (shared && sets * Hkv * split < threads) sets = n < threads / (Hkv * split) ? n : threads / (Hkv * split);
    const int heads = group / split, tasks = sets * Hkv * split;  /* heads <= WEIGHTED */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int t = 0; t < tasks; t++) {
        const int set = t % sets, kv = t / sets / split, h0 = kv * group + (t / sets % split) * heads;
        const int i0 = set * n / sets, i1 = (set + 1) * n / sets;  /* the rows [i0, i1) */
        const float *kh = k_cache + (size_t)kv * capacity * D, *vh = v_cache + (size_t)kv * capacity * D;
        /* scores, block by block of the keys from the first a row sees (a set's rows see the same
         * keys from 0, each up to its own) */
        const int last = seen ? offsets[i0 + 1] - offsets[i0] : start + i1;
        const int skip = window && last > window ? last - window : 0;  /* the path's keys before the window */
        const int *slots = seen ? seen + offsets[i0] + skip : NULL;
        for (int j = 0; j < last - skip; j += LANES) {
            const int count = last - skip - j < LANES ? last - skip - j : LANES;
            for (int i = i0; i < i1; i++) {
                const int keys = last - skip - (i1 - 1 - i);  /* each row up to its own */
                if (keys > j)
                    block_scores(heads, q + ((size_t)i * H + h0) * D, kh, slots ? slots + j : NULL, skip + j,
                                 keys - j < count ? keys - j : count, D, scale, scores + ((size_t)i * H + h0) * most + j,
                                 most);
            }
        }
        /* the softmax, and the weighted sums of values of up to WEIGHTED rows' heads at a time */
        for (int i = i0; i < i1;) {
            Weighted w[WEIGHTED];
            float total[WEIGHTED];
            int sums = 0;
            for (; i < i1 && sums + heads <= WEIGHTED; i++)
                for (int h = 0; h < heads; h++, sums++) {
                    const int keys = last - skip - (i1 - 1 - i);
                    float *p = scores + ((size_t)i * H + h0 + h) * most;
                    total[sums] = softmax_numerators(p, keys);
                    w[sums] = (Weighted){p, out + ((size_t)i * H + h0 + h) * D, keys};
                }
            weighted_sum(sums, w, vh + (size_t)(slots ? 0 : skip) * D, slots, D);
            for (int s = 0; s < sums; s++)
                for (int d = 0; d < D; d++) w[s].o[d] /= total[s];
        }
    }
    free(q);
    free(scores);
    return 0;
}

/* ------------------------------------------------------------------ whole layers in one call */

/* int8dot.c and f32dot.c, compiled into the same shared object. */
int linear_a8(int bits, const float *x, int M, int K, int N, int G, const uint8_t *wq, const float *wd,
              const float *wm, const int8_t *ws, const int8_t *grid, int super_shift, float *y, int threads);
void linear_f32(const float *x, int M, int K, int N, const float *w, float *y, int threads);

typedef struct {
    int bits, group;
    const uint8_t *codes;
    const float *d, *m;
    const int8_t *sub, *grid;
    int super_shift;
} QuantWeight;
typedef struct {
    const float *attention_norm, *ffn_norm;
    QuantWeight wqkv, wo, w13, w2;
    /* NULL where the architecture has none: a q/k/v bias (Qwen2), per-head q/k norms (Qwen3, Gemma 3),
     * norms of the attention and feed-forward outputs (Gemma 3) */
    const float *qkv_bias, *q_norm, *k_norm, *post_attention_norm, *post_ffn_norm;
    int window;  /* 0, or a sliding layer's window */
    int local_rope;  /* whether the layer rotates by the local rope tables (Gemma 3's sliding layers) */
} Layer;

/* bits 2, 4, 6 or 8: int8dot's codes and scales; bits 32: f32dot's float panels in `codes`. */
static int linear(const QuantWeight *w, const float *x, int M, int K, int N, float *y, int threads) {
    if (w->bits == 32) {
        linear_f32(x, M, K, N, (const float *)w->codes, y, threads);
        return 0;
    }
    return linear_a8(w->bits, x, M, K, N, w->group, w->codes, w->d, w->m, w->sub, w->grid, w->super_shift, y, threads);
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
        gated(gate_up, n, inter, act, gated_out, threads);
        failed |= linear(&w->w2, gated_out, n, inter, hidden, o, threads);
        if (w->post_ffn_norm) rms_norm(o, n, hidden, w->post_ffn_norm, eps, o);
        add_into(x, o, (size_t)n * hidden);
    }
    free(h);
    return failed ? -1 : 0;
}
