/* A GGUF tensor's quantized blocks, read straight from the file's bytes into int8dot.c's panel
 * layout (codes, scales d and offsets m per group, w = d * code + m), the same bytes and float32
 * values that int8dot.py's pack_int4 / pack_int8 lay out from weights/gguf_formats.py's numpy
 * decoders. Why C: those decoders and the torch permutes of the packing pass over every weight
 * several times (most of a 1.5B file's load); here each weight is read once and written once, rows
 * split across threads.
 *
 * Each format's decoder turns one block into its codes and per-group d and m exactly as
 * gguf_formats.py does: the fp16 values widened to float32 (exact), one float32 product per scale
 * (d * sub-scale, dmin * sub-min: exact, as gguf computes them too) and one float32 negation or
 * product for an offset. Types are ggml's ids (GGMLQuantizationType).
 *
 * K-quants can also be laid out with two-level scales, as the file holds them (int8dot.c): per
 * super-block the float32 of the fp16 d and of -dmin, per group the sub-scale and sub-min as int8;
 * d * scale is the one-level scale, and -dmin * min equals -(dmin * min) bit for bit (a product's
 * sign is its factors'), so the kernel computes the same weights from fewer bytes. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QBLOCK 32

static inline float f16(const uint8_t *b) {
    uint16_t h;
    memcpy(&h, b, sizeof h);
    return _cvtsh_ss(h);
}

/* One block b -> its codes q (4-bit formats: 0..15, for grid formats indices into their grid; 5-
 * and 6-bit ones: in [-32, 31]; 8-bit: the signed codes) and per-group d and m (m left alone by
 * formats without offsets). */
typedef void (*decode_fn)(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m);

/* 32 values from 16 bytes: the low nibbles first, then the high ones. */
static inline void nibbles32(const uint8_t *qs, int8_t *q) {
    for (int i = 0; i < 16; i++) {
        q[i] = (int8_t)(qs[i] & 0x0F);
        q[i + 16] = (int8_t)(qs[i] >> 4);
    }
}

static void q4_0(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = d * u - 8d */
    d[0] = f16(b);
    m[0] = -8.0f * d[0];
    nibbles32(b + 2, q);
}

static void q4_1(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = d * u + m */
    d[0] = f16(b);
    m[0] = f16(b + 2);
    nibbles32(b + 4, q);
}

/* Q5_0 / Q5_1: the fifth bit of value i is bit i of the 4 little-endian bytes at qh. */
static inline void fifths32(const uint8_t *qh, const uint8_t *qs, int8_t *q, int8_t minus) {
    uint32_t high;
    memcpy(&high, qh, sizeof high);
    nibbles32(qs, q);
    for (int i = 0; i < 32; i++) q[i] = (int8_t)((q[i] | (((high >> i) & 1) << 4)) - minus);
}

static void q5_0(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = d * (q - 16) */
    (void)m;
    d[0] = f16(b);
    fifths32(b + 2, b + 6, q, 16);
}

static void q5_1(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = d * q + m */
    d[0] = f16(b);
    m[0] = f16(b + 2);
    fifths32(b + 4, b + 8, q, 0);
}

static void q8_0(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = d * c */
    (void)m;
    d[0] = f16(b);
    memcpy(q, b + 2, 32);
}

/* A super-block b's two levels (K-quants, and IQ4_XS, built like them): D (d), Mneg (-dmin; -0 for
 * a format without offsets, so that Mneg * 0 is the -0 offset of place_row) and per group the int8
 * sub-scale and sub-min. */
typedef void (*terms_fn)(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min);

/* Q4_K / Q5_K's 12 bytes of 6-bit sub-scales and mins at s (the layout: gguf_formats.py's
 * _k_scales) -> scale[8], min[8]. */
static inline void k_scales6(const uint8_t *s, int8_t *scale, int8_t *min) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scale[j] = (int8_t)(s[j] & 0x3F);
            min[j] = (int8_t)(s[j + 4] & 0x3F);
        } else {
            scale[j] = (int8_t)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
            min[j] = (int8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
        }
    }
}

