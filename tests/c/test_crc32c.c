/* test_crc32c.c — CRC-32C (core/crc32c.h): the published check value, the
 * RFC 3720 (iSCSI) B.4 vectors, on the table and on the SSE4.2 paths, the
 * two paths equal at every length and alignment, chaining, and the mask of
 * TensorBoard's record framing. */
#include "harness.h"

#include <stdint.h>

#include "core/crc32c.h"

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

/* The RFC 3720 B.4 inputs (32 zeros, 32 x 0xFF, 0..31, 31..0, an iSCSI
 * read PDU) with the CRCs the RFC lists (bytes there in little-endian order). */
static void check_vectors(crc_fn f) {
  unsigned char b[48];
  EXPECT_EQ_INT(f(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ_INT(f(0, "", 0), 0);
  memset(b, 0, 32);
  EXPECT_EQ_INT(f(0, b, 32), 0x8A9136AAu);
  memset(b, 0xFF, 32);
  EXPECT_EQ_INT(f(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
  EXPECT_EQ_INT(f(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
  EXPECT_EQ_INT(f(0, b, 32), 0x113FDB5Cu);
  static const unsigned char pdu[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
      0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ_INT(f(0, pdu, 48), 0xD9963A56u);
}

TEST(table_vectors) { check_vectors(crun__crc32c_sw); }

TEST(hw_vectors) {
  if (!crun__crc32c_have_hw()) {
    printf("  (no SSE4.2 crc32 on this CPU: hardware path not checked)\n");
    return;
  }
  check_vectors(crun__crc32c_hw);
}

TEST(dispatch_vectors) { check_vectors(crun__crc32c); }

/* Every length 0..300 at every start offset 0..15 (crossing the 8-byte
 * words of the hardware loop), both paths, and chained in two halves. */
TEST(paths_agree) {
  static unsigned char buf[320];
  uint32_t x = 2463534242u;
  for (size_t i = 0; i < sizeof buf; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    buf[i] = (unsigned char)x;
  }
  int hw = crun__crc32c_have_hw();
  for (size_t off = 0; off < 16; off++)
    for (size_t n = 0; n + off <= 300; n++) {
      uint32_t sw = crun__crc32c_sw(0, buf + off, n);
      if (hw) EXPECT_EQ_INT(crun__crc32c_hw(0, buf + off, n), sw);
      EXPECT_EQ_INT(crun__crc32c(0, buf + off, n), sw);
      size_t h = n / 3;
      EXPECT_EQ_INT(crun__crc32c(crun__crc32c(0, buf + off, h), buf + off + h, n - h), sw);
    }
}

/* The mask: rotate right 15, add 0xA282EAD8 (two values worked out with Python). */
TEST(mask) {
  EXPECT_EQ_INT(crun__crc32c_mask(0), 0xA282EAD8u);
  /* 0xE3069283 rotated right by 15 = 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5 */
  EXPECT_EQ_INT(crun__crc32c_mask(0xE3069283u), 0xC78AB0E5u);
}

#define CRUN_TESTS(X) X(table_vectors) X(hw_vectors) X(dispatch_vectors) X(paths_agree) X(mask)
CRUN_TEST_MAIN()
