/* Integer-weight linear layers with int8 activations, for x86 CPUs with AVX2, AVX-VNNI, AVX-512
 * or AVX-512 VNNI (see kernels/int8dot.py for why this is hand-written: no library op on x86
 * multiplies int8 activations by grouped 4-bit weights, and torch's packed int4/int8 CPU ops
 * dequantize to float, so their cost grows with every verify row).
 *
 * y[r, n] = sum_k x[r, k] * w[n, k] for rows r < M, outputs n < N, inputs k < K, where
 *   - x is float32, quantized here per row and per block of 32 values to int8: x ~ d_a[b] * q_a
 *     (d_a = max|x| / 127), the scheme of llama.cpp's Q8_0;
 *   - w is stored per group g of G inputs (G 16 or a multiple of 32) as
 *       2-bit: w = d_w[g] * u + m_w[g], u in [0, 3] (GGUF's Q2_K and TQ2_0 at their own 2 bits);
 *       3-bit: w = d_w[g] * u + m_w[g], u in [0, 7] (GGUF's Q3_K);
 *       4-bit: w = d_w[g] * u + m_w[g], u in [0, 15];
 *       6-bit: w = d_w[g] * c (+ m_w[g] when offsets are given), c in [-32, 31] (GGUF's Q6_K and
 *              5-bit formats, at 6.25 bits a weight instead of a byte);
 *       8-bit: w = d_w[g] * c (+ m_w[g] when offsets are given), c in [-128, 127];
 *     in panels of P outputs, one per 32-bit lane of a vector (the layout of llama.cpp's repacked
 *     Q4_0 8x8 kernels): per block of 32 inputs, 4-bit codes take 4 chunks of 4P bytes, chunk j
 *     holding for each output o (bytes 4o..4o+3) inputs 8j..8j+3 in the low nibbles and 8j+4..8j+7
 *     in the high ones; 2-bit codes take 2 chunks, chunk v holding for each output o (bytes
 *     4o..4o+3) inputs 16v + 4c..16v + 4c + 3 in bits 2c, 2c + 1 (c < 4); 3-bit codes take 3, their
 *     low 2 bits as 2-bit codes in chunks 0-1, then chunk 2 holding the top bit of input 4i + t of
 *     output o in bit i of byte 4o + t (i < 8); 8-bit codes take 8
 *     chunks, chunk j holding inputs 4j..4j+3 of each output;
 *     6-bit codes take 6: the low 4 bits of c + 32 as 4-bit codes in chunks 0-3, then its top 2
 *     bits in chunks 4 and 5, byte 4o + t of chunk 4 + k holding those of inputs 16k + 4i + t in
 *     bits 2i, 2i + 1 (i < 4). A block's bytes are always 4P times its bits.
 *     Or grid codes (GGUF's IQ4_NL, IQ4_XS; IQ2's six values at 3 bits): 4- or 3-bit codes laid out
 *     as above that index `grid`, 16 int8 values, w = d_w[g] * grid[u] (no offsets): looked up in
 *     registers (vpshufb), so the weight costs its code bits and not a byte.
 *     Scales and offsets are [panel][group][P]. N is padded to a multiple of P with zeros.
 *     Or two-level: float32 [panel][supers][P] per super-block and int8 sub-scales [panel][group][P]
 *     (with offsets, then sub-offsets [panel][group][P] after each panel's sub-scales), the group's
 *     d_w or m_w being its super-block's value times its sub-scale. Group g's super-block is
 *     (g * G) >> super_shift: 8 for GGUF's K-quants (super-blocks of 256 inputs, G 16 or 32; the
 *     float32 product equals the one-level value a loader would compute, so the two forms give the
 *     same bits with fewer bytes), 31 for one super-block per row (specq's own requantized 4-bit
 *     weights, whatever K is).
 *     P is 8 (AVX2's vectors) or, where a variant has the 512-bit code for the weight's bits
 *     (`a8_panel_width`), 16: the weights are laid out for the variant that runs them.
 * Four activation bytes broadcast to every lane meet four inputs of each of the P outputs in one
 * vpmaddubsw (one vpdpbusd with VNNI): a panel needs no horizontal sums. 2- and 3-bit codes unpack
 * into the same eight vectors of a block as 4-bit ones (a shift and a mask each, and for 3 bits a
 * shift, mask and or for the top bit) and share their code. AVX2's 16 registers keep
 * a block's unpacked weights for tiles of 4 rows, AVX-512's 32 for tiles of 8 (`wide_panel`).
 * 6-bit codes enter as unsigned c + 32, 8-bit and grid ones on AVX-512 VNNI as c + 128; the dot product
 * starts from -32 (or -128) times the sum of the activation codes it meets, so it is sum(c * q).
 * Each block's integer dot product is exact; it is scaled by d_w * d_a into the output's float
 * lane (groups of 16: each half of the block by its own d_w), and the m_w term uses the group's sum
 * of the quantized x.
 *
 * Every row is computed by the same sequence of operations whatever M is and wherever the row
 * sits in the batch, so a verify row equals the same position computed as a one-row step bit for
 * bit (speculative decoding is lossless only if it does). Compile with -ffp-contract=off so the
 * compiler cannot fuse differently in differently inlined copies. The integer block dot products
 * are exact however they are computed, and every variant applies the same float operations to
 * them in the same order, so all variants give the same bits.
 */
#include "panel.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32
#define HALF_BLOCK 16  /* groups of 16: each half of a block has its own weight scale */
#define ROW_TILE 4  /* rows sharing a panel's unpacked weights */
/* wide_panel's loops over a block's chunks and halves: constant bounds at every call, fully
 * unrolled so that the unpacked weights stay in registers (not an array in memory indexed at run
 * time). */