/* Q3_K's 12 bytes of 6-bit scales at s (the layout: gguf_formats.py's _q3_k_scales), minus 32. */
static inline void q3_k_scales(const uint8_t *s, int8_t *scale) {
    for (int i = 0; i < 16; i++)
        scale[i] = (int8_t)((((s[i % 8] >> (i < 8 ? 0 : 4)) & 0x0F) | (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32);
}

/* IQ4_XS's sub-scales minus 32: low 4 bits of sub-block i in byte 4 + i / 2 (low nibble for even i),
 * top 2 bits at bits 2i of the little-endian uint16 at byte 2. */
static inline void iq4_xs_scales(const uint8_t *b, int8_t *scale) {
    uint16_t high;
    memcpy(&high, b + 2, sizeof high);
    for (int i = 0; i < 8; i++)
        scale[i] = (int8_t)((((b[4 + i / 2] >> (4 * (i % 2))) & 0x0F) | (((high >> (2 * i)) & 3) << 4)) - 32);
}

static void k_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {  /* Q4_K, Q5_K */
    *D = f16(b);
    *Mneg = -f16(b + 2);
    k_scales6(b + 4, scale, min);
}

/* Q2_K: 16 bytes of sub-scales (low nibble) and sub-mins (high), then codes, fp16 d, dmin. */
static void q2_k_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    *D = f16(b + 80);
    *Mneg = -f16(b + 82);
    for (int g = 0; g < 16; g++) {
        scale[g] = (int8_t)(b[g] & 0x0F);
        min[g] = (int8_t)(b[g] >> 4);
    }
}

/* Q3_K's codes q - 4 as q with an offset of -4 scales: -4 d times the sub-scale is -4 times d
 * times it, bit for bit, since every product here is exact. */
static void q3_k_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    *D = f16(b + 108);
    *Mneg = -4.0f * *D;
    q3_k_scales(b + 96, scale);
    memcpy(min, scale, 16);
}

static void q6_k_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    *D = f16(b + 208);
    *Mneg = -0.0f;
    memcpy(scale, b + 192, 16);
    memset(min, 0, 16);
}

static void iq4_xs_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    *D = f16(b);
    *Mneg = -0.0f;
    iq4_xs_scales(b, scale);
    memset(min, 0, 8);
}

/* A two-level format's one-level terms for its `groups` groups: d = D * scale and m = Mneg * min,
 * the bits of gguf's d * scale and -(dmin * min) (a product's sign is its factors'). */
static inline void one_level(terms_fn terms, int groups, const uint8_t *b, float *d, float *m) {
    float D, Mneg;
    int8_t scale[16], min[16];
    terms(b, &D, &Mneg, scale, min);
    for (int g = 0; g < groups; g++) {
        d[g] = D * (float)scale[g];
        m[g] = Mneg * (float)min[g];
    }
}

/* Q2_K / Q3_K's 64 bytes of 2-bit values: per half of 128 values 32 bytes, group 2j + p of the
 * half at bits 2j of bytes 16p..16p + 15. */
static inline void k_two_bits(const uint8_t *qs, int8_t *q) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int i = 0; i < 32; i++) q[128 * h + 32 * j + i] = (int8_t)((qs[32 * h + i] >> (2 * j)) & 3);
}

static void q2_k(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = (d * scale) * u - dmin * min */
    one_level(q2_k_terms, 16, b, d, m);
    k_two_bits(b + 16, q);
}

/* Q3_K: 32 bytes of high bits (bit b of byte 16p + l: value l of group 2b + p), 64 of low 2 bits,
 * 12 of scales, fp16 d; codes q = low + 4 high (gguf_formats.py's _q3_k). */
static void q3_k(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;
    one_level(q3_k_terms, 16, b, d, m);
    k_two_bits(b + 32, q);
    for (int g = 0; g < 16; g++)
        for (int l = 0; l < 16; l++) q[16 * g + l] = (int8_t)(q[16 * g + l] | (((b[16 * (g % 2) + l] >> (g / 2)) & 1) << 2));
}

