/* auth_hello.c — fuzzes what a mesh or store connection reads before it is
 * trusted: the greeting, answer and proof of the challenge-response
 * (runtime/core/auth.c) and the mesh hello (runtime/transport/tcp_wire.c:
 * crun__tcp_hello_check), as tcp_client.c, tcp_server.c and tcp_mesh.c
 * call them. Input: a flags byte (which sides hold the secret), the token,
 * then the wire messages. Contract checks: a greeting is answered only when
 * it is one of the two greetings and matches this side's setting; no
 * answer or proof made without the secret is accepted; the real exchange
 * with the same secret always passes; an accepted hello names a higher,
 * unconnected rank of this group. */
#include "fuzz.h"
#include "core/auth.h"
#include "transport/tcp_priv.h"

static void fuzz_greeting(const crun__auth_t *a, const unsigned char greet[CRUN__AUTH_GREET]) {
  unsigned char answer[CRUN__AUTH_ANSWER], want[CRUN__AUTH_PROOF];
  int rc = crun__auth_answer(a, "store", "fuzz peer", greet, answer, want);
  int open = memcmp(greet, "crunopen", 8) == 0, authed = memcmp(greet, "crunauth", 8) == 0;
  if (rc == 0 && !((open && !a->on) || (authed && a->on)))
    FUZZ_FAIL("a greeting that does not match this side's secret setting was answered");
  if (rc != 0 && rc != CRUN_EPROTO && rc != CRUN_EACCES) FUZZ_FAIL("crun__auth_answer returned %d", rc);
  if (rc == 0 && open && a->on) FUZZ_FAIL("an open greeting was answered by a side with a secret");
}

static void fuzz_answer(const crun__auth_t *a, const unsigned char answer[CRUN__AUTH_ANSWER],
                        const unsigned char proof_in[CRUN__AUTH_PROOF]) {
  unsigned char greet[CRUN__AUTH_GREET], nonce[32], proof[CRUN__AUTH_PROOF];
  crun__auth_greet(a, greet, nonce);
  if (crun__auth_check_answer(a, "mesh 1234abcd 2->1 of 4", nonce, answer, proof) == 0 && a->on)
    FUZZ_FAIL("an answer forged from the input passed the acceptor's check");
  unsigned char want[CRUN__AUTH_PROOF];
  memset(want, 0x5a, sizeof want);
  int same = memcmp(want, proof_in, sizeof want) == 0;
  if ((crun__auth_check_proof(want, proof_in, "fuzz peer") == 0) != same)
    FUZZ_FAIL("crun__auth_check_proof disagrees with memcmp");
}

/* The whole exchange between two holders of the same secret passes. */
static void real_exchange(const crun__auth_t *a) {
  unsigned char greet[CRUN__AUTH_GREET], nonce[32], answer[CRUN__AUTH_ANSWER], want[CRUN__AUTH_PROOF],
      proof[CRUN__AUTH_PROOF];
  crun__auth_greet(a, greet, nonce);
  if (crun__auth_answer(a, "store", "fuzz peer", greet, answer, want) != 0 ||
      crun__auth_check_answer(a, "store", nonce, answer, proof) != 0 ||
      (a->on && crun__auth_check_proof(want, proof, "fuzz peer") != 0))
    FUZZ_FAIL("the exchange between two holders of the same secret failed: %s", crun_last_error());
}

static void fuzz_hello(fuzz_in_t *in) {
  crun__hello_t h;
  fuzz_take(in, &h, sizeof h);
  uint32_t group = 0x1234abcd;
  int size = 1 + fuzz_u8(in) % 64, rank = fuzz_u8(in) % size, fds[64];
  uint64_t connected = 0;
  fuzz_take(in, &connected, sizeof connected);
  for (int j = 0; j < size; j++) fds[j] = j == rank ? -1 : ((connected >> j) & 1) ? 100 + j : -1;
  if (fuzz_u8(in) & 1) h.magic = CRUN__TCP_HELLO, h.group = group; /* get past the constants */
  int rc = crun__tcp_hello_check(&h, group, rank, size, fds);
  if (rc == 0 && (h.magic != CRUN__TCP_HELLO || h.group != group || h.rank <= rank || h.rank >= size ||
                  h.size != size || fds[h.rank] >= 0))
    FUZZ_FAIL("hello of rank %d of %d accepted by rank %d of %d", h.rank, h.size, rank, size);
  if (rc != 0 && rc != CRUN_EPROTO) FUZZ_FAIL("crun__tcp_hello_check returned %d", rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_in_t in = {data, size};
  uint8_t flags = fuzz_u8(&in);
  char token[17];
  fuzz_take(&in, token, 16);
  token[16] = 0;
  crun__auth_t a;
  if (crun__auth_init(&a, (flags & 1) ? (token[0] ? token : "x") : NULL) != 0) return 0;
  unsigned char greet[CRUN__AUTH_GREET], answer[CRUN__AUTH_ANSWER], proof[CRUN__AUTH_PROOF];
  fuzz_take(&in, greet, sizeof greet);
  if (flags & 2) memcpy(greet, (flags & 4) ? "crunauth" : "crunopen", 8);
  fuzz_greeting(&a, greet);
  fuzz_take(&in, answer, sizeof answer);
  fuzz_take(&in, proof, sizeof proof);
  fuzz_answer(&a, answer, proof);
  if (flags & 8) real_exchange(&a);
  fuzz_hello(&in);
  return 0;
}