#define FULLY _Pragma("GCC unroll 8")
/* Keeps a running integer sum a chain in program order: GCC would otherwise reassociate a block's
 * sums into a tree over all of its products, which holds more of them live than AVX2's 16
 * registers and spills each to the stack and back (about 20% of a multi-row pass on AVX2). The sums
 * are exact integers, so no order changes a bit. */
#define KEEP_CHAIN(v) __asm__("" : "+v"(v))

/* acc + u [unsigned bytes] times s [signed bytes], four products per 32-bit lane. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD256 _mm256_dpbusd_epi32
#elif defined(__AVXVNNI__)
#define DPBUSD256 _mm256_dpbusd_avx_epi32
#endif
/* AVX-512: 2-, 3- and 4-bit codes in panels of 16; 6- and 8-bit codes too with VNNI (as unsigned c + 32 or
 * c + 128, corrected per block: without VNNI, no 512-bit vpsignb for chunk_dots' 8-bit trick, and
 * 6-bit products may sum past 16 bits, so they keep AVX2's code). */
#define WIDE_PANEL 16
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define WIDE_TILE 8  /* rows sharing a panel's unpacked weights */
#define WIDE_UNROLL _Pragma("GCC unroll 8")
#define PREFETCH_AHEAD 2048  /* bytes of codes ahead of the block being multiplied */
#if defined(__AVX512VNNI__)
#define WIDE_BITS8 1
#endif
#endif
/* Grid codes enter the 512-bit VNNI code as unsigned value + 128 (as 8-bit codes do); elsewhere
 * they stay signed. */
#if defined(WIDE_BITS8)
#define GRID_BIAS 128
#else
#define GRID_BIAS 0
#endif

/* Whether `bits`-bit weights run on this variant's 512-bit code. */
static int wide(int bits) {
#if defined(WIDE_BITS8)
    return bits == 2 || bits == 3 || bits == 4 || bits == 6 || bits == 8;
#elif defined(WIDE_TILE)
    return bits == 2 || bits == 3 || bits == 4;
#else
    (void)bits;
    return 0;
#endif
}

/* Outputs per panel of `bits`-bit weights on this variant: the layout int8dot.py packs them in. */
int a8_panel_width(int bits) { return wide(bits) ? WIDE_PANEL : PANEL; }

/* The sum of eight 32-bit lanes. */
static inline int32_t lane_sum(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1)));
}

/* One block of 32 floats x -> 32 int8 codes q, with the block's scale returned and the sums of its
 * two halves' codes in t[0], t[1]. x ~ scale * q, scale = max|x| / 127, q = round(x * 127 / max|x|)
 * to nearest even (vcvtps2dq in the default rounding mode, as nearbyintf), the same in every
 * variant: the maximum is exact in any order. */
static inline float quantize_block(const float *x, int8_t *q, int32_t *t) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i c[4];
    for (int i = 0; i < 4; i++) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    t[0] = lane_sum(_mm256_add_epi32(c[0], c[1]));
    t[1] = lane_sum(_mm256_add_epi32(c[2], c[3]));
    /* the packs interleave 4-value pieces across the two 128-bit lanes; the permutation undoes it */
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return amax / 127.0f;
}

/* x [M, K] -> q [K/32, M, 32] int8 (block-major: the rows of a tile sit at fixed offsets from one
 * pointer, which keeps the kernels' loops from running out of general registers), d [K/32, M]
 * (block scales), t [M, K/16] (the sums of each 16 codes), and when s != NULL s [K/G, M]: the sum
 * of the quantized values over each group, sum(d * q), for the offset term. Using the quantized
 * sum (not the exact one) makes the result exactly sum(w * d * q): the offset m = -8 * scale then
 * cancels the rounding it would otherwise amplify (llama.cpp's Q8_1 does the same). When z !=
 * NULL, z [K/span, M] for spans of 16 (G 16) or 32 inputs: -bias times the sum of the span's codes,
 * what the product of unsigned weight codes c + bias by q overcounts. */
static void quantize_rows(const float *x, int M, int K, int G, int8_t *q, float *d, int32_t *t, float *s,
                          int32_t *z, int bias) {
    const int blocks = K / QBLOCK, halves = K / HALF_BLOCK, span = G < QBLOCK ? G : QBLOCK;
    for (int r = 0; r < M; r++) {
        int32_t *tr = t + (size_t)r * halves;
        for (int b = 0; b < blocks; b++)
            d[(size_t)b * M + r] = quantize_block(x + (size_t)r * K + b * QBLOCK, q + ((size_t)b * M + r) * QBLOCK,
                                                  tr + 2 * b);
        if (s) {  /* a group's spans, each under one block scale, in order */
            for (int g = 0; g < K / G; g++) {
                float sum = 0.0f;
                for (int start = g * G; start < (g + 1) * G; start += span) {
                    int total = span == HALF_BLOCK ? tr[start / HALF_BLOCK] : tr[start / HALF_BLOCK] + tr[start / HALF_BLOCK + 1];
                    sum += d[(size_t)(start / QBLOCK) * M + r] * (float)total;
                }
                s[(size_t)g * M + r] = sum;
            }
        }
        if (z) {
            for (int i = 0; i < K / span; i++)
                z[(size_t)i * M + r] = -bias * (span == HALF_BLOCK ? tr[i] : tr[2 * i] + tr[2 * i + 1]);
        }
    }
}

/* Four consecutive int8 activations broadcast to all eight 32-bit lanes. */
static inline __m256i broadcast4(const int8_t *a) {
    int32_t v;
    memcpy(&v, a, sizeof v);
    return _mm256_set1_epi32(v);
}