/* Q4_K / Q5_K's 128 bytes of low nibbles: each 32 bytes hold sub-block 2i low, 2i + 1 high. */
static inline void k_low_nibbles(const uint8_t *qs, int8_t *q) {
    for (int i = 0; i < 4; i++)
        for (int l = 0; l < 32; l++) {
            q[64 * i + l] = (int8_t)(qs[32 * i + l] & 0x0F);
            q[64 * i + 32 + l] = (int8_t)(qs[32 * i + l] >> 4);
        }
}

static void q4_k(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;
    one_level(k_terms, 8, b, d, m);
    k_low_nibbles(b + 16, q);
}

static void q5_k(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* bit j of byte l: value 32j + l's fifth */
    one_level(k_terms, 8, b, d, m);
    k_low_nibbles(b + 48, q);
    const uint8_t *qh = b + 16;
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) q[32 * j + l] = (int8_t)(q[32 * j + l] | (((qh[l] >> j) & 1) << 4));
}

/* Q6_K: per half of 128 values, 64 bytes of low nibbles (values 0-63 low, 64-127 high) and 32 of
 * top bits (value 32s + i in bits 2s, 2s + 1 of byte i); 16 int8 sub-scales, then fp16 d. */
static void q6_k(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        int8_t *out = q + 128 * h;
        for (int l = 0; l < 64; l++) {
            out[l] = (int8_t)(ql[l] & 0x0F);
            out[64 + l] = (int8_t)(ql[l] >> 4);
        }
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 32; i++)
                out[32 * s + i] = (int8_t)((out[32 * s + i] | (((qh[i] >> (2 * s)) & 3) << 4)) - 32);
    }
    one_level(q6_k_terms, 16, b, d, m);
}

/* IQ4_NL / IQ4_XS's code values, a non-linear grid indexed by 4 bits (ggml's kvalues_iq4nl). */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void iq4_nl(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = d * IQ4_VALUES[q] */
    (void)m;
    d[0] = f16(b);
    nibbles32(b + 2, q);
}

static void iq4_xs(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;  /* w = (d * scale) * IQ4_VALUES[q] */
    one_level(iq4_xs_terms, 8, b, d, m);
    for (int i = 0; i < 8; i++) nibbles32(b + 8 + 16 * i, q + 32 * i);
}

/* IQ3_S: fp16 d, 64 bytes of grid indices' low 8 bits, 8 of their ninth bits (index i's in bit i %
 * 8 of byte i / 8), 32 of signs (value k's in bit k % 8 of byte k / 8), 4 of 4-bit scales (sub-block
 * j of 32 values in byte j / 2, low nibble first): w = d * (1 + 2 scale) * v, v = +-grid value, odd
 * in [-15, 15], so v = 2u - 15 for a 4-bit u: scale 2d, offset -15d, both times 1 + 2 scale. The
 * grid (512 entries of 4 values) is gguf's, passed in as `table`. */
static void iq3_s_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    const float d = f16(b);
    *D = 2.0f * d;
    *Mneg = -15.0f * d;
    for (int j = 0; j < 8; j++) scale[j] = min[j] = (int8_t)(1 + 2 * ((b[106 + j / 2] >> (4 * (j % 2))) & 0x0F));
}

static void iq3_s(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    one_level(iq3_s_terms, 8, b, d, m);
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74;
    for (int i = 0; i < 64; i++) {
        const uint8_t *grid = table + 4 * (qs[i] | (((qh[i / 8] >> (i % 8)) & 1) << 8));
        for (int j = 0; j < 4; j++) {
            const int k = 4 * i + j, v = (signs[k / 8] >> (k % 8)) & 1 ? -grid[j] : grid[j];
            q[k] = (int8_t)((v + 15) / 2);
        }
    }
}

/* IQ2 and IQ3_XXS: w = d * unit * v, v = +-(grid value), the unit an odd integer 2s + 1 over 8 (IQ2)
 * or 4 (IQ3_XXS); their 4-bit codes index the signed values (gguf_formats.py's IQ2_VALUES,
 * IQ3_VALUES). `table`: gguf's grid (entries of 8 or 4 values), then for all but IQ2_S the 128
 * bytes of sign patterns (gguf's IQ2_XXS.ksigns) that 7-bit sign indices pick. */
