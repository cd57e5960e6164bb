/* auth.c — the job secret and its challenge-response (see auth.h). */
#include "core/auth.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "crun.h"

static const unsigned char GREET_AUTH[8] = {'c', 'r', 'u', 'n', 'a', 'u', 't', 'h'};
static const unsigned char GREET_OPEN[8] = {'c', 'r', 'u', 'n', 'o', 'p', 'e', 'n'};
static const unsigned char GREET_DENY[8] = {'c', 'r', 'u', 'n', 'd', 'e', 'n', 'y'};

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
  if (memcmp(greet, GREET_DENY, 8) == 0)
    return crun_error(CRUN_EACCES, "%s serves only its own user's processes on its host, and this one runs as "
                      "another user (uid %ld): without a secret nothing else tells a job's process from a "
                      "neighbour's; give both sides the same CRUN_TOKEN", peer, (long)geteuid());
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

void crun__auth_deny(unsigned char out[CRUN__AUTH_GREET]) {
  memset(out, 0, CRUN__AUTH_GREET);
  memcpy(out, GREET_DENY, 8);
}

/* Asks the kernel (NETLINK_SOCK_DIAG) for the uid of the TCP socket on this
 * host whose own end is src:sport and whose peer is dst:dport (addresses of
 * `family`, network order) and that is bound to interface `ifindex` (0:
 * none). 1 and *uid when found, 0 when there is none, -1 when the kernel
 * cannot be asked. */
static int diag_uid(int family, const void *src, uint16_t sport, const void *dst, uint16_t dport, unsigned ifindex,
                    long *uid) {
  struct {
    struct nlmsghdr nh;
    struct inet_diag_req_v2 r;
  } req;
  memset(&req, 0, sizeof req);
  req.nh.nlmsg_len = sizeof req;
  req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.nh.nlmsg_flags = NLM_F_REQUEST;
  req.r.sdiag_family = (uint8_t)family;
  req.r.sdiag_protocol = IPPROTO_TCP;
  req.r.idiag_states = ~0u;
  req.r.id.idiag_sport = sport;
  req.r.id.idiag_dport = dport;
  req.r.id.idiag_if = ifindex;
  memcpy(req.r.id.idiag_src, src, family == AF_INET ? 4 : 16);
  memcpy(req.r.id.idiag_dst, dst, family == AF_INET ? 4 : 16);
  req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return -1;
  struct timeval tv = {1, 0}; /* the kernel answers at once; never wait longer */
  setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  long buf[1024];
  ssize_t n = send(nl, &req, sizeof req, 0) == (ssize_t)sizeof req ? recv(nl, buf, sizeof buf, 0) : -1;
  close(nl);
  int found = -1;
  for (struct nlmsghdr *h = (struct nlmsghdr *)buf; n > 0 && NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      const struct nlmsgerr *e = NLMSG_DATA(h);
      found = e->error == -ENOENT ? 0 : -1;
      break;
    }
    if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
      const struct inet_diag_msg *m = NLMSG_DATA(h);
      *uid = (long)m->idiag_uid;
      found = 1;
      break;
    }
  }
  return found;
}

/* Whether addr (of family) is one of this host's own addresses: 1, 0, or
 * -1 when they cannot be listed. */