/* Group g's weight scales (or offsets) for a panel's 8 lanes: w's float32 values, or with int8
 * sub-scales `sub`, w's super-block values times them (G: the group size; `shift`: super_shift). */
static inline __m256 group_terms(const float *w, const int8_t *sub, int g, int G, int shift) {
    if (!sub) return _mm256_loadu_ps(w + (size_t)g * PANEL);
    __m256 s = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sub + (size_t)g * PANEL))));
    return _mm256_mul_ps(_mm256_loadu_ps(w + (((size_t)g * G) >> shift) * PANEL), s);
}

/* Bits 2s and 2s + 1 of each byte of h (s < 4, a constant at every call) moved to bits 4 and 5: a
 * 6-bit code's top two bits (the 16-bit shifts carry bits across bytes, the mask drops them). */
static inline __m256i top_bits(__m256i h, int s) {
    const __m256i mask = _mm256_set1_epi8(0x30);
    return _mm256_and_si256(s == 0 ? _mm256_slli_epi16(h, 4) : s == 1 ? _mm256_slli_epi16(h, 2)
                            : s == 2 ? h : _mm256_srli_epi16(h, 2), mask);
}

/* Low-nibble chunk j (< 4) of a 6-bit block `wb` with its top bits: the unsigned codes c + 32 of
 * inputs 8j..8j+3 (u[0]) and 8j+4..8j+7 (u[1]) of each output. */
static inline void six_bit_codes(const uint8_t *wb, int j, __m256i *u) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
    __m256i h = _mm256_loadu_si256((const __m256i *)(wb + 32 * (4 + j / 2)));
    u[0] = _mm256_or_si256(_mm256_and_si256(w, low), top_bits(h, 2 * (j % 2)));
    u[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), low), top_bits(h, 2 * (j % 2) + 1));
}

/* Bit i (< 8) of each byte of h moved to bit 2: the top bit of a 3-bit code of dword i (the 16-bit
 * shifts carry bits across bytes, a mask of bit 2 drops them: at most 5 places right, they land at
 * bit 3 or above). */
static inline __m256i third_bit(__m256i h, int i) {
    const __m256i bit = _mm256_set1_epi8(0x04);
    return _mm256_and_si256(i < 2 ? _mm256_slli_epi16(h, 2 - i) : _mm256_srli_epi16(h, i - 2), bit);
}

/* Chunk v of 2- or 3-bit codes `wb` as four vectors of unsigned codes: u[c] those of inputs 16v +
 * 4c..16v + 4c + 3 of each output (the 16-bit shifts carry bits across bytes, the mask drops them);
 * 3-bit codes take their top bits from chunk 2. */
static inline void crumb_codes(int bits, const uint8_t *wb, int v, __m256i *u) {
    const __m256i mask = _mm256_set1_epi8(0x03), w = _mm256_loadu_si256((const __m256i *)(wb + 32 * v));
    u[0] = _mm256_and_si256(w, mask);
    u[1] = _mm256_and_si256(_mm256_srli_epi16(w, 2), mask);
    u[2] = _mm256_and_si256(_mm256_srli_epi16(w, 4), mask);
    u[3] = _mm256_and_si256(_mm256_srli_epi16(w, 6), mask);
    if (bits == 3) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(wb + 64));
        for (int c = 0; c < 4; c++) u[c] = _mm256_or_si256(u[c], third_bit(h, 4 * v + c));
    }
}

/* Chunk v of 3-bit grid codes `wb` (crumb_codes' layout): the signed grid values of its four
 * vectors of codes (v[c]) and their magnitudes u[c], as grid_values gives them. */
static inline void grid_crumb_values(const uint8_t *wb, int v, __m256i table, __m256i *g, __m256i *u) {
    crumb_codes(3, wb, v, u);
    for (int c = 0; c < 4; c++) {
        g[c] = _mm256_shuffle_epi8(table, u[c]);
        u[c] = _mm256_sign_epi8(g[c], g[c]);
    }
}

/* Chunk j of grid codes `wb`: the signed grid values of its low (v[0]) and high (v[1]) nibbles (16
 * values in each 128-bit lane of `table`) and their magnitudes u, which enter the products as
 * unsigned bytes with the values' signs moved onto the activations. */
static inline void grid_values(const uint8_t *wb, int j, __m256i table, __m256i *v, __m256i *u) {
    const __m256i low = _mm256_set1_epi8(0x0F), w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
    v[0] = _mm256_shuffle_epi8(table, _mm256_and_si256(w, low));
    v[1] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), low));
    u[0] = _mm256_sign_epi8(v[0], v[0]);
    u[1] = _mm256_sign_epi8(v[1], v[1]);
}

/* The exact integer dot products of `rows` rows with chunks [j0, j1) of one block's codes `wb`
 * (activations `qb`, rows QBLOCK apart), added to dots[r] as eight 32-bit lanes; for 2- and 3-bit
 * codes chunk j holds inputs 16j..16j + 15 (crumb_codes); for 6-bit codes
 * the chunks are those of the low nibbles, each with its top bits; with `lookup`, 4-bit codes are
 * indices into the signed grid `table` and its values enter as 8-bit codes do.
 * vpmaddubsw and vpdpbusd multiply unsigned by signed bytes: 4-bit codes are unsigned already, and
 * a block's eight products of 4-bit (or 2- or 3-bit) codes sum in 16 bits without overflow (8 * 2 * 15 *
 * 127 < 32768); 6-bit codes go in as c + 32, two products in 16 bits (2 * 2 * 63 * 127 < 32768), the
 * caller's dots[r] starting from -32 times the activations' sum; 8-bit codes go in as |w| with w's
 * sign moved onto the activations, widened to 32 bits at every step (vpdpbusd sums in 32 bits
 * directly). */