static inline int8_t iq2_index(int v) {  /* -43, -25, -8, 8, 25, 43 -> 0..5 */
    const int a = v < 0 ? -v : v, i = a == 8 ? 0 : a == 25 ? 1 : 2;
    return (int8_t)(v < 0 ? 2 - i : 3 + i);
}

static inline int8_t iq3_index(int v) {  /* -62, -52, .., -4, 4, .., 52, 62 -> 0..15 */
    const int a = v < 0 ? -v : v, i = a == 62 ? 7 : (a - 4) / 8;
    return (int8_t)(v < 0 ? 7 - i : 8 + i);
}

/* Values [0, n) of an entry `grid` with the signs of the pattern byte `signs` (bit j: value j's). */
static inline void signed_values(const uint8_t *grid, uint8_t signs, int n, int *v) {
    for (int j = 0; j < n; j++) v[j] = (signs >> j) & 1 ? -grid[j] : grid[j];
}

static void no_offsets(float *Mneg, int8_t *min, int groups) {
    *Mneg = -0.0f;
    memset(min, 0, (size_t)groups);
}

static void iq2_xxs_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    *D = f16(b) * 0.125f;
    for (int g = 0; g < 8; g++) scale[g] = (int8_t)(1 + 2 * (b[2 + 8 * g + 7] >> 4));  /* top 4 bits of word 2g + 1 */
    no_offsets(Mneg, min, 8);
}

static void iq2_xxs(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    one_level(iq2_xxs_terms, 8, b, d, m);
    for (int g = 0; g < 8; g++) {
        const uint8_t *aux = b + 2 + 8 * g;  /* 4 grid indices, then a word of 4 7-bit sign indices */
        uint32_t signs;
        memcpy(&signs, aux + 4, sizeof signs);
        for (int l = 0; l < 4; l++) {
            int v[8];
            signed_values(table + 8 * aux[l], table[2048 + ((signs >> (7 * l)) & 127)], 8, v);
            for (int j = 0; j < 8; j++) q[32 * g + 8 * l + j] = iq2_index(v[j]);
        }
    }
}

static void iq2_scales16(const uint8_t *s, float *D, float *Mneg, int8_t *scale, int8_t *min, float d) {
    *D = d * 0.125f;
    for (int g = 0; g < 16; g++) scale[g] = (int8_t)(1 + 2 * ((s[g / 2] >> (4 * (g % 2))) & 0x0F));
    no_offsets(Mneg, min, 16);
}

static void iq2_xs_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    iq2_scales16(b + 66, D, Mneg, scale, min, f16(b));
}

static void iq2_xs(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    one_level(iq2_xs_terms, 16, b, d, m);
    for (int i = 0; i < 32; i++) {  /* per 8 values a uint16: 9 bits of grid index, 7 of sign index */
        uint16_t word;
        memcpy(&word, b + 2 + 2 * i, sizeof word);
        int v[8];
        signed_values(table + 8 * (word & 511), table[4096 + (word >> 9)], 8, v);
        for (int j = 0; j < 8; j++) q[8 * i + j] = iq2_index(v[j]);
    }
}

static void iq2_s_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    iq2_scales16(b + 74, D, Mneg, scale, min, f16(b));
}

static void iq2_s(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    one_level(iq2_s_terms, 16, b, d, m);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66;  /* index i's top 2 bits: bits 2 (i % 4) of qh[i / 4] */
    for (int i = 0; i < 32; i++) {
        int v[8];
        signed_values(table + 8 * (qs[i] | (((qh[i / 4] >> (2 * (i % 4))) & 3) << 8)), signs[i], 8, v);
        for (int j = 0; j < 8; j++) q[8 * i + j] = iq2_index(v[j]);
    }
}

static void iq3_xxs_terms(const uint8_t *b, float *D, float *Mneg, int8_t *scale, int8_t *min) {
    *D = f16(b) * 0.25f;
    for (int g = 0; g < 8; g++) scale[g] = (int8_t)(1 + 2 * (b[66 + 4 * g + 3] >> 4));
    no_offsets(Mneg, min, 8);
}

