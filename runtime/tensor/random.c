/* random.c — a seeded generator (xoshiro256**, seeded by splitmix64) and the
 * tensor fills built on it. */
#include "tensor/tensor_impl.h"
#include "cuda/cuda_int.h"

#include <math.h>

uint64_t crun_splitmix64_next(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void crun_generator_seed(crun_generator_t *g, uint64_t seed) {
  for (int i = 0; i < 4; i++) g->s[i] = crun_splitmix64_next(&seed);
  g->has_spare = 0;
  g->spare = 0;
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t crun_generator_next(crun_generator_t *g) {
  uint64_t *s = g->s;
  uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

double crun_generator_uniform(crun_generator_t *g) {
  return (double)(crun_generator_next(g) >> 11) * 0x1p-53;
}

double crun_generator_normal(crun_generator_t *g) {
  if (g->has_spare) {
    g->has_spare = 0;
    return g->spare;
  }
  double u1 = 1.0 - crun_generator_uniform(g); /* (0, 1]: log is finite */
  double u2 = crun_generator_uniform(g);
  double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
  g->spare = r * sin(th);
  g->has_spare = 1;
  return r * cos(th);
}

/* Uniform in [lo, hi) for dtype dt: float32 draws 24 bits so that rounding
 * never reaches hi when [lo, hi) = [0, 1). */
static double uniform_for(crun_generator_t *g, crun_dtype_t dt, double lo, double hi) {
  double u = dt == CRUN_FLOAT64 ? crun_generator_uniform(g)
                                : (double)(crun_generator_next(g) >> 40) * 0x1p-24;
  double v = lo + (hi - lo) * u;
  return crun_dtype_is_integer(dt) ? floor(v) : v;
}

static int fill_with(crun_tensor_t *t, crun_generator_t *g, int normal, double a, double b) {
  if (!g) return crun_error(CRUN_EINVAL, "random fill: generator is NULL");
  CRUN_CHECK(crun__check_writable(t, normal ? "normal_" : "uniform_"));
  crun__rowiter_t it;
  crun__rowiter_init(&it, t);
  if (it.rows_left <= 0) return 0;
  do {
    for (int64_t i = 0; i < it.len; i++) {
      double v = normal ? a + b * crun_generator_normal(g) : uniform_for(g, t->dt, a, b);
      crun_elem_set_double(t->dt, it.row, i * it.step, v);
    }
  } while (crun__rowiter_next(&it));
  return 0;
}

int crun_tensor_uniform_(crun_tensor_t *t, crun_generator_t *g, double lo, double hi) {
  CRUN__HOST_ONLY(t, "uniform_");
  if (!(lo <= hi)) return crun_error(CRUN_EINVAL, "uniform: lo %g > hi %g", lo, hi);
  if (!isfinite(hi - lo)) /* lo + inf * u: inf or NaN elements (torch refuses it too) */
    return crun_error(CRUN_EINVAL, "uniform: the range [%g, %g) is not finite", lo, hi);
  return fill_with(t, g, 0, lo, hi);
}

int crun_tensor_normal_(crun_tensor_t *t, crun_generator_t *g, double mean, double std) {
  CRUN__HOST_ONLY(t, "normal_");
  if (!(std >= 0)) return crun_error(CRUN_EINVAL, "normal: std %g < 0", std);
  return fill_with(t, g, 1, mean, std);
}