static inline __attribute__((always_inline)) void chunk_dots(
        int bits, int lookup, int rows, int j0, int j1, const uint8_t *wb, const int8_t *qb, __m256i table,
        __m256i *dots) {
    const __m256i low = _mm256_set1_epi8(0x0F);
#if defined(DPBUSD256)
    for (int j = j0; j < j1; j++) {
        if (lookup && bits == 3) {
            __m256i g[4], u[4];
            grid_crumb_values(wb, j, table, g, u);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 16 * j;
                for (int c = 0; c < 4; c++)
                    dots[r] = DPBUSD256(dots[r], u[c], _mm256_sign_epi8(broadcast4(a + 4 * c), g[c]));
            }
            continue;
        }
        if (lookup) {
            __m256i v[2], u[2];
            grid_values(wb, j, table, v, u);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 8 * j;
                __m256i x0 = _mm256_sign_epi8(broadcast4(a), v[0]), x1 = _mm256_sign_epi8(broadcast4(a + 4), v[1]);
                dots[r] = DPBUSD256(DPBUSD256(dots[r], u[0], x0), u[1], x1);
            }
            continue;
        }
        if (bits == 6) {
            __m256i u[2];
            six_bit_codes(wb, j, u);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 8 * j;
                dots[r] = DPBUSD256(DPBUSD256(dots[r], u[0], broadcast4(a)), u[1], broadcast4(a + 4));
            }
            continue;
        }
        if (bits == 2 || bits == 3) {
            __m256i u[4];
            crumb_codes(bits, wb, j, u);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 16 * j;
                dots[r] = DPBUSD256(DPBUSD256(dots[r], u[0], broadcast4(a)), u[1], broadcast4(a + 4));
                dots[r] = DPBUSD256(DPBUSD256(dots[r], u[2], broadcast4(a + 8)), u[3], broadcast4(a + 12));
            }
            continue;
        }
        __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
        if (bits == 4) {
            __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 8 * j;
                dots[r] = DPBUSD256(DPBUSD256(dots[r], lo, broadcast4(a)), hi, broadcast4(a + 4));
            }
        } else {
            __m256i u = _mm256_sign_epi8(w, w);
            UNROLL
            for (int r = 0; r < rows; r++)
                dots[r] = DPBUSD256(dots[r], u, _mm256_sign_epi8(broadcast4(qb + r * QBLOCK + 4 * j), w));
        }
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (lookup && bits == 3) {  /* as below, four vectors of codes a chunk */
        for (int j = j0; j < j1; j++) {
            __m256i g[4], u[4];
            grid_crumb_values(wb, j, table, g, u);
            UNROLL
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < 4; c++) {
                    __m256i x = _mm256_sign_epi8(broadcast4(qb + r * QBLOCK + 16 * j + 4 * c), g[c]);
                    dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], x), ones));
                    KEEP_CHAIN(dots[r]);
                }
        }
    } else if (lookup) {  /* as 8-bit codes: each pair of products widened at once (two pairs may pass 16 bits) */
        for (int j = j0; j < j1; j++) {
            __m256i v[2], u[2];
            grid_values(wb, j, table, v, u);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 8 * j;
                __m256i p0 = _mm256_maddubs_epi16(u[0], _mm256_sign_epi8(broadcast4(a), v[0]));
                __m256i p1 = _mm256_maddubs_epi16(u[1], _mm256_sign_epi8(broadcast4(a + 4), v[1]));
                __m256i pairs = _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones));
                dots[r] = _mm256_add_epi32(dots[r], pairs);
                KEEP_CHAIN(dots[r]);
            }
        }
    } else if (bits <= 4) {
        __m256i sums[ROW_TILE];
        UNROLL
        for (int r = 0; r < rows; r++) sums[r] = _mm256_setzero_si256();
        for (int j = j0; j < j1; j++) {
            __m256i u[4];  /* 4-bit: chunk j's low and high nibbles; 2- and 3-bit: its four codes */
            if (bits < 4) {
                crumb_codes(bits, wb, j, u);
            } else {
                __m256i packed = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
                u[0] = _mm256_and_si256(packed, low);
                u[1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            }
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + (bits < 4 ? 16 : 8) * j;
                for (int c = 0; c < (bits < 4 ? 4 : 2); c++)
                    sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(u[c], broadcast4(a + 4 * c)));
                KEEP_CHAIN(sums[r]);
            }
        }
        UNROLL
        for (int r = 0; r < rows; r++) dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(sums[r], ones));
    } else if (bits == 6) {
        for (int j = j0; j < j1; j++) {
            __m256i u[2];
            six_bit_codes(wb, j, u);
            UNROLL
            for (int r = 0; r < rows; r++) {
                const int8_t *a = qb + r * QBLOCK + 8 * j;
                __m256i pair = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], broadcast4(a)),
                                                _mm256_maddubs_epi16(u[1], broadcast4(a + 4)));
                dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(pair, ones));
                KEEP_CHAIN(dots[r]);
            }
        }
    } else {
        for (int j = j0; j < j1; j++) {
            __m256i w = _mm256_loadu_si256((const __m256i *)(wb + 32 * j));
            __m256i u = _mm256_sign_epi8(w, w);  /* |w| as unsigned bytes (-128 becomes 128) */
            UNROLL
            for (int r = 0; r < rows; r++) {
                __m256i a = _mm256_sign_epi8(broadcast4(qb + r * QBLOCK + 4 * j), w);
                dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones));
                KEEP_CHAIN(dots[r]);
            }
        }
    }
