/* harness.h — a tiny C test harness. A test file defines its cases with
 * TEST(name) { ... } and lists them in CRUN_TESTS(X) X(name) ...; then
 * CRUN_TEST_MAIN(). Run `./test_x` for all cases or `./test_x name ...` for
 * some; each case runs in a forked child with a deadline so a crash or hang
 * fails that case only. */
#ifndef CRUN_TEST_HARNESS_H
#define CRUN_TEST_HARNESS_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crun.h"

typedef void (*crun_test_fn)(void);
typedef struct { const char *name; crun_test_fn fn; } crun_test_case;

int crun_test_run(int argc, char **argv, const crun_test_case *cases, size_t n);
void crun_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
/* Writes $TMPDIR/<name> (TMPDIR unset or empty: /tmp) into out, the name
 * made from fmt; a path that does not fit in cap fails the test. ctest runs
 * every test with a TMPDIR of its own (tests/tmpdir_run.sh), removed after
 * it, so nothing a test makes there stays in the shared /tmp. */
void crun_test_tmp_path(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define TEST(name) static void test_##name(void)

#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) crun_test_fail(__FILE__, __LINE__, "expected %s", #cond);    \
  } while (0)

#define EXPECT_EQ_INT(a, b)                                                   \
  do {                                                                        \
    long long crun__a = (long long)(a), crun__b = (long long)(b);             \
    if (crun__a != crun__b)                                                   \
      crun_test_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b,    \
                     crun__a, crun__b);                                       \
  } while (0)

/* Expects a crun status of 0; prints crun_last_error() otherwise. */
#define EXPECT_OK(call)                                                       \
  do {                                                                        \
    int crun__rc = (call);                                                    \
    if (crun__rc != 0)                                                        \
      crun_test_fail(__FILE__, __LINE__, "%s -> %s (%s)", #call,              \
                     crun_err_name(crun__rc), crun_last_error());             \
  } while (0)

#define EXPECT_STATUS(call, status)                                           \
  do {                                                                        \
    int crun__rc = (call);                                                    \
    if (crun__rc != (status))                                                 \
      crun_test_fail(__FILE__, __LINE__, "%s -> %s, expected %s (%s)", #call, \
                     crun_err_name(crun__rc), crun_err_name(status),          \
                     crun_last_error());                                      \
  } while (0)

/* Expects crun_last_error() to contain needle. */
#define EXPECT_TEXT(needle)                                                           \
  do {                                                                                \
    if (!strstr(crun_last_error(), (needle)))                                         \
      crun_test_fail(__FILE__, __LINE__, "error text lacks '%s': %s", (needle), crun_last_error()); \
  } while (0)

#define CRUN_X_CASE(name) {#name, test_##name},
#define CRUN_TEST_MAIN()                                                      \
  int main(int argc, char **argv) {                                           \
    static const crun_test_case cases[] = {CRUN_TESTS(CRUN_X_CASE)};          \
    return crun_test_run(argc, argv, cases, sizeof cases / sizeof cases[0]);  \
  }

#endif
