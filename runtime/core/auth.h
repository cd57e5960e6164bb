/* auth.h — the job's secret and the challenge-response that every store and
 * mesh connection of a job passes before anything else is read (internal).
 *
 * The secret is CRUN_TOKEN: crun-lua makes one per job (32 random bytes in
 * hex) and its workers inherit it; jobs started by mpirun, srun or by hand
 * are given one by the user. Any text works: it is hashed into a 32-byte key.
 * The secret never crosses the wire. Without CRUN_TOKEN, auth is off (a
 * store made by hand in one process tree, as torch's TCPStore has it);
 * then crun__peer_stranger keeps other users' processes on the host out.
 *
 * Exchange (acceptor A, connector C; MAC = HMAC-SHA-256 from libsodium):
 *   A -> C  greeting: "crunauth" + 32-byte nonce nA   ("crunopen" + zeros when A has no secret)
 *   C -> A  answer:   32-byte nonce nC + MAC(key, "C" ctx nA nC)
 *   A -> C  proof:    MAC(key, "A" ctx nC nA)
 * ctx names the service and the connection ("store", "mesh g/3->1"), so a
 * proof for one cannot be replayed for another; each side checks the other's
 * MAC in constant time, so a stranger can neither get in nor pose as the
 * server. */
#ifndef CRUN_CORE_AUTH_H
#define CRUN_CORE_AUTH_H

#include <stddef.h>

#define CRUN__AUTH_GREET 40
#define CRUN__AUTH_ANSWER 64
#define CRUN__AUTH_PROOF 32

typedef struct {
  int on;                 /* a secret is set */
  unsigned char key[32];
} crun__auth_t;

/* Sets a from the text token (NULL or "" turns auth off). Returns 0, or
 * CRUN_ESYS when libsodium cannot start. */
int crun__auth_init(crun__auth_t *a, const char *token);

/* crun__auth_init from CRUN_TOKEN. */
int crun__auth_from_env(crun__auth_t *a);

/* Writes 2*32 hex digits of fresh randomness + NUL into hex[65]. */
void crun__auth_new_token(char hex[65]);

/* Acceptor: writes the greeting into out and keeps its nonce in nonce. */
void crun__auth_greet(const crun__auth_t *a, unsigned char out[CRUN__AUTH_GREET], unsigned char nonce[32]);

/* Connector: checks the greeting against its own setting (EACCES naming
 * `peer` when one side has a secret and the other not) and writes the
 * answer; keeps what the acceptor's proof must be in want_proof. */
int crun__auth_answer(const crun__auth_t *a, const char *ctx, const char *peer,
                      const unsigned char greet[CRUN__AUTH_GREET], unsigned char out[CRUN__AUTH_ANSWER],
                      unsigned char want_proof[CRUN__AUTH_PROOF]);

/* Acceptor: checks the connector's answer; writes its proof. 0, or -1 when
 * the answer is not from a holder of the secret. */
int crun__auth_check_answer(const crun__auth_t *a, const char *ctx, const unsigned char nonce[32],
                            const unsigned char answer[CRUN__AUTH_ANSWER], unsigned char proof[CRUN__AUTH_PROOF]);

/* Acceptor without a secret: the greeting that refuses a connector it will
 * not serve (crun__peer_stranger); crun__auth_answer makes it EACCES. */
void crun__auth_deny(unsigned char out[CRUN__AUTH_GREET]);

/* Whether the other end of the connected socket fd is a process of another
 * user on this host (not this process's effective user, not root): such a
 * peer must not be served by, nor trusted as, an endpoint without a secret.
 * A unix socket's peer is known from SO_PEERCRED; a TCP peer's socket is
 * looked up on this host by its address and port (NETLINK_SOCK_DIAG, as
 * `ss -e` does; on one of this host's addresses, also as a socket bound to
 * each interface, which the kernel's lookup finds only when asked for that
 * interface), so a neighbour is caught on any local address, loopback or
 * not. A TCP peer not found on this host is remote: 0 (only a secret can
 * tell who it is), except on an address of this host (loopback or not),
 * where a peer that cannot be identified is refused. Writes the peer's uid
 * to *uid when known (else -1). Blocks for a few netlink round trips at
 * most (one per interface for a local peer bound to one). */
int crun__peer_stranger(int fd, long *uid);

/* Connector: 0 when the acceptor's proof matches, else EACCES naming peer. */
int crun__auth_check_proof(const unsigned char want[CRUN__AUTH_PROOF], const unsigned char got[CRUN__AUTH_PROOF],
                           const char *peer);

#endif
