/* auth.c — the job secret and its challenge-response (see auth.h). */
#include "core/auth.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "crun.h"

static const unsigned char GREET_AUTH[8] = {'c', 'r', 'u', 'n', 'a', 'u', 't', 'h'};
static const unsigned char GREET_OPEN[8] = {'c', 'r', 'u', 'n', 'o', 'p', 'e', 'n'};

int crun__auth_init(crun__auth_t *a, const char *token) {
  memset(a, 0, sizeof *a);
  if (sodium_init() < 0) return crun_error(CRUN_ESYS, "auth: libsodium failed to start");
  if (!token || !*token) return 0;
  crypto_hash_sha256(a->key, (const unsigned char *)token, strlen(token));
  a->on = 1;
  return 0;
}

int crun__auth_from_env(crun__auth_t *a) { return crun__auth_init(a, getenv("CRUN_TOKEN")); }

void crun__auth_new_token(char hex[65]) {
  unsigned char raw[32];
  if (sodium_init() < 0) abort(); /* no randomness: never run without a secret */
  randombytes_buf(raw, sizeof raw);
  sodium_bin2hex(hex, 65, raw, sizeof raw);
  sodium_memzero(raw, sizeof raw);
}

/* MAC(key, role ctx x y) into out. */
static void mac(const crun__auth_t *a, char role, const char *ctx, const unsigned char x[32],
                const unsigned char y[32], unsigned char out[32]) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, a->key, sizeof a->key);
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)&role, 1);
  crypto_auth_hmacsha256_update(&st, (const unsigned char *)ctx, strlen(ctx) + 1);
  crypto_auth_hmacsha256_update(&st, x, 32);
  crypto_auth_hmacsha256_update(&st, y, 32);
  crypto_auth_hmacsha256_final(&st, out);
}

void crun__auth_greet(const crun__auth_t *a, unsigned char out[CRUN__AUTH_GREET], unsigned char nonce[32]) {
  memset(out, 0, CRUN__AUTH_GREET);
  if (!a->on) {
    memcpy(out, GREET_OPEN, 8);
    memset(nonce, 0, 32);
    return;
  }
  randombytes_buf(nonce, 32);
  memcpy(out, GREET_AUTH, 8);
  memcpy(out + 8, nonce, 32);
}

int crun__auth_answer(const crun__auth_t *a, const char *ctx, const char *peer,
                      const unsigned char greet[CRUN__AUTH_GREET], unsigned char out[CRUN__AUTH_ANSWER],
                      unsigned char want_proof[CRUN__AUTH_PROOF]) {
  int open = memcmp(greet, GREET_OPEN, 8) == 0, authed = memcmp(greet, GREET_AUTH, 8) == 0;
  if (!open && !authed)
    return crun_error(CRUN_EPROTO, "%s did not greet as a crun endpoint (not a crun server, or another protocol)", peer);
  if (authed && !a->on)
    return crun_error(CRUN_EACCES, "%s requires the job's secret: set CRUN_TOKEN as the job has it "
                      "(crun-lua sets it for its workers)", peer);
  if (open && a->on)
    return crun_error(CRUN_EACCES, "%s does not know the job's secret (CRUN_TOKEN is set here, not there): "
                      "refusing to talk to it", peer);
  memset(out, 0, CRUN__AUTH_ANSWER);
  if (open) return 0;
  randombytes_buf(out, 32);
  mac(a, 'C', ctx, greet + 8, out, out + 32);
  mac(a, 'A', ctx, out, greet + 8, want_proof);
  return 0;
}

int crun__auth_check_answer(const crun__auth_t *a, const char *ctx, const unsigned char nonce[32],
                            const unsigned char answer[CRUN__AUTH_ANSWER], unsigned char proof[CRUN__AUTH_PROOF]) {
  if (!a->on) return 0;
  unsigned char want[32];
  mac(a, 'C', ctx, nonce, answer, want);
  if (crypto_verify_32(want, answer + 32) != 0) return -1;
  mac(a, 'A', ctx, answer, nonce, proof);
  return 0;
}

int crun__auth_check_proof(const unsigned char want[CRUN__AUTH_PROOF], const unsigned char got[CRUN__AUTH_PROOF],
                           const char *peer) {
  if (crypto_verify_32(want, got) != 0)
    return crun_error(CRUN_EACCES, "%s answered without the job's secret (a different CRUN_TOKEN, or not the job's server)",
                      peer);
  return 0;
}
