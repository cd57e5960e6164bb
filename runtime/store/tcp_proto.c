/* tcp_proto.c — the TCP store's frame parsing, apart from any socket (see
 * tcp_proto.h): the server and the client feed their buffers through these
 * functions, and so does tests/fuzz, so the fuzzers run the product's code. */
#include "store/tcp_proto.h"

#include <stdlib.h>

#include "crun.h"

int crun__sproto_frame(const uint8_t *buf, size_t have, uint32_t *flen) {
  if (have < 4) return CRUN__SFRAME_SHORT;
  *flen = crun__get_u32(buf);
  if (*flen > CRUN_STORE_MAX_FRAME || *flen < CRUN_STORE_FRAME_HDR - 4) return CRUN__SFRAME_BAD;
  return have - 4 >= *flen ? CRUN__SFRAME_WHOLE : CRUN__SFRAME_SHORT;
}

int crun__sproto_check_request(const uint8_t *f, size_t have, char *why, size_t whylen) {
  uint32_t flen = crun__get_u32(f);
  if (flen > CRUN_STORE_MAX_FRAME || flen < CRUN_STORE_FRAME_HDR - 4) {
    snprintf(why, whylen, "frame of %u bytes (limit %u, minimum %d)", flen, CRUN_STORE_MAX_FRAME,
             CRUN_STORE_FRAME_HDR - 4);
    return CRUN__SREQ_BAD_LEN;
  }
  if (have < CRUN_STORE_FRAME_HDR) return CRUN__SREQ_OK;
  if (f[4] != CRUN_STORE_PROTO_VERSION) {
    snprintf(why, whylen, "protocol version %u, expected %d", f[4], CRUN_STORE_PROTO_VERSION);
    return CRUN__SREQ_BAD_VERSION;
  }
  if (f[5] == 0 || f[5] > CRUN__SOP_MAX) {
    snprintf(why, whylen, "unknown op %u", f[5]);
    return CRUN__SREQ_BAD_OP;
  }
  return CRUN__SREQ_OK;
}

/* Whether a is a parking request's timeout: 8 bytes, timeout_ms >= 0. */
static int is_timeout(const crun__sarg_t *a) { return a->len == 8 && crun__get_i64(a->p) >= 0; }

/* Returns NULL when op accepts n arguments, else the reason it does not. */
static const char *arity_error(int op, unsigned n, const crun__sarg_t *a) {
  switch (op) {
  case CRUN__SOP_SET: case CRUN__SOP_APPEND: case CRUN__SOP_QUEUE_PUSH: case CRUN__SOP_SET_NOREPLY:
    return n == 2 ? NULL : "needs 2 arguments";
  case CRUN__SOP_DELETE: case CRUN__SOP_QUEUE_LEN: return n == 1 ? NULL : "needs 1 argument";
  case CRUN__SOP_GET: return n == 2 && is_timeout(&a[1]) ? NULL : "needs a key and an 8-byte timeout >= 0";
  case CRUN__SOP_WAIT: case CRUN__SOP_MULTI_GET:
    return n >= 2 && is_timeout(&a[n - 1]) ? NULL : "needs keys and an 8-byte timeout >= 0";
  case CRUN__SOP_QUEUE_POP: return n == 2 && a[1].len == 8 ? NULL : "needs a key and an 8-byte timeout";
  case CRUN__SOP_ADD: return n == 2 && a[1].len == 8 ? NULL : "needs a key and an 8-byte delta";
  case CRUN__SOP_CAS: return n == 3 ? NULL : "needs 3 arguments";
  case CRUN__SOP_CHECK: return n >= 1 ? NULL : "needs at least one key";
  case CRUN__SOP_MULTI_SET: return n >= 2 && n % 2 == 0 ? NULL : "needs key/value pairs";
  case CRUN__SOP_NUM_KEYS: case CRUN__SOP_PING: case CRUN__SOP_JOIN: case CRUN__SOP_LIST_KEYS:
    return n == 0 ? NULL : "takes no arguments";
  case CRUN__SOP_JOIN_WAIT:
    return n == 2 && a[0].len == 8 && is_timeout(&a[1]) ? NULL : "needs an 8-byte count and timeout >= 0";
  }
  return "unknown op";
}

int crun__sproto_parse_request(const uint8_t *f, uint32_t flen, crun__sreq_t *r, char *why, size_t whylen) {
  r->op = f[5];
  r->nargs = (unsigned)f[6] | (unsigned)f[7] << 8;
  r->args = r->nargs <= 16 ? r->stack : malloc(r->nargs * sizeof *r->args);
  if (!r->args) return snprintf(why, whylen, "out of memory"), -1;
  const char *bad = NULL;
  if (crun__sproto_parse(f + CRUN_STORE_FRAME_HDR, (size_t)flen + 4 - CRUN_STORE_FRAME_HDR, r->nargs, r->args) < 0)
    bad = "arguments do not fill the frame";
  else
    bad = arity_error(r->op, r->nargs, r->args);
  if (!bad) return 0;
  snprintf(why, whylen, "op %d with %u arguments: %s", r->op, r->nargs, bad);
  return -1;
}

void crun__sproto_request_free(crun__sreq_t *r) {
  if (r->args && r->args != r->stack) free(r->args);
  r->args = NULL;
}

int crun__sproto_parse_reply(const uint8_t *f, uint32_t flen, unsigned *code, crun__sarg_t **args,
                             unsigned *cap, unsigned *nargs) {
  unsigned n = (unsigned)f[6] | (unsigned)f[7] << 8;
  *code = f[5];
  if (n > *cap) {
    crun__sarg_t *na = realloc(*args, n * sizeof *na);
    if (!na) return crun_error(CRUN_ENOMEM, "store: out of memory for a reply");
    *args = na;
    *cap = n;
  }
  if (f[4] != CRUN_STORE_PROTO_VERSION ||
      crun__sproto_parse(f + CRUN_STORE_FRAME_HDR, (size_t)flen + 4 - CRUN_STORE_FRAME_HDR, n, *args) < 0)
    return -1;
  *nargs = n;
  return 0;
}

int crun__sproto_reply_error(unsigned code, const crun__sarg_t *args, unsigned nargs, const char *where) {
  int st = -(int)code;
  const char *msg = nargs ? (const char *)args[0].p : "";
  int mlen = nargs ? (int)args[0].len : 0;
  if (strcmp(crun_err_name(st), "EUNKNOWN") == 0) /* a server newer than this client, or not crun's */
    return crun_error(CRUN_EPROTO, "reply code %u names no status: %.*s (%s)", code, mlen > 200 ? 200 : mlen, msg, where);
  size_t nl = strlen(crun_err_name(st));
  if (mlen > (int)nl + 2 && strncmp(msg, crun_err_name(st), nl) == 0) msg += nl + 2, mlen -= (int)nl + 2;
  return crun_error(st, "%.*s (%s)", mlen, msg, where);
}

double crun__store_spin_seconds(long default_us) {
  long us = crun_env_int("CRUN_STORE_SPIN_US", default_us);
  if (us < 0) us = 0;
  if (us > 1000000) us = 1000000;
  return (double)us * 1e-6;
}
