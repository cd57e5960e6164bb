/* half.h — float16 / bfloat16 <-> float32 conversions (internal).
 * float32 -> 16-bit rounds to nearest even; inf and nan are kept (nan stays
 * a quiet nan), float16 subnormals are produced and read exactly. */
#ifndef CRUN_TENSOR_HALF_H
#define CRUN_TENSOR_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Returns the bits of f / the float with bits u. */
static inline uint32_t crun__f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float crun__bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Converts one float16 to float32 exactly (inf, nan and subnormals included). */
float crun__f16_to_f32(uint16_t h);

/* Rounds one float32 to the nearest float16 (ties to even; overflow -> inf). */
uint16_t crun__f32_to_f16(float f);

/* Converts one bfloat16 to float32 exactly. */
static inline float crun__bf16_to_f32(uint16_t h) { return crun__bits_f32((uint32_t)h << 16); }

/* Rounds one float32 to the nearest bfloat16 (ties to even; nan stays quiet nan). */
static inline uint16_t crun__f32_to_bf16(float f) {
  uint32_t u = crun__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Block conversions: n elements, src and dst must not overlap. */
void crun__f16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void crun__f32_to_f16_n(uint16_t *dst, const float *src, size_t n);
void crun__bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
void crun__f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);

#endif
