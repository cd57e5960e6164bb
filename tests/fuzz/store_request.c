/* store_request.c — fuzzes the TCP store server's request parsing
 * (runtime/store/tcp_proto.c: crun__sproto_check_request, crun__sproto_frame,
 * crun__sproto_parse_request) and the key/value table the server applies
 * requests to (runtime/store/kv.c), as serve_conn does with a client's byte
 * stream. Each whole frame is copied to a buffer of exactly its size, so a
 * read past a frame is an ASan report. Contract checks: a parsed request
 * has the op's arity and arguments inside the frame; a set key reads back
 * its value; add keeps a decimal integer. */
#include "fuzz.h"
#include "store/store_impl.h"
#include "store/tcp_proto.h"

static void check_in_frame(const crun__sreq_t *r, const uint8_t *f, uint32_t flen) {
  for (unsigned i = 0; i < r->nargs; i++) {
    const uint8_t *p = r->args[i].p;
    if (p < f + CRUN_STORE_FRAME_HDR || p + r->args[i].len > f + 4 + flen)
      FUZZ_FAIL("argument %u of op %d lies outside its %u-byte frame", i, r->op, flen);
  }
}

/* Reads every value the request names (what GET / MULTI_GET would send). */
static size_t read_values(crun__kv_t *kv, const crun__sreq_t *r) {
  size_t sum = 0;
  for (unsigned i = 0; i < r->nargs; i++) {
    crun__kv_entry_t *e = crun__kv_find(kv, (const char *)r->args[i].p, r->args[i].len);
    for (size_t j = 0; e && j < e->len; j++) sum += e->val[j];
  }
  return sum;
}

static void expect_value(crun__kv_t *kv, const crun__sarg_t *k, const void *v, size_t len) {
  crun__kv_entry_t *e = crun__kv_find(kv, (const char *)k->p, k->len);
  if (!e || e->len != len || (len && memcmp(e->val, v, len) != 0))
    FUZZ_FAIL("key of %u bytes does not read back the %zu-byte value just set", k->len, len);
}

/* Applies a parsed request to the table as run_op does. */
static void apply(crun__kv_t *kv, const crun__sreq_t *r) {
  const crun__sarg_t *a = r->args;
  int64_t v;
  const void *res;
  size_t rlen;
  switch (r->op) {
  case CRUN__SOP_SET:
  case CRUN__SOP_SET_NOREPLY:
    if (crun__kv_set(kv, (const char *)a[0].p, a[0].len, a[1].p, a[1].len) == 0) expect_value(kv, &a[0], a[1].p, a[1].len);
    break;
  case CRUN__SOP_APPEND: crun__kv_append(kv, (const char *)a[0].p, a[0].len, a[1].p, a[1].len); break;
  case CRUN__SOP_ADD:
    if (crun__kv_add(kv, (const char *)a[0].p, a[0].len, crun__get_i64(a[1].p), &v) == 0) {
      char text[32];
      expect_value(kv, &a[0], text, (size_t)snprintf(text, sizeof text, "%lld", (long long)v));
    }
    break;
  case CRUN__SOP_CAS:
    crun__kv_compare_set(kv, (const char *)a[0].p, a[0].len, a[1].p, a[1].len, a[2].p, a[2].len, &res, &rlen);
    break;
  case CRUN__SOP_DELETE:
    crun__kv_delete(kv, (const char *)a[0].p, a[0].len);
    if (crun__kv_find(kv, (const char *)a[0].p, a[0].len)) FUZZ_FAIL("a deleted key is still found");
    break;
  case CRUN__SOP_MULTI_SET:
    for (unsigned i = 0; i < r->nargs; i += 2) crun__kv_set(kv, (const char *)a[i].p, a[i].len, a[i + 1].p, a[i + 1].len);
    break;
  case CRUN__SOP_GET: case CRUN__SOP_MULTI_GET: case CRUN__SOP_WAIT: case CRUN__SOP_CHECK:
    (void)read_values(kv, r);
    break;
  case CRUN__SOP_JOIN_WAIT: (void)crun__get_i64(a[0].p); break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  crun__kv_t kv;
  if (crun__kv_init(&kv) < 0) return 0;
  size_t off = 0;
  char why[160];
  while (size - off >= 4) {
    uint32_t flen = 0;
    int hdr = crun__sproto_check_request(data + off, size - off, why, sizeof why);
    int st = crun__sproto_frame(data + off, size - off, &flen);
    if ((hdr == CRUN__SREQ_BAD_LEN) != (st == CRUN__SFRAME_BAD))
      FUZZ_FAIL("the header check and the frame check disagree on a length of %u", flen);
    if (hdr != CRUN__SREQ_OK || st != CRUN__SFRAME_WHOLE) break; /* the server closes / waits */
    uint8_t *f = fuzz_dup(data + off, 4 + (size_t)flen);
    crun__sreq_t r;
    why[0] = 0;
    if (crun__sproto_parse_request(f, flen, &r, why, sizeof why) == 0) {
      check_in_frame(&r, f, flen);
      apply(&kv, &r);
    } else if (!why[0]) {
      FUZZ_FAIL("a refused request without a reason");
    }
    crun__sproto_request_free(&r);
    free(f);
    off += 4 + (size_t)flen;
  }
  crun__kv_free(&kv);
  return 0;
}