static void iq3_xxs(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    one_level(iq3_xxs_terms, 8, b, d, m);
    for (int g = 0; g < 8; g++) {
        uint32_t signs;
        memcpy(&signs, b + 66 + 4 * g, sizeof signs);
        for (int l = 0; l < 4; l++) {  /* 8 values: two grid entries of 4, one sign pattern */
            const uint8_t pattern = table[1024 + ((signs >> (7 * l)) & 127)];
            int v[8];
            signed_values(table + 4 * b[2 + 8 * g + 2 * l], pattern, 4, v);
            signed_values(table + 4 * b[2 + 8 * g + 2 * l + 1], pattern >> 4, 4, v + 4);
            for (int j = 0; j < 8; j++) q[32 * g + 8 * l + j] = iq3_index(v[j]);
        }
    }
}

/* IQ1_S: fp16 d, 32 bytes of grid indices' low 8 bits, per 32 values a uint16 with their top 3 bits
 * (index l's at bits 3l), k at bits 12-14 and delta's sign at bit 15: w = d (2k + 1) (g + delta),
 * g in {-1, 0, 1} from the grid (2048 entries of 8 int8 values, gguf's, as `table`), delta +-1/8.
 * As 4-bit codes u = g + 1 with the scale d (2k + 1) and the offset d (2k + 1) (delta - 1): exact. */
static void iq1_s(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    const float base = f16(b);
    for (int g = 0; g < 8; g++) {
        uint16_t h;
        memcpy(&h, b + 34 + 2 * g, sizeof h);
        d[g] = base * (float)(2 * ((h >> 12) & 7) + 1);
        m[g] = d[g] * (h & 0x8000 ? -9.0f : -7.0f) * 0.125f;
        for (int l = 0; l < 4; l++) {
            const int8_t *grid = (const int8_t *)table + 8 * (b[2 + 4 * g + l] | (((h >> (3 * l)) & 7) << 8));
            for (int j = 0; j < 8; j++) q[32 * g + 8 * l + j] = (int8_t)(grid[j] + 1);
        }
    }
}

/* TQ2_0: 64 bytes of 2-bit digits (value 128c + 32s + i at bits 2s of byte 32c + i), fp16 d:
 * w = d (u - 1), as 4-bit codes u with the offset -d. */
static void tq2_0(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 32; i++) q[128 * c + 32 * s + i] = (int8_t)((b[32 * c + i] >> (2 * s)) & 3);
    d[0] = f16(b + 64);
    m[0] = -1.0f * d[0];
}

/* TQ1_0: base-3 digits, five per byte of its first 48 and four per byte of the next 4, fp16 d: the
 * digit of multiplier 3^t of a byte x is ((x 3^t mod 256) * 3) >> 8; value order as gguf's (per
 * byte range, multiplier by multiplier): w = d (u - 1), as 4-bit codes u with the offset -d. */
static void tq1_0(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;
    static const uint8_t POW3[5] = {1, 3, 9, 27, 81};
    const int start[3] = {0, 32, 48}, count[3] = {32, 16, 4}, digits[3] = {5, 5, 4};
    int k = 0;
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < digits[r]; t++)
            for (int i = 0; i < count[r]; i++, k++)
                q[k] = (int8_t)(((unsigned)(uint8_t)(b[start[r] + i] * POW3[t]) * 3) >> 8);
    d[0] = f16(b + 52);
    m[0] = -1.0f * d[0];
}

