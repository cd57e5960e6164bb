/* fuzz.h — helpers shared by the libFuzzer targets of tests/fuzz.
 *
 * Each target is one LLVMFuzzerTestOneInput that feeds the input to the
 * parsing functions the product itself calls (no copies of them), and checks
 * what comes out against the function's contract: a violation aborts with
 * FUZZ_FAIL, which libFuzzer reports as a crash and saves the input. */
#ifndef CRUN_FUZZ_H
#define CRUN_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_FAIL(...)                                        \
  do {                                                        \
    fprintf(stderr, "fuzz contract violated at %s:%d: ", __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                             \
    fputc('\n', stderr);                                      \
    abort();                                                  \
  } while (0)

/* A cursor over the input: takes fixed-size pieces, zeros once it runs out. */
typedef struct {
  const uint8_t *p;
  size_t left;
} fuzz_in_t;

static inline size_t fuzz_take(fuzz_in_t *in, void *out, size_t n) {
  size_t k = n < in->left ? n : in->left;
  if (k) memcpy(out, in->p, k);
  if (k < n) memset((uint8_t *)out + k, 0, n - k);
  in->p += k, in->left -= k;
  return k;
}

static inline uint8_t fuzz_u8(fuzz_in_t *in) {
  uint8_t v;
  fuzz_take(in, &v, 1);
  return v;
}

/* A malloc'd copy of n bytes, so ASan catches a read one byte past them. */
static inline uint8_t *fuzz_dup(const void *p, size_t n) {
  uint8_t *d = malloc(n ? n : 1);
  if (!d) abort();
  if (n) memcpy(d, p, n);
  return d;
}

#endif
