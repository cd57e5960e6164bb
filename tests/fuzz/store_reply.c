/* store_reply.c — fuzzes the TCP store client's reply parsing
 * (runtime/store/tcp_proto.c: crun__sproto_frame, crun__sproto_parse_reply,
 * crun__sproto_reply_error) over a stream of reply frames, with the
 * argument array reused and grown across replies as tcp_client.c does.
 * Contract checks: arguments lie inside their frame; an error reply turns
 * into a known negative status whose recorded text starts with its name. */
#include "fuzz.h"
#include "store/store_impl.h"
#include "store/tcp_proto.h"

static void check_error(unsigned code, const crun__sarg_t *a, unsigned n) {
  int st = crun__sproto_reply_error(code, a, n, "store fuzz:29500");
  const char *name = crun_err_name(st);
  if (st >= 0 || strcmp(name, "EUNKNOWN") == 0)
    FUZZ_FAIL("reply code %u became status %d (%s), not a known error status", code, st, name);
  const char *msg = crun_last_error();
  if (strncmp(msg, name, strlen(name)) != 0 || strncmp(msg + strlen(name), ": ", 2) != 0)
    FUZZ_FAIL("error text '%.80s' does not start with '%s: '", msg, name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  crun__sarg_t *args = NULL;
  unsigned cap = 0, n = 0;
  size_t off = 0;
  while (size - off >= 4) {
    uint32_t flen = 0;
    if (crun__sproto_frame(data + off, size - off, &flen) != CRUN__SFRAME_WHOLE) break;
    uint8_t *f = fuzz_dup(data + off, 4 + (size_t)flen);
    unsigned code = 0;
    int rc = crun__sproto_parse_reply(f, flen, &code, &args, &cap, &n);
    if (rc == 0) {
      for (unsigned i = 0; i < n; i++)
        if (args[i].p < f + CRUN_STORE_FRAME_HDR || args[i].p + args[i].len > f + 4 + flen)
          FUZZ_FAIL("reply argument %u lies outside its %u-byte frame", i, flen);
      if (code) check_error(code, args, n);
    } else if (rc != -1 && rc != CRUN_ENOMEM) {
      FUZZ_FAIL("crun__sproto_parse_reply returned %d", rc);
    }
    free(f);
    if (rc != 0) break; /* the client drops the connection */
    off += 4 + (size_t)flen;
  }
  free(args);
  return 0;
}
