/* kernels.c — the engine's own fused kernel for its hottest case: float32
 * sum/avg over `n` sources written to several destinations at once (the
 * pipelined path: the rank's private output and its shared slice; the direct
 * path: every rank's output), which saves copying the result out again.
 * Sums in rank order ((s0 + s1) + s2) + ..., as crun_reduce_n does, so every
 * path gives bit-identical results. Built for AVX2 and baseline
 * x86-64, picked at load time (target_clones). */
#include "transport/shm/shm_int.h"

#define KB 64 /* floats per block: the accumulator stays in registers */

/* Not under ThreadSanitizer: gcc instruments the ifunc resolver, which the
 * dynamic loader runs before the TSan runtime is set up (SIGSEGV at load). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SHM_CLONES __attribute__((target_clones("avx2", "default"), optimize("O3")))
#else
#define SHM_CLONES
#endif

/* Sums one block of m <= KB floats at off into every destination. No
 * restrict: a destination may be a source (in place), which is safe because
 * the whole block is read before any of it is written. */
SHM_CLONES
static void sum_block_multi(float *const *dsts, int nd, const float *const *srcs, int n,
                            size_t off, size_t m, float div, int scale) {
  float acc[KB];
  const float *s0 = srcs[0] + off;
  for (size_t j = 0; j < m; j++) acc[j] = s0[j];
  for (int k = 1; k < n; k++) {
    const float *s = srcs[k] + off;
    for (size_t j = 0; j < m; j++) acc[j] += s[j];
  }
  if (scale)
    for (size_t j = 0; j < m; j++) acc[j] /= div;
  for (int k = 0; k < nd; k++) {
    float *d = dsts[k] + off;
    for (size_t j = 0; j < m; j++) d[j] = acc[j];
  }
}

SHM_CLONES
static void sum_full_blocks_multi(float *const *dsts, int nd, const float *const *srcs, int n,
                                  size_t nblocks, float div, int scale) {
  for (size_t b = 0; b < nblocks; b++) {
    float acc[KB];
    size_t off = b * KB;
    const float *s0 = srcs[0] + off;
    for (size_t j = 0; j < KB; j++) acc[j] = s0[j];
    for (int k = 1; k < n; k++) {
      const float *s = srcs[k] + off;
      for (size_t j = 0; j < KB; j++) acc[j] += s[j];
    }
    if (scale)
      for (size_t j = 0; j < KB; j++) acc[j] /= div;
    for (int k = 0; k < nd; k++) {
      float *d = dsts[k] + off;
      for (size_t j = 0; j < KB; j++) d[j] = acc[j];
    }
  }
}

/* dsts[k][i] = srcs[0][i] + ... + srcs[n-1][i] (divided by n when avg) for
 * every k < nd, in one pass; a destination may be one of the sources at the
 * same index (in place), no other overlap. */
void crun__shm_sum_f32_multi(float *const *dsts, int nd, const float *const *srcs, int n,
                             size_t count, int avg) {
  size_t full = count / KB;
  sum_full_blocks_multi(dsts, nd, srcs, n, full, (float)n, avg);
  if (count > full * KB)
    sum_block_multi(dsts, nd, srcs, n, full * KB, count - full * KB, (float)n, avg);
}

/* d1[i] = d2[i] = srcs[0][i] + ... + srcs[n-1][i] (divided by n when avg). */
void crun__shm_sum_f32_dual(float *d1, float *d2, const float *const *srcs, int n,
                            size_t count, int avg) {
  float *dsts[2] = {d1, d2};
  crun__shm_sum_f32_multi(dsts, 2, srcs, n, count, avg);
}
