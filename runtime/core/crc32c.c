/* crc32c.c — CRC-32C: a byte-wise table (built once) and the SSE4.2 crc32
 * instruction, chosen at run time (crc32c.h). */
#include "core/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed */

static uint32_t crc32c_table[256];
static pthread_once_t crc32c_table_once = PTHREAD_ONCE_INIT;

/* Fills crc32c_table: entry b is the CRC register after shifting byte b out. */
static void crc32c_table_init(void) {
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    crc32c_table[b] = c;
  }
}

uint32_t crun__crc32c_sw(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&crc32c_table_once, crc32c_table_init);
  const unsigned char *p = buf;
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; i++) c = crc32c_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

int crun__crc32c_have_hw(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}

/* Bytes up to an 8-byte boundary, then 8 bytes per crc32q, then the tail. */
__attribute__((target("sse4.2"))) uint32_t crun__crc32c_hw(uint32_t crc, const void *buf, size_t n) {
  const unsigned char *p = buf;
  uint64_t c = ~crc;
  while (n > 0 && ((uintptr_t)p & 7) != 0) {
    c = _mm_crc32_u8((uint32_t)c, *p++);
    n--;
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  while (n-- > 0) c = _mm_crc32_u8((uint32_t)c, *p++);
  return ~(uint32_t)c;
}
#else
int crun__crc32c_have_hw(void) { return 0; }

uint32_t crun__crc32c_hw(uint32_t crc, const void *buf, size_t n) { return crun__crc32c_sw(crc, buf, n); }
#endif

static int crc32c_use_hw = -1; /* -1: not yet probed */

uint32_t crun__crc32c(uint32_t crc, const void *buf, size_t n) {
  int hw = __atomic_load_n(&crc32c_use_hw, __ATOMIC_RELAXED);
  if (hw < 0) {
    hw = crun__crc32c_have_hw();
    __atomic_store_n(&crc32c_use_hw, hw, __ATOMIC_RELAXED);
  }
  return hw ? crun__crc32c_hw(crc, buf, n) : crun__crc32c_sw(crc, buf, n);
}
