/* philox.h — the Philox4x32-10 counter-based generator (Salmon et al., SC'11),
 * written for crun. A draw is a pure function of (counter, key): element i of
 * a Dropout mask uses counter (i, offset) and key = the seed, so the mask
 * depends on the seed alone, never on the launch geometry or thread order. */
#ifndef CRUN_CUDA_KERNELS_PHILOX_H
#define CRUN_CUDA_KERNELS_PHILOX_H

#include "cuda/kernels/common.h"

typedef struct { uint32_t v[4]; } crun__philox_ctr_t;

/* The high and low 32 bits of a * b. */
CRUN_HD void crun__k_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  *lo = (uint32_t)p;
}

/* Ten Philox rounds of ctr under key (k0, k1); returns the four output words. */
CRUN_HD crun__philox_ctr_t crun__k_philox4x32_10(crun__philox_ctr_t c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    uint32_t hi0, lo0, hi1, lo1;
    crun__k_mulhilo32(0xD2511F53u, c.v[0], &hi0, &lo0);
    crun__k_mulhilo32(0xCD9E8D57u, c.v[2], &hi1, &lo1);
    crun__philox_ctr_t n;
    n.v[0] = hi1 ^ c.v[1] ^ k0;
    n.v[1] = lo1;
    n.v[2] = hi0 ^ c.v[3] ^ k1;
    n.v[3] = lo0;
    c = n;
    k0 += 0x9E3779B9u; /* the Weyl key schedule */
    k1 += 0xBB67AE85u;
  }
  return c;
}

/* A uniform double in [0, 1) with 53 random bits for element i of stream
 * `offset` under `seed`. */
CRUN_HD double crun__k_philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  crun__philox_ctr_t c;
  c.v[0] = (uint32_t)i;
  c.v[1] = (uint32_t)(i >> 32);
  c.v[2] = (uint32_t)offset;
  c.v[3] = (uint32_t)(offset >> 32);
  c = crun__k_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
  uint64_t bits = ((uint64_t)c.v[0] << 32 | c.v[1]) >> 11;
  return (double)bits * (1.0 / 9007199254740992.0);
}

/* Dropout of element i: the mask value (0 with probability p, else keep =
 * 1/(1-p)) written to mask[i], and y[i] = x[i] * mask[i]. T is float or double. */
#define CRUN__K_DROPOUT(tn, T)                                                                 \
  CRUN_HD void crun__k_dropout_##tn(const T *x, T *y, T *mask, int64_t i, double p, double keep, \
                                    uint64_t seed, uint64_t offset) {                           \
    double u = crun__k_philox_uniform(seed, offset, (uint64_t)i);                              \
    T m = (T)(u < p ? 0.0 : keep);                                                             \
    mask[i] = m;                                                                               \
    y[i] = x[i] * m;                                                                           \
  }
CRUN__K_DROPOUT(f32, float)
CRUN__K_DROPOUT(f64, double)

#endif