#endif
}

/* The 8 outputs of one panel for `rows` (<= ROW_TILE, a constant at each call) consecutive rows.
 * `bits` (2, 3, 4, 6 or 8), `lookup` (3- or 4-bit codes indexing `grid`) and `half` (1: groups of 16, two per
 * block of 32; 0: groups of whole blocks) are constants at every call, so each form compiles to its
 * own straight-line code. The sequence of operations on one (row, output) lane is the same in every
 * tile. `wm` NULL: no offsets; `z`: the 6-bit codes' correction (quantize_rows). */
static inline __attribute__((always_inline)) void panel(
        int bits, int lookup, int half, int rows, int M, int K, int G, const uint8_t *wq, const float *wd,
        const float *wm, const int8_t *ws, const int8_t *grid, int shift, const int8_t *q, const float *d,
        const float *s, const int32_t *z, float *y, int N, int valid) {
    const __m256i table = lookup ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)grid))
                                 : _mm256_setzero_si256();
    const int blocks = K / QBLOCK, groups = K / G, chunks = bits == 8 ? 8 : bits < 4 ? 2 : 4, parts = half ? 2 : 1;
    const int per_group = half ? 1 : G / QBLOCK;  /* blocks per group of whole blocks */
    const size_t block_bytes = (size_t)bits * 4 * PANEL;
    __m256 acc[ROW_TILE];
    UNROLL
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0, group = 0, left = per_group; b < blocks; b++) {
        for (int h = 0; h < parts; h++) {  /* the block, or each of its halves */
            __m256i dots[ROW_TILE];
            UNROLL
            for (int r = 0; r < rows; r++)
                dots[r] = bits == 6 ? _mm256_set1_epi32(z[(size_t)(parts * b + h) * M + r]) : _mm256_setzero_si256();
            chunk_dots(bits, lookup, rows, h * chunks / parts, (h + 1) * chunks / parts,
                       wq + (size_t)b * block_bytes, q + (size_t)b * M * QBLOCK, table, dots);
            __m256 wscale = group_terms(wd, ws, half ? 2 * b + h : group, G, shift);
            UNROLL
            for (int r = 0; r < rows; r++) {
                __m256 scale = _mm256_mul_ps(wscale, _mm256_set1_ps(d[(size_t)b * M + r]));
                acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dots[r]), acc[r]);
            }
        }
        if (--left == 0) { group++; left = per_group; }
    }
    if (wm) {  /* the offsets, m_w times the group sums of the quantized x: group by group for all rows (each
                * group's offsets computed once), one fused multiply-add per group and row */
        __m256 m[ROW_TILE];
        UNROLL
        for (int r = 0; r < rows; r++) m[r] = _mm256_setzero_ps();
        for (int g = 0; g < groups; g++) {
            __m256 offsets = group_terms(wm, ws ? ws + (size_t)groups * PANEL : NULL, g, G, shift);
            UNROLL
            for (int r = 0; r < rows; r++) m[r] = _mm256_fmadd_ps(offsets, _mm256_set1_ps(s[(size_t)g * M + r]), m[r]);
        }
        UNROLL
        for (int r = 0; r < rows; r++) acc[r] = _mm256_add_ps(acc[r], m[r]);
    }
    UNROLL
    for (int r = 0; r < rows; r++) store_panel(y + (size_t)r * N, acc[r], valid);
}

#if defined(WIDE_TILE)
/* Four int8 activations broadcast to all sixteen 32-bit lanes. */
typedef int32_t __attribute__((may_alias, aligned(1))) dword;
static inline __m512i broadcast_dword(const int8_t *a) { return _mm512_set1_epi32(*(const dword *)a); }

/* group_terms for a panel of 16 lanes. */
static inline __m512 wide_group_terms(const float *w, const int8_t *sub, int g, int G, int shift) {
    if (!sub) return _mm512_loadu_ps(w + (size_t)g * WIDE_PANEL);
    __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sub + (size_t)g * WIDE_PANEL))));
    return _mm512_mul_ps(_mm512_loadu_ps(w + (((size_t)g * G) >> shift) * WIDE_PANEL), s);
}

/* dots[r] += the exact integer dot products, per 32-bit lane, of unpacked chunks w[i0..i1) with
 * dword i of row r's activations `a` (rows QBLOCK apart) for `rows` rows, chunk by chunk so that
 * the rows' additions overlap. Without VNNI only 2-, 3- and 4-bit codes come here: they sum in 16 bits first,
 * as in chunk_dots; or with `signed_codes` grid values, as magnitudes with their signs moved onto
 * the activations (no 512-bit vpsignb: a masked subtraction), each pair of products widened at once. */
static inline __attribute__((always_inline)) void tile_dots(
        const __m512i *w, int i0, int i1, int rows, const int8_t *a, int signed_codes, __m512i *dots) {
#if defined(__AVX512VNNI__)
    (void)signed_codes;  /* grid values come biased, as 8-bit codes do */
    /* vpdpbusd with its embedded broadcast ({1to16}) reads the row's four bytes itself: GCC turns
     * the intrinsic with a set1 of memory into a separate vpbroadcastd, one more instruction per
     * product, and at eight rows the products are what a pass waits on. */
    FULLY
    for (int i = i0; i < i1; i++) {
        WIDE_UNROLL
        for (int r = 0; r < rows; r++)
            __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(dots[r]) : "v"(w[i]), "m"(*(const dword *)(a + r * QBLOCK + 4 * i)));
    }
