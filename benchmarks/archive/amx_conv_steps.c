// What one reduction step of an AMX conv tile costs on this CPU: tn B tile loads, tm A tile
// loads and tm x tn tile multiplies (tdpbf16ps, tdpbusd), in TSC cycles per step, for A rows
// of a 16-channel block (32 bytes of bf16, 16 of uint8) against a whole 64-byte row. Built
// and run by amx_conv_steps.py; prints one JSON object per line.
#include <immintrin.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#define STEPS 20000
static unsigned char A[1 << 17] __attribute__((aligned(64)));
static unsigned char B[1 << 17] __attribute__((aligned(64)));
static float C[16 * 16] __attribute__((aligned(64)));
static volatile unsigned char cfg[64] __attribute__((aligned(64)));

// Accumulators in tiles 0-3, A in 4-5, B in 6-7; B rows are 64 bytes of `elements`-tuples.
static void configure(int rows, int a_bytes, int b_rows) {
  for (int i = 0; i < 64; i++) cfg[i] = 0;
  cfg[0] = 1;
  for (int t = 0; t < 8; t++) {
    cfg[16 + 2 * t] = (t >= 4 && t < 6) ? a_bytes : 64;
    cfg[48 + t] = t >= 6 ? b_rows : rows;
  }
  _tile_loadconfig((const void *)cfg);
}

#define STEP(DP)                                                              \
  for (int s = 0; s < STEPS; s++) {                                           \
    int o = s & 63;                                                           \
    _tile_loadd(6, B + o * 1024, 64);                                         \
    if (tn > 1) _tile_loadd(7, B + o * 1024 + 512, 64);                       \
    _tile_loadd(4, A + o * 1024, a_stride);                                   \
    DP(0, 4, 6);                                                              \
    if (tn > 1) DP(1, 4, 7);                                                  \
    if (tm > 1) {                                                             \
      _tile_loadd(5, A + o * 1024 + 65536, a_stride);                         \
      DP(2, 5, 6);                                                            \
      if (tn > 1) DP(3, 5, 7);                                                \
    }                                                                         \
  }

static void run(const char *inst, int tm, int tn, int rows, int a_bytes, int a_stride) {
  int bf16 = inst[4] == 'f';  // tdpbf16ps, not tdpbusd
  configure(rows, a_bytes, a_bytes / 4);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  // once untimed: the first tile multiplies after a while run slowly (the core's AMX warm-up)
  if (bf16) { STEP(_tile_dpbf16ps) } else { STEP(_tile_dpbusd) }
  unsigned long long t0 = __rdtsc();
  if (bf16) { STEP(_tile_dpbf16ps) } else { STEP(_tile_dpbusd) }
  unsigned long long t1 = __rdtsc();
  _tile_stored(0, C, 64);
  double cycles = (double)(t1 - t0) / STEPS;
  double macs = (double)tm * tn * rows * 16 * (a_bytes / (bf16 ? 2 : 1));
  printf("{\"inst\": \"%s\", \"tm\": %d, \"tn\": %d, \"rows\": %d, \"channels\": %d, \"a_stride\": %d, "
         "\"cycles_per_step\": %.2f, \"macs_per_cycle\": %.1f}\n",
         inst, tm, tn, rows, a_bytes / (bf16 ? 2 : 1), a_stride, cycles, macs / cycles);
}

int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { printf("{\"error\": \"arch_prctl refused the tile state\"}\n"); return 1; }
  const char *insts[] = {"tdpbf16ps", "tdpbusd"};
  int rows[] = {7, 14, 16};
  for (int i = 0; i < 2; i++) {
    int block = i == 0 ? 32 : 16;  // bytes of a 16-channel block
    for (int r = 0; r < 3; r++)
      for (int tm = 1; tm <= 2; tm++)
        for (int tn = 1; tn <= 2; tn++) {
          run(insts[i], tm, tn, rows[r], block, block);  // NCHW16c: A rows one block apart
          run(insts[i], tm, tn, rows[r], 64, 64);        // a wide block: whole rows
        }
  }
  _tile_release();
  return 0;
}