/* MXFP4's code values (e2m1, doubled; gguf_formats.py's MXFP4_VALUES). */
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4: an e8m0 byte e, the scale 2^(e - 128) (ggml's half of 2^(e - 127)), then 16 bytes of
 * 4-bit indices into MXFP4_VALUES, low nibbles first. */
static void mxfp4(const uint8_t *b, const uint8_t *table, int8_t *q, float *d, float *m) {
    (void)table;
    (void)m;
    const uint32_t bits = b[0] < 2 ? 0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;
    memcpy(d, &bits, sizeof bits);
    nibbles32(b + 1, q);
}

typedef struct {
    int block, bytes, bits, group, offsets;
    decode_fn decode;
    terms_fn terms;
    const int8_t *grid;
    int table;  /* the bytes it reads from `table` (0: none) */
} Format;

/* The grids of IQ2 and IQ3_XXS codes as 4-bit ones (gguf_formats.py's IQ2_VALUES, IQ3_VALUES). */
static const int8_t IQ2_VALUES[16] = {-43, -25, -8, 8, 25, 43};
static const int8_t IQ3_VALUES[16] = {-62, -52, -44, -36, -28, -20, -12, -4, 4, 12, 20, 28, 36, 44, 52, 62};

/* ggml type id -> its block (weights, bytes), code bits, group, whether it has offsets, decoder,
 * for K-quants (and IQ4_XS, built like them) their two-level terms, and for grid formats the
 * values their codes index. */
static const Format FORMATS[] = {
    [2] = {32, 18, 4, 32, 1, q4_0, NULL},   [3] = {32, 20, 4, 32, 1, q4_1, NULL},
    [6] = {32, 22, 6, 32, 0, q5_0, NULL},   [7] = {32, 24, 6, 32, 1, q5_1, NULL},
    [8] = {32, 34, 8, 32, 0, q8_0, NULL},   [10] = {256, 84, 2, 16, 1, q2_k, q2_k_terms},
    [11] = {256, 110, 3, 16, 1, q3_k, q3_k_terms}, [12] = {256, 144, 4, 32, 1, q4_k, k_terms},
    [13] = {256, 176, 6, 32, 1, q5_k, k_terms}, [14] = {256, 210, 6, 16, 0, q6_k, q6_k_terms},
    [20] = {32, 18, 4, 32, 0, iq4_nl, NULL, IQ4_VALUES},
    [23] = {256, 136, 4, 32, 0, iq4_xs, iq4_xs_terms, IQ4_VALUES},
    [21] = {256, 110, 4, 32, 1, iq3_s, iq3_s_terms, NULL, 512 * 4},
    [16] = {256, 66, 3, 32, 0, iq2_xxs, iq2_xxs_terms, IQ2_VALUES, 256 * 8 + 128},
    [17] = {256, 74, 3, 16, 0, iq2_xs, iq2_xs_terms, IQ2_VALUES, 512 * 8 + 128},
    [22] = {256, 82, 3, 16, 0, iq2_s, iq2_s_terms, IQ2_VALUES, 1024 * 8},
    [18] = {256, 98, 4, 32, 0, iq3_xxs, iq3_xxs_terms, IQ3_VALUES, 256 * 4 + 128},
    [19] = {256, 50, 2, 32, 1, iq1_s, NULL, NULL, 2048 * 8},
    [34] = {256, 54, 2, 256, 1, tq1_0, NULL, NULL, 0},  [35] = {256, 66, 2, 256, 1, tq2_0, NULL, NULL, 0},
    [39] = {32, 17, 4, 32, 0, mxfp4, NULL, MXFP4_VALUES, 0},
};
#define SUPER 256  /* a K-quant super-block's inputs: int8dot.c's two-level scales */
#define N_FORMATS ((int)(sizeof FORMATS / sizeof FORMATS[0]))

/* One row's codes q [K], d and m [K / native group] into output `out` of the panel layout of
 * `width` outputs, `bits`-bit codes (int8dot.c's layouts) and groups of G (dividing the native group); m_out NULL: no
 * offsets; `offsets` 0: the format has none, so its rows get -0 (d * c + -0 is d * c, even a
 * zero's sign). */
static void place_row(const int8_t *q, const float *dn, const float *mn, int K, int native, int offsets, int bits,
                      int G, int width, long out, uint8_t *codes, float *d_out, float *m_out) {
    /* codes, then the one-level d and m */
    const long p = out / width, lane = out % width, groups = K / G, repeat = native / G;
    if (bits == 2 || bits == 3) {  /* input 32b + 16v + 4c + t -> block b, chunk v, byte 4 lane + t, bits
                                    * 2c; 3-bit codes' top bit of input 32b + 4i + t -> chunk 2, bit i */
        uint8_t *base = codes + p * ((long)K * width * bits / 8) + 4 * lane;
        for (int b = 0; b < K / QBLOCK; b++) {
            const int8_t *c = q + QBLOCK * b;
            uint8_t *dst = base + (long)bits * b * 4 * width;
            for (int v = 0; v < 2; v++)
                for (int t = 0; t < 4; t++) {
                    const int8_t *e = c + 16 * v + t;
                    dst[(long)v * 4 * width + t] =
                        (uint8_t)((e[0] & 3) | (e[4] & 3) << 2 | (e[8] & 3) << 4 | (e[12] & 3) << 6);
                }
            if (bits == 3)
                for (int t = 0; t < 4; t++) {
                    uint8_t top = 0;
                    for (int i = 0; i < 8; i++) top |= (uint8_t)(((c[4 * i + t] >> 2) & 1) << i);
                    dst[(long)2 * 4 * width + t] = top;
                }
        }
    } else if (bits == 4) {  /* input 32b + 8j + 4h + t -> block b, chunk j, byte 4 lane + t, nibble h */
        uint8_t *base = codes + p * ((long)K * width / 2) + 4 * lane;
        for (int b = 0; b < K / QBLOCK; b++)
            for (int j = 0; j < 4; j++) {
                const int8_t *v = q + QBLOCK * b + 8 * j;
                uint8_t *dst = base + (long)(4 * b + j) * 4 * width;
                for (int t = 0; t < 4; t++) dst[t] = (uint8_t)((v[t] & 0x0F) | (v[t + 4] << 4));
            }
    } else if (bits == 6) {  /* c + 32: its low 4 bits as 4-bit codes in chunks 0-3; its top 2 bits
                              * of input 32b + 16k + 4i + t -> chunk 4 + k, byte 4 lane + t, bits 2i */
        uint8_t *base = codes + p * ((long)K * width * 6 / 8) + 4 * lane;
        for (int b = 0; b < K / QBLOCK; b++) {
            uint8_t u[QBLOCK];
            for (int i = 0; i < QBLOCK; i++) u[i] = (uint8_t)(q[QBLOCK * b + i] + 32);
            uint8_t *dst = base + (long)6 * b * 4 * width;
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < 4; t++)
                    dst[(long)j * 4 * width + t] = (uint8_t)((u[8 * j + t] & 0x0F) | ((u[8 * j + 4 + t] & 0x0F) << 4));
            for (int k = 0; k < 2; k++)
                for (int t = 0; t < 4; t++) {
                    uint8_t top = 0;
                    for (int i = 0; i < 4; i++) top |= (uint8_t)((u[16 * k + 4 * i + t] >> 4) << (2 * i));
                    dst[(long)(4 + k) * 4 * width + t] = top;
                }
        }
    } else {  /* input 32b + 4j + t -> block b, chunk j, byte 4 lane + t */
        uint8_t *base = codes + p * ((long)K * width) + 4 * lane;
        for (int b = 0; b < K / QBLOCK; b++)
            for (int j = 0; j < 8; j++) memcpy(base + (long)(8 * b + j) * 4 * width, q + QBLOCK * b + 4 * j, 4);
    }
    if (!dn) return;
    float *dp = d_out + p * groups * width + lane;
    for (long g = 0; g < groups; g++) dp[g * width] = dn[g / repeat];
    if (m_out) {
        float *mp = m_out + p * groups * width + lane;
        for (long g = 0; g < groups; g++) mp[g * width] = offsets ? mn[g / repeat] : -0.0f;
    }
}

