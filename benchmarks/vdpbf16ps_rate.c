/* How many vdpbf16ps (512-bit) one core retires a second: 12 independent accumulator chains,
 * enough to cover the instruction's latency, 2.4e9 instructions in all. The ceiling a bf16 conv
 * on the dot product can reach per core (64 flops an instruction); benchmarks/README.md,
 * "Zen 4: bf16 Winograd for every 3x3 conv". Prints JSON:
 *
 *   gcc -O2 -mavx512f -mavx512bf16 -o /tmp/vdpbf16ps_rate benchmarks/vdpbf16ps_rate.c
 *   /tmp/vdpbf16ps_rate > benchmarks/results/vdpbf16ps_rate_zen4.json
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define STEP(a) a = _mm512_dpbf16_ps(a, x, y)

static double rate(long n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512 a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = x;
    double t = now();
    for (long i = 0; i < n; i++) {
        STEP(a0); STEP(a1); STEP(a2); STEP(a3); STEP(a4); STEP(a5);
        STEP(a6); STEP(a7); STEP(a8); STEP(a9); STEP(a10); STEP(a11);
        /* keeps the chains in registers and the loop from being folded */
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                              "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    t = now() - t;
    volatile float sink = _mm512_reduce_add_ps(_mm512_add_ps(a0, a11));
    (void)sink;
    return n * 12 / t;
}

int main(void) {
    const long n = 200000000;
    printf("{\"benchmark\": \"vdpbf16ps_rate\", \"chains\": 12, \"runs\": [");
    for (int r = 0; r < 3; r++) {
        double per_s = rate(n);
        printf("%s{\"instructions_per_s\": %.4g, \"gflops_one_core\": %.1f}", r ? ", " : "", per_s, per_s * 64 / 1e9);
    }
    printf("]}\n");
    return 0;
}
