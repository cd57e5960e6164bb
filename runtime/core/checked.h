/* checked.h — overflow-checked size and offset arithmetic (internal).
 *
 * Every size, count, offset or byte length computed from a caller's numbers
 * goes through these: each returns 0 and stores the result, or returns
 * non-zero (leaving *out unspecified) when the exact result does not fit. */
#ifndef CRUN_CORE_CHECKED_H
#define CRUN_CORE_CHECKED_H

#include <stddef.h>
#include <stdint.h>

static inline int crun__add_i64(int64_t a, int64_t b, int64_t *out) { return __builtin_add_overflow(a, b, out); }
static inline int crun__mul_i64(int64_t a, int64_t b, int64_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline int crun__add_size(size_t a, size_t b, size_t *out) { return __builtin_add_overflow(a, b, out); }
static inline int crun__mul_size(size_t a, size_t b, size_t *out) { return __builtin_mul_overflow(a, b, out); }

/* Product of n non-negative sizes into *out; non-zero on overflow or when
 * a size is negative. */
static inline int crun__prod_i64(const int64_t *v, int n, int64_t *out) {
  int64_t p = 1;
  for (int i = 0; i < n; i++)
    if (v[i] < 0 || crun__mul_i64(p, v[i], &p)) return 1;
  *out = p;
  return 0;
}

#endif
