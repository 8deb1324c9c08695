/* How many 8-lane uint8 x int8 dot steps one AVX2 core retires a second, as the int8 templates
 * compute them without VNNI (search_spaces/templates/intrin_x86.py, AVX2_DOT): vpmaddubsw into
 * int16 pairs, vpmaddwd by ones into int32, vpaddd into the accumulator; 12 independent
 * accumulator chains (a register tile within AVX2's budget of 13), 2.4e9 steps in all. The
 * ceiling an int8 conv can reach per core on such a CPU (32 multiply-adds, 64 ops a step);
 * benchmarks/README.md, "AVX2 Zen 3: ...". Prints JSON:
 *
 *   gcc -O2 -mavx2 -o /tmp/avx2_dot_rate benchmarks/avx2_dot_rate.c
 *   /tmp/avx2_dot_rate > benchmarks/results/avx2_dot_rate_zen3.json
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* the empty asm makes x look new to the compiler at every step, so the products are not shared */
#define STEP(a) __asm__ volatile("" : "+x"(x)); \
    a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), ones))

static double rate(long n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m256i a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
    double t = now();
    for (long i = 0; i < n; i++) {
        STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5);
        STEP(a6); STEP(a7); STEP(a8); STEP(a9); STEP(a10); STEP(a11);
        /* keeps the chains in registers and the loop from being folded */
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5),
                              "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
    }
    t = now() - t;
    volatile int sink = _mm256_extract_epi32(_mm256_add_epi32(a0, a11), 0);
    (void)sink;
    return n * 12 / t;
}

int main(void) {
    const long n = 200000000;
    printf("{\"benchmark\": \"avx2_dot_rate\", \"chains\": 12, \"runs\": [");
    for (int r = 0; r < 3; r++) {
        double per_s = rate(n);
        printf("%s{\"steps_per_s\": %.4g, \"gops_one_core\": %.1f}", r ? ", " : "", per_s, per_s * 64 / 1e9);
    }
    printf("]}\n");
    return 0;
}
