// What an AMX kernel pays to (re)configure its tiles: ldtilecfg against sttilecfg and a
// compare, per call, on this CPU. Built and run by amx_tile_config.py; prints JSON.
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#define N 200000

int main(void) {
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) { printf("{\"error\": \"arch_prctl refused the tile state\"}\n"); return 1; }
  unsigned char cfg[64] __attribute__((aligned(64)));
  unsigned char cur[64] __attribute__((aligned(64)));
  static unsigned short a[16 * 32] __attribute__((aligned(64))), b[16 * 32] __attribute__((aligned(64)));
  memset(cfg, 0, 64);
  cfg[0] = 1;
  for (int t = 0; t < 8; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
  int reloads = 0;
  _tile_loadconfig(cfg);
  unsigned long long t0 = __rdtsc();
  for (int i = 0; i < N; i++) { _tile_loadconfig(cfg); _tile_zero(0); }
  unsigned long long t1 = __rdtsc();
  for (int i = 0; i < N; i++) {
    _tile_storeconfig(cur);
    if (memcmp(cur, cfg, 64)) { reloads++; _tile_loadconfig(cfg); }
    _tile_zero(0);
  }
  unsigned long long t2 = __rdtsc();
  for (int i = 0; i < N; i++) { _tile_zero(0); }
  unsigned long long t3 = __rdtsc();
  for (int i = 0; i < N; i++) { _tile_loadd(4, a, 64); _tile_loadd(6, b, 64); _tile_dpbf16ps(0, 4, 6); }
  unsigned long long t4 = __rdtsc();
  _tile_release();
  printf("{\"ldtilecfg_and_zero\": %.1f, \"sttilecfg_compare_and_zero\": %.1f, \"zero\": %.1f, "
         "\"two_loads_and_tdpbf16ps\": %.1f, \"reloads\": %d, \"calls\": %d}\n",
         (double)(t1 - t0) / N, (double)(t2 - t1) / N, (double)(t3 - t2) / N, (double)(t4 - t3) / N, reloads, N);
  return 0;
}