#else
    const __m512i ones = _mm512_set1_epi16(1);
    if (signed_codes) {
        FULLY
        for (int i = i0; i < i1; i++) {
            const __m512i u = _mm512_abs_epi8(w[i]);
            const __mmask64 negative = _mm512_movepi8_mask(w[i]);
            WIDE_UNROLL
            for (int r = 0; r < rows; r++) {
                const __m512i x = broadcast_dword(a + r * QBLOCK + 4 * i);
                const __m512i signed_x = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
                dots[r] = _mm512_add_epi32(dots[r], _mm512_madd_epi16(_mm512_maddubs_epi16(u, signed_x), ones));
                KEEP_CHAIN(dots[r]);
            }
        }
        return;
    }
    __m512i sums[WIDE_TILE];
    WIDE_UNROLL
    for (int r = 0; r < rows; r++) sums[r] = _mm512_setzero_si512();
    FULLY
    for (int i = i0; i < i1; i++) {
        WIDE_UNROLL
        for (int r = 0; r < rows; r++) {
            sums[r] = _mm512_add_epi16(sums[r], _mm512_maddubs_epi16(w[i], broadcast_dword(a + r * QBLOCK + 4 * i)));
            KEEP_CHAIN(sums[r]);
        }
    }
    WIDE_UNROLL
    for (int r = 0; r < rows; r++) dots[r] = _mm512_add_epi32(dots[r], _mm512_madd_epi16(sums[r], ones));
#endif
}

/* top_bits for 512-bit vectors. */
static inline __m512i wide_top_bits(__m512i h, int s) {
    const __m512i mask = _mm512_set1_epi8(0x30);
    return _mm512_and_si512(s == 0 ? _mm512_slli_epi16(h, 4) : s == 1 ? _mm512_slli_epi16(h, 2)
                            : s == 2 ? h : _mm512_srli_epi16(h, 2), mask);
}

/* `panel`'s work for a panel of 16 outputs, one per lane of a 512-bit vector, for `rows` <=
 * WIDE_TILE rows: per block the 8 unpacked chunks stay in registers for every row of the tile. The
 * float operations on each (row, output) lane are `panel`'s, in its order. 8-bit codes enter
 * vpdpbusd as unsigned c + 128 (the top bit flipped), 6-bit ones as c + 32; the dot product starts
 * from z, -128 (or -32) * sum(q) over the block or half, so what it adds up is exactly sum(c * q).
 * Grid codes (`lookup`) are looked up as c + 128 with VNNI and corrected the same way; without it,
 * as signed values (tile_dots). */
static inline __attribute__((always_inline)) void wide_panel(
        int bits, int lookup, int half, int rows, int M, int K, int G, const uint8_t *wq, const float *wd,
        const float *wm, const int8_t *ws, const int8_t *grid, int shift, const int8_t *q, const float *d,
        const float *s, const int32_t *z, float *y, int N, int valid) {
    const int blocks = K / QBLOCK, groups = K / G, parts = half ? 2 : 1;
    const int per_group = half ? 1 : G / QBLOCK;
    const size_t block_bytes = (size_t)bits * 4 * WIDE_PANEL;
    const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    const __m512i values = lookup ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)grid))
                                  : _mm512_setzero_si512();
    const __m512i table = GRID_BIAS ? _mm512_xor_si512(values, flip) : values;  /* value + 128 with VNNI */
    const int biased = bits == 6 || bits == 8 || (lookup && GRID_BIAS);  /* whether the dots start from z */
    __m512 acc[WIDE_TILE];
    WIDE_UNROLL
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int b = 0, group = 0, left = per_group; b < blocks; b++) {
        const __m512i *wb = (const __m512i *)(wq + (size_t)b * block_bytes);
        FULLY  /* the hardware prefetcher alone lags behind the unpacking and the products, one row's too */
        for (size_t at = 0; at < block_bytes; at += 64)
            _mm_prefetch((const char *)wb + PREFETCH_AHEAD + at, _MM_HINT_T0);
        __m512i w[8];  /* dword i of the block's activations meets w[i] */
        if (bits < 4) {
            const __m512i crumb = _mm512_set1_epi8(0x03);
            FULLY
            for (int v = 0; v < 2; v++) {
                __m512i packed = _mm512_loadu_si512(wb + v);
                w[4 * v] = _mm512_and_si512(packed, crumb);
                w[4 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 2), crumb);
                w[4 * v + 2] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), crumb);
                w[4 * v + 3] = _mm512_and_si512(_mm512_srli_epi16(packed, 6), crumb);
            }
            if (bits == 3) {  /* the top bits: bit i of chunk 2's bytes to bit 2 of w[i], as third_bit */
                const __m512i h = _mm512_loadu_si512(wb + 2), bit = _mm512_set1_epi8(0x04);
                FULLY
                for (int i = 0; i < 8; i++)
                    w[i] = _mm512_or_si512(w[i], _mm512_and_si512(i < 2 ? _mm512_slli_epi16(h, 2 - i)
                                                                        : _mm512_srli_epi16(h, i - 2), bit));
            }
            if (lookup) {
                FULLY
                for (int i = 0; i < 8; i++) w[i] = _mm512_shuffle_epi8(table, w[i]);
            }
        } else if (bits == 4) {
            FULLY
            for (int j = 0; j < 4; j++) {
                __m512i packed = _mm512_loadu_si512(wb + j);
                w[2 * j] = _mm512_and_si512(packed, low);
                w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
                if (lookup) {
                    w[2 * j] = _mm512_shuffle_epi8(table, w[2 * j]);
                    w[2 * j + 1] = _mm512_shuffle_epi8(table, w[2 * j + 1]);
                }
            }
        } else if (bits == 6) {
            FULLY
            for (int j = 0; j < 4; j++) {
                __m512i packed = _mm512_loadu_si512(wb + j), top = _mm512_loadu_si512(wb + 4 + j / 2);
                w[2 * j] = _mm512_or_si512(_mm512_and_si512(packed, low), wide_top_bits(top, 2 * (j % 2)));
                w[2 * j + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(packed, 4), low),
                                               wide_top_bits(top, 2 * (j % 2) + 1));
            }
        } else {
            FULLY
            for (int j = 0; j < 8; j++) w[j] = _mm512_xor_si512(_mm512_loadu_si512(wb + j), flip);
        }
        FULLY
        for (int h = 0; h < parts; h++) {
            __m512i dots[WIDE_TILE];
            WIDE_UNROLL
            for (int r = 0; r < rows; r++)
                dots[r] = biased ? _mm512_set1_epi32(z[(size_t)(parts * b + h) * M + r]) : _mm512_setzero_si512();
            tile_dots(w, h * 8 / parts, (h + 1) * 8 / parts, rows, q + (size_t)b * M * QBLOCK, lookup && !GRID_BIAS,
                      dots);
            __m512 wscale = wide_group_terms(wd, ws, half ? 2 * b + h : group, G, shift);
            WIDE_UNROLL
            for (int r = 0; r < rows; r++) {
                __m512 scale = _mm512_mul_ps(wscale, _mm512_set1_ps(d[(size_t)b * M + r]));
                acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dots[r]), acc[r]);
            }
        }
        if (--left == 0) { group++; left = per_group; }
    }
    if (wm) {  /* the offsets as in `panel`: group by group for all rows, one fused multiply-add each */
        __m512 m[WIDE_TILE];
        WIDE_UNROLL
        for (int r = 0; r < rows; r++) m[r] = _mm512_setzero_ps();
        for (int g = 0; g < groups; g++) {
            __m512 offsets = wide_group_terms(wm, ws ? ws + (size_t)groups * WIDE_PANEL : NULL, g, G, shift);
            WIDE_UNROLL
            for (int r = 0; r < rows; r++)
                m[r] = _mm512_fmadd_ps(offsets, _mm512_set1_ps(s[(size_t)g * M + r]), m[r]);
        }
        WIDE_UNROLL
        for (int r = 0; r < rows; r++) acc[r] = _mm512_add_ps(acc[r], m[r]);
    }
    WIDE_UNROLL
    for (int r = 0; r < rows; r++) _mm512_mask_storeu_ps(y + (size_t)r * N, (__mmask16)((1u << valid) - 1), acc[r]);
}
#endif