/* One row's two-level terms (D, Mneg per super-block; scale, min per native group) into output
 * `out`: D and Mneg [panel][K / SUPER][width], sub-scales [panel][group][width] followed, with
 * offsets (m_out), by the sub-mins. */
static void place_terms(const float *D, const float *Mneg, const int8_t *scale, const int8_t *min, int K,
                        int native, int G, int width, long out, float *d_out, float *m_out, int8_t *sub) {
    const long p = out / width, lane = out % width, groups = K / G, repeat = native / G, supers = K / SUPER;
    for (long i = 0; i < supers; i++) {
        d_out[(p * supers + i) * width + lane] = D[i];
        if (m_out) m_out[(p * supers + i) * width + lane] = Mneg[i];
    }
    int8_t *sp = sub + p * (m_out ? 2 : 1) * groups * width + lane;
    for (long g = 0; g < groups; g++) {
        sp[g * width] = scale[g / repeat];
        if (m_out) sp[(groups + g) * width] = min[g / repeat];
    }
}

/* Rows [0, rows) of a tensor of ggml type `type` with K inputs per row, stored as `raw` (rows after
 * rows, K / block blocks each), into outputs row0.. of a weight in int8dot's layout: `bits`-bit codes
 * in panels of `width`, groups of G, offsets into m (NULL: none), and with `sub` two-level scales
 * (K-quants only; NULL: one-level). A grid format's codes stay indices into its grid with `lookup`
 * (4-bit codes), else become its values (8-bit codes). The caller allocates every panel and zeroes
 * the padding outputs. Returns 0, -1 for a type, group or width this cannot lay out (codes narrower
 * than the format's, offsets dropped, G not dividing the format's group, two levels of a format
 * without, a lookup of a format without a grid or into wider codes), -2 when out of memory. */
