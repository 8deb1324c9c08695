/* How many dot-product steps one core retires a second, 12 independent accumulator chains
 * (enough to cover each step's latency; a register tile within AVX2's budget of 13), 2.4e9
 * steps in all: the ceiling a conv on that instruction can reach per core. Prints JSON.
 *
 *   vdpbf16ps: one 512-bit vdpbf16ps a step (AVX512_BF16; 64 flops), the bf16 templates'
 *              instruction (benchmarks/archive/README.md, "Zen 4: bf16 Winograd for every 3x3 conv");
 *   fma:       one 512-bit vfmadd231ps a step (AVX-512F; 32 flops), the fp32 templates' instruction:
 *              beside vdpbf16ps, whether bf16 has more arithmetic than fp32 on this CPU at all;
 *   vpdpbusd:  one 512-bit vpdpbusd a step (AVX512_VNNI; 64 lanes of uint8 x int8, 128 ops),
 *              the int8 templates' instruction where the CPU has VNNI;
 *   avx2:      vpmaddubsw into int16 pairs, vpmaddwd by ones, vpaddd (8 lanes of uint8 x int8
 *              quadruples; 64 ops), the int8 templates' dot product without VNNI
 *              (search_spaces/templates/intrin_x86.py, AVX2_DOT; "AVX2 Zen 3: the host's slow phases").
 *
 *   gcc -O2 -o /tmp/dot_rate benchmarks/archive/dot_rate.c
 *   /tmp/dot_rate vdpbf16ps > benchmarks/archive/results/vdpbf16ps_rate_zen4.json
 *   /tmp/dot_rate avx2 > benchmarks/archive/results/avx2_dot_rate_zen3.json
 *   for k in vdpbf16ps fma vpdpbusd; do /tmp/dot_rate $k; done > benchmarks/archive/results/dot_rates_emr_noamx.jsonl
 * Each kernel is compiled for its own instructions only, so the binary runs on a CPU without
 * AVX-512 as long as it is not asked for vdpbf16ps.
 */
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The empty asm keeps the chains in registers and the loop from being folded. */
#define BARRIER(kind) __asm__ volatile("" : "+" kind(a0), "+" kind(a1), "+" kind(a2), "+" kind(a3), \
    "+" kind(a4), "+" kind(a5), "+" kind(a6), "+" kind(a7), "+" kind(a8), "+" kind(a9), "+" kind(a10), "+" kind(a11))
#define TWELVE(STEP) STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5); \
    STEP(a6); STEP(a7); STEP(a8); STEP(a9); STEP(a10); STEP(a11)

/* One kernel: twelve chains of vector type VEC from ZERO, operands declared by OPERANDS,
 * STEP applied to each chain n times; SINK reduces two chains so that none is dead code. */
#define RATE_KERNEL(NAME, TARGET, VEC, ZERO, OPERANDS, STEP, SINK_TYPE, SINK)                  \
    __attribute__((target(TARGET))) static double NAME(long n) {                              \
        VEC a0 = ZERO, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;                           \
        VEC a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;                           \
        OPERANDS;                                                                             \
        double t = now();                                                                     \
        for (long i = 0; i < n; i++) {                                                        \
            TWELVE(STEP);                                                                     \
            BARRIER("v");                                                                     \
        }                                                                                     \
        t = now() - t;                                                                        \
        volatile SINK_TYPE sink = SINK;                                                       \
        (void)sink;                                                                           \
        return n * 12 / t;                                                                    \
    }

#define BF16_STEP(a) a = _mm512_dpbf16_ps(a, x, y)
RATE_KERNEL(vdpbf16ps_rate, "avx512f,avx512bf16", __m512, _mm512_setzero_ps(),
            __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80); __m512bh y = x, BF16_STEP,
            float, _mm512_reduce_add_ps(_mm512_add_ps(a0, a11)))

#define FMA_STEP(a) a = _mm512_fmadd_ps(x, y, a)
RATE_KERNEL(fma_rate, "avx512f", __m512, _mm512_setzero_ps(), __m512 x = _mm512_set1_ps(1.0f); __m512 y = x,
            FMA_STEP, float, _mm512_reduce_add_ps(_mm512_add_ps(a0, a11)))

#define VNNI_STEP(a) a = _mm512_dpbusd_epi32(a, x, y)
RATE_KERNEL(vpdpbusd_rate, "avx512f,avx512vnni", __m512i, _mm512_setzero_si512(),
            __m512i x = _mm512_set1_epi8(3); __m512i y = _mm512_set1_epi8(5), VNNI_STEP,
            int, _mm512_reduce_add_epi32(_mm512_add_epi32(a0, a11)))

/* The empty asm makes x look new at every step, so that the products are not shared. */
#define AVX2_STEP(a) __asm__ volatile("" : "+x"(x)); \
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones))

__attribute__((target("avx2"))) static double avx2_rate(long n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
    double t = now();
    for (long i = 0; i < n; i++) {
        TWELVE(AVX2_STEP);
        BARRIER("x");
    }
    t = now() - t;
    volatile int sink = _mm256_extract_epi32(_mm256_add_epi32(a0, a11), 0);
    (void)sink;
    return n * 12 / t;
}

struct kernel {
    const char *name, *benchmark, *rate_field, *ops_field;
    double ops_per_step;
    double (*rate)(long);
};

static const struct kernel KERNELS[] = {
    /* the field names of the first two benchmarks' earlier files, kept */
    {"vdpbf16ps", "vdpbf16ps_rate", "instructions_per_s", "gflops_one_core", 64, vdpbf16ps_rate},
    {"avx2", "avx2_dot_rate", "steps_per_s", "gops_one_core", 64, avx2_rate},
    {"fma", "fma_rate", "instructions_per_s", "gflops_one_core", 32, fma_rate},
    {"vpdpbusd", "vpdpbusd_rate", "instructions_per_s", "gops_one_core", 128, vpdpbusd_rate},
};

int main(int argc, char **argv) {
    const long n = 200000000;
    const struct kernel *k = NULL;
    for (unsigned i = 0; argc > 1 && i < sizeof KERNELS / sizeof KERNELS[0]; i++)
        if (strcmp(argv[1], KERNELS[i].name) == 0) k = &KERNELS[i];
    if (k == NULL) {
        fprintf(stderr, "usage: %s vdpbf16ps|avx2|fma|vpdpbusd\n", argv[0]);
        return 2;
    }
    printf("{\"benchmark\": \"%s\", \"chains\": 12, \"runs\": [", k->benchmark);
    for (int r = 0; r < 3; r++) {
        double per_s = k->rate(n);
        printf("%s{\"%s\": %.4g, \"%s\": %.1f}", r ? ", " : "", k->rate_field, per_s, k->ops_field,
               per_s * k->ops_per_step / 1e9);
    }
    printf("]}\n");
    return 0;
}