/* The scratch space for the quantized activations, per call (M * K bytes plus scales and sums). */
typedef struct { int8_t *q; float *d; float *s; int32_t *t, *z; } Acts;

static int acts_alloc(Acts *a, int M, int K, int G) {
    if (M == 0) { a->q = NULL; a->d = a->s = NULL; a->t = a->z = NULL; return 1; }  /* nothing to quantize or multiply */
    a->q = malloc((size_t)M * K);
    a->d = malloc(sizeof(float) * (size_t)M * (K / QBLOCK));
    a->s = malloc(sizeof(float) * (size_t)M * (K / G));
    a->t = malloc(sizeof(int32_t) * (size_t)M * (K / HALF_BLOCK));
    a->z = malloc(sizeof(int32_t) * (size_t)M * (K / HALF_BLOCK));
    return a->q && a->d && a->s && a->t && a->z;
}

static void acts_free(Acts *a) { free(a->q); free(a->d); free(a->s); free(a->t); free(a->z); }

/* How many of the `left` rows the next tile of at most `tile` takes: never a lone row behind a
 * full tile (tile + 1 rows go in two tiles of about half). */
static inline int tile_rows(int left, int tile) {
    return left == tile + 1 ? (tile + 2) / 2 : left > tile ? tile : left;
}

/* Each panel's M rows in tiles, each tile's row count a constant of its own code. */
#define SWEEP(BITS, LOOKUP, HALF)                                                            \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                        \
    for (int p = 0; p < panels; p++) {                                                       \
        int valid = N - p * PANEL < PANEL ? N - p * PANEL : PANEL;                           \
        for (int r = 0, rows; r < M; r += rows) {                                            \
            rows = tile_rows(M - r, ROW_TILE);                                               \
            switch (rows) {                                                                  \
                case 4: PANEL_AT(BITS, LOOKUP, HALF, 4, r, p, valid); break;                 \
                case 3: PANEL_AT(BITS, LOOKUP, HALF, 3, r, p, valid); break;                 \
                case 2: PANEL_AT(BITS, LOOKUP, HALF, 2, r, p, valid); break;                 \
                default: PANEL_AT(BITS, LOOKUP, HALF, 1, r, p, valid);                       \
            }                                                                                \
        }                                                                                    \
    }