static int own_addr(int family, const void *addr) {
  struct ifaddrs *all;
  if (getifaddrs(&all) < 0) return -1;
  int hit = 0;
  for (const struct ifaddrs *i = all; i && !hit; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != family) continue;
    const void *a = family == AF_INET ? (const void *)&((const struct sockaddr_in *)i->ifa_addr)->sin_addr
                                      : (const void *)&((const struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
    hit = memcmp(a, addr, family == AF_INET ? 4 : 16) == 0;
  }
  freeifaddrs(all);
  return hit;
}

/* diag_uid for a socket bound to no interface, else, when src is one of
 * this host's addresses, to any: the kernel's lookup matches a socket bound
 * to an interface (SO_BINDTODEVICE, which any user may set) only when asked
 * for that interface, and a stranger must not hide so. *local: src is this
 * host's (a loopback address counts too). */
static int host_uid(int family, const void *src, uint16_t sport, const void *dst, uint16_t dport, long *uid,
                    int *local) {
  int r = diag_uid(family, src, sport, dst, dport, 0, uid);
  if (r != 0) return r;
  int own = own_addr(family, src);
  if (own < 0) return -1;
  *local |= own;
  if (!own) return 0;
  struct if_nameindex *ifs = if_nameindex();
  if (!ifs) return -1;
  for (const struct if_nameindex *i = ifs; r == 0 && i->if_index; i++)
    r = diag_uid(family, src, sport, dst, dport, i->if_index, uid);
  if_freenameindex(ifs);
  return r;
}

/* The uid of the TCP peer of fd on this host (see crun__peer_stranger):
 * 1 found, 0 not on this host, -1 unknown; *loop: the peer's address is
 * this host's (a loopback one, or one of its interfaces'). An IPv4 peer of
 * an IPv6 socket (::ffff:a.b.c.d) is looked up as the IPv4 socket it is,
 * then as an IPv6 one. */
static int tcp_peer_uid(int fd, long *uid, int *loop) {
  struct sockaddr_storage me, peer;
  socklen_t ml = sizeof me, pl = sizeof peer;
  if (getsockname(fd, (struct sockaddr *)&me, &ml) < 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) < 0)
    return -1;
  if (peer.ss_family == AF_INET) {
    const struct sockaddr_in *p = (const void *)&peer, *m = (const void *)&me;
    *loop = (ntohl(p->sin_addr.s_addr) >> 24) == 127;
    return host_uid(AF_INET, &p->sin_addr, p->sin_port, &m->sin_addr, m->sin_port, uid, loop);
  }
  if (peer.ss_family != AF_INET6) return -1;
  const struct sockaddr_in6 *p = (const void *)&peer, *m = (const void *)&me;
  int mapped = IN6_IS_ADDR_V4MAPPED(&p->sin6_addr) && IN6_IS_ADDR_V4MAPPED(&m->sin6_addr);
  *loop = IN6_IS_ADDR_LOOPBACK(&p->sin6_addr) || (mapped && p->sin6_addr.s6_addr[12] == 127);
  int r = mapped ? host_uid(AF_INET, p->sin6_addr.s6_addr + 12, p->sin6_port, m->sin6_addr.s6_addr + 12,
                            m->sin6_port, uid, loop) : 0;
  return r != 0 ? r : host_uid(AF_INET6, &p->sin6_addr, p->sin6_port, &m->sin6_addr, m->sin6_port, uid, loop);
}

int crun__peer_stranger(int fd, long *uid) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int loop = 0, found;
  *uid = -1;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) return 1;
  if (ss.ss_family == AF_UNIX) {
    struct ucred cred;
    socklen_t cl = sizeof cred;
    found = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 ? 1 : -1;
    if (found == 1) *uid = (long)cred.uid;
  } else {
    found = tcp_peer_uid(fd, uid, &loop);
  }
  if (found == 1) return !(*uid == (long)geteuid() || *uid == 0);
  if (found < 0 && ss.ss_family != AF_UNIX) {
    static _Atomic int warned; /* no sock_diag here (a seccomp filter?): served as before, unchecked */
    if (!atomic_exchange(&warned, 1))
      CRUN_LOG(WARN, NET, "cannot ask the kernel who owns a TCP peer (NETLINK_SOCK_DIAG: %s): endpoints "
               "without a secret cannot tell this host's other users from the job; set CRUN_TOKEN", strerror(errno));
    return 0;
  }
  return found < 0 || loop; /* SO_PEERCRED failed, or a peer of this host's that is nowhere: refused */
}