int gguf_repack(int type, const uint8_t *raw, int rows, int K, int bits, int G, int width, int row0,
                uint8_t *codes, float *d, float *m, int8_t *sub, int lookup, const uint8_t *table, int table_bytes,
                int threads) {
    if (type < 0 || type >= N_FORMATS || !FORMATS[type].decode) return -1;
    const Format f = FORMATS[type];
    if (K % f.block || K % QBLOCK || G <= 0 || f.group % G || bits < f.bits || (f.offsets && !m) ||
        (bits < 2 || bits == 5 || bits == 7 || bits > 8) || (sub && !f.terms) || (lookup && (!f.grid || bits < 3 || bits > 4)) ||
        (f.grid && !lookup && bits != 8) || (f.table && (!table || table_bytes != f.table)))
        return -1;
    const int per_block = f.block / f.group;
    const long row_bytes = (long)K / f.block * f.bytes;
    int failed = 0;
    #pragma omp parallel num_threads(threads) reduction(|: failed)
    {
        const size_t native_groups = (size_t)(K / f.group), blocks = (size_t)(K / f.block);
        int8_t *q = malloc((size_t)K), *scale = malloc(native_groups), *min = malloc(native_groups);
        float *dn = malloc(sizeof(float) * native_groups), *mn = malloc(sizeof(float) * native_groups);
        float *D = malloc(sizeof(float) * blocks), *Mneg = malloc(sizeof(float) * blocks);
        const int ok = q && scale && min && dn && mn && D && Mneg;
        failed = !ok;
        #pragma omp for schedule(static)  /* every thread meets the loop; one without scratch skips its rows */
        for (int r = 0; r < rows; r++) {
            if (!ok) continue;
            const uint8_t *src = raw + (long)r * row_bytes;
            for (int b = 0; b < K / f.block; b++) {
                const uint8_t *block = src + (long)b * f.bytes;
                f.decode(block, table, q + (long)b * f.block, dn + (long)b * per_block, mn + (long)b * per_block);
                if (sub) f.terms(block, D + b, Mneg + b, scale + (long)b * per_block, min + (long)b * per_block);
            }
            if (f.grid && !lookup)
                for (int i = 0; i < K; i++) q[i] = f.grid[q[i]];
            place_row(q, sub ? NULL : dn, mn, K, f.group, f.offsets, bits, G, width, (long)row0 + r, codes, d, m);
            if (sub) place_terms(D, Mneg, scale, min, K, f.group, G, width, (long)row0 + r, d, m, sub);
        }
        free(q);
        free(scale);
        free(min);
        free(dn);
        free(mn);
        free(D);
        free(Mneg);
    }
    return failed ? -2 : 0;
}