#define WIDE_SWEEP(BITS, LOOKUP, HALF)                                                       \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                        \
    for (int p = 0; p < panels; p++) {                                                       \
        int valid = N - p * WIDE_PANEL < WIDE_PANEL ? N - p * WIDE_PANEL : WIDE_PANEL;       \
        for (int r = 0, rows; r < M; r += rows) {                                            \
            rows = tile_rows(M - r, WIDE_TILE);                                              \
            switch (rows) {                                                                  \
                case 8: WIDE_AT(BITS, LOOKUP, HALF, 8, r, p, valid); break;                  \
                case 7: WIDE_AT(BITS, LOOKUP, HALF, 7, r, p, valid); break;                  \
                case 6: WIDE_AT(BITS, LOOKUP, HALF, 6, r, p, valid); break;                  \
                case 5: WIDE_AT(BITS, LOOKUP, HALF, 5, r, p, valid); break;                  \
                case 4: WIDE_AT(BITS, LOOKUP, HALF, 4, r, p, valid); break;                  \
                case 3: WIDE_AT(BITS, LOOKUP, HALF, 3, r, p, valid); break;                  \
                case 2: WIDE_AT(BITS, LOOKUP, HALF, 2, r, p, valid); break;                  \
                default: WIDE_AT(BITS, LOOKUP, HALF, 1, r, p, valid);                        \
            }                                                                                \
        }                                                                                    \
    }

/* Which sweep each form takes (`wide`). */
#if defined(WIDE_BITS8)
#define SWEEP4 WIDE_SWEEP
#define SWEEP8 WIDE_SWEEP
#elif defined(WIDE_TILE)
#define SWEEP4 WIDE_SWEEP
#define SWEEP8 SWEEP
#else
#define SWEEP4 SWEEP
#define SWEEP8 SWEEP
#endif
#define SWEEP6 SWEEP8  /* 6-bit codes: 512-bit code where 8-bit codes have it */
#define SWEEP2 SWEEP4  /* 2- and 3-bit codes: where 4-bit ones go */
#define SWEEP3 SWEEP4

/* y = x w^T for `bits`-bit weights (2, 3, 4, 6 or 8) in groups of G (16 or a multiple of 32) in the panel
 * layout above (panels of a8_panel_width(bits)); `wm`: the offsets (NULL for weights without them:
 * 6- or 8-bit ones, or grid codes); `ws`: the int8 sub-scales of two-level scales (NULL: one-level),
 * whose super-blocks `super_shift` gives; `grid`: the 16 values 4-bit codes index (NULL: the codes
 * are the values).
 * Returns 0 on success, -1 when out of memory. Panels are split across `threads` OpenMP threads. */
int linear_a8(int bits, const float *x, int M, int K, int N, int G, const uint8_t *wq, const float *wd,
              const float *wm, const int8_t *ws, const int8_t *grid, int super_shift, float *y, int threads) {
    Acts a;
    if (!acts_alloc(&a, M, K, G)) { acts_free(&a); return -1; }
    const int lookup = (bits == 3 || bits == 4) && grid;
    /* unsigned codes c + bias: z corrects */
    const int biased = bits == 6 || (bits == 8 && wide(bits)) || (lookup && wide(4) && GRID_BIAS);
    quantize_rows(x, M, K, G, a.q, a.d, a.t, wm ? a.s : NULL, biased ? a.z : NULL, bits == 6 ? 32 : 128);
    const int width = a8_panel_width(bits), panels = (N + width - 1) / width, half = G < QBLOCK;
    const size_t panel_bytes = (size_t)K / QBLOCK * bits * 4 * width;
    const size_t panel_scales = (size_t)(ws ? ((K - 1) >> super_shift) + 1 : K / G) * width;
    const size_t panel_subs = ws ? (size_t)(wm ? 2 : 1) * (K / G) * width : 0;
#define PANEL_AT(BITS, LOOKUP, HALF, ROWS, r, p, valid)                                                      \
    panel(BITS, LOOKUP, HALF, ROWS, M, K, G, wq + (size_t)(p) * panel_bytes, wd + (size_t)(p) * panel_scales, \
          wm ? wm + (size_t)(p) * panel_scales : NULL, ws ? ws + (size_t)(p) * panel_subs : NULL, grid,           \
          super_shift, a.q + (size_t)(r) * QBLOCK, a.d + (r), a.s + (r), a.z + (r), y + (size_t)(r) * N + (size_t)(p) * PANEL, N, \
          valid)
#define WIDE_AT(BITS, LOOKUP, HALF, ROWS, r, p, valid)                                                       \
    wide_panel(BITS, LOOKUP, HALF, ROWS, M, K, G, wq + (size_t)(p) * panel_bytes,                             \
               wd + (size_t)(p) * panel_scales, wm ? wm + (size_t)(p) * panel_scales : NULL,                      \
               ws ? ws + (size_t)(p) * panel_subs : NULL, grid, super_shift, a.q + (size_t)(r) * QBLOCK, a.d + (r), a.s + (r), a.z + (r),                                        \
               y + (size_t)(r) * N + (size_t)(p) * WIDE_PANEL, N, valid)
    if (lookup && bits == 3 && !half) {
        SWEEP3(3, 1, 0)
    } else if (lookup && bits == 3) {
        SWEEP3(3, 1, 1)
    } else if (lookup && !half) {
        SWEEP4(4, 1, 0)
    } else if (lookup) {
        SWEEP4(4, 1, 1)
    } else if (bits == 4 && !half) {
        SWEEP4(4, 0, 0)
    } else if (bits == 4) {
        SWEEP4(4, 0, 1)
    } else if (bits == 2 && !half) {
        SWEEP2(2, 0, 0)
    } else if (bits == 2) {
        SWEEP2(2, 0, 1)
    } else if (bits == 3 && !half) {
        SWEEP3(3, 0, 0)
    } else if (bits == 3) {
        SWEEP3(3, 0, 1)
    } else if (bits == 6 && !half) {
        SWEEP6(6, 0, 0)
    } else if (bits == 6) {
        SWEEP6(6, 0, 1)
    } else if (!half) {
        SWEEP8(8, 0, 0)
    } else {
        SWEEP8(8, 0, 1)
    }
    acts_free(&a);
    return 0;
}
