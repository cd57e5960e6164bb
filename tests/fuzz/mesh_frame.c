/* mesh_frame.c — fuzzes how a mesh connection's frames are taken apart
 * (runtime/transport/tcp_wire.c): the header check, the abort frame's text
 * (crun__tcp_abort_dst, crun__tcp_abort_body) and the mismatch description
 * (crun__tcp_call_shape), the way tcp_xfer.c and tcp_p2p.c use them. The
 * input is a stream of 48-byte headers; the payload of an abort frame is
 * "received" (up to 64 KiB) into the buffers the product uses, exactly
 * where and as much as crun__tcp_abort_dst says, as recv() would. Contract
 * checks: only magic + group frames pass; an abort frame gives a known
 * negative status; a description names no "(null)". */
#include "fuzz.h"
#include "transport/tcp_priv.h"

#define GROUP 0x1234abcdu
#define PAYLOAD_CAP (64u << 10) /* bytes of one abort frame the harness sends (> text + sink) */

/* Receives an abort frame's text as tcp_xfer.c's RX_ABORT state does. */
static void abort_frame(const crun__hdr_t *h, const uint8_t *fill, size_t nfill) {
  size_t kept = h->nbytes > CRUN__ABORT_TEXT_MAX ? CRUN__ABORT_TEXT_MAX : (size_t)h->nbytes;
  char *text = calloc(1, kept + 1), sink[4096];
  if (!text) abort();
  char pattern[4096]; /* the rest of the input, over and over */
  size_t have = nfill < sizeof pattern ? nfill : sizeof pattern;
  if (have) memcpy(pattern, fill, have);
  else pattern[0] = 'x', have = 1;
  for (; have < sizeof pattern; have *= 2) /* few steps: no per-byte loop for the fuzzer to trace */
    memcpy(pattern + have, pattern, have < sizeof pattern - have ? have : sizeof pattern - have);
  uint64_t got = 0, limit = h->nbytes < PAYLOAD_CAP ? h->nbytes : PAYLOAD_CAP;
  while (got < limit) {
    size_t want;
    char *dst = crun__tcp_abort_dst(text, sink, sizeof sink, h->nbytes, got, &want);
    if (want == 0) FUZZ_FAIL("abort frame of %llu bytes: nothing to read after %llu", (unsigned long long)h->nbytes,
                             (unsigned long long)got);
    size_t k = want < limit - got ? want : (size_t)(limit - got);
    for (size_t i = 0; i < k; i += sizeof pattern) /* what recv() writes */
      memcpy(dst + i, pattern, k - i < sizeof pattern ? k - i : sizeof pattern);
    got += k;
  }
  if (got == h->nbytes) {
    int st;
    const char *body = crun__tcp_abort_body(h, text, &st);
    if (st >= 0 || strcmp(crun_err_name(st), "EUNKNOWN") == 0)
      FUZZ_FAIL("abort status %u became %d", h->status, st);
    if (body < text || body > text + kept) FUZZ_FAIL("abort body outside the text");
  }
  free(text);
}

static void describe(const crun__hdr_t *h) {
  char b[96];
  int n = crun__tcp_call_shape(b, sizeof b, h->dtype, h->count, h->op, h->root, h->algo & 1, h->algo & 2);
  if (n < 0) FUZZ_FAIL("call shape failed");
  if (strstr(b, "(null)")) FUZZ_FAIL("call shape '%s' (dtype %u op %u) prints a NULL name", b, h->dtype, h->op);
  if (!crun__coll_name(h->kind)) FUZZ_FAIL("no name for kind %u", h->kind);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in_t in = {data, size};
  while (in.left >= sizeof(crun__hdr_t)) {
    crun__hdr_t h;
    fuzz_take(&in, &h, sizeof h);
    char text[160];
    int garbled = crun__tcp_hdr_garbled(&h, GROUP, NULL, 0, 1, text, sizeof text);
    int long_abort = h.kind == CRUN__KIND_ABORT && h.nbytes > CRUN__ABORT_FRAME_MAX;
    if (garbled != (h.magic != CRUN__TCP_MAGIC || h.group != GROUP || long_abort)) FUZZ_FAIL("header check is wrong");
    if (garbled) {
      /* the mesh would stop here; check the rest as if the constants were right */
      h.magic = CRUN__TCP_MAGIC, h.group = GROUP;
    }
    if (h.kind == CRUN__KIND_ABORT) abort_frame(&h, in.p, in.left);
    else describe(&h);
  }
  return 0;
}
