/* crc32c.h — CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used
 * by iSCSI (RFC 3720), ext4 and TensorBoard's event-file records. Debian has
 * no C library for it, so it lives here: the SSE4.2 crc32 instruction when
 * the CPU has it (checked at run time), a lookup table otherwise. */
#ifndef CRUN_CORE_CRC32C_H
#define CRUN_CORE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 for a new checksum; the result of an earlier call to
 * continue one) over n bytes of buf and returns it; crun__crc32c(0, "123456789", 9)
 * is 0xE3069283. Thread-safe; picks the fastest implementation the CPU runs. */
uint32_t crun__crc32c(uint32_t crc, const void *buf, size_t n);

/* The table implementation alone (same contract as crun__crc32c). */
uint32_t crun__crc32c_sw(uint32_t crc, const void *buf, size_t n);

/* The SSE4.2 implementation alone (same contract); call it only when
 * crun__crc32c_have_hw() is 1. */
uint32_t crun__crc32c_hw(uint32_t crc, const void *buf, size_t n);

/* 1 when this CPU has the SSE4.2 crc32 instruction (x86-64 only), else 0. */
int crun__crc32c_have_hw(void);

/* TensorBoard/LevelDB's masked form of a CRC stored next to the data it
 * covers: rotate right by 15 bits, then add 0xA282EAD8 (mod 2^32). */
static inline uint32_t crun__crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

#endif
