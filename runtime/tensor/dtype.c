/* dtype.c — dtype names and sizes, and the float16/bfloat16 conversions. */
#include "crun.h"
#include "tensor/half.h"

#include <pthread.h>
#include <string.h>

size_t crun_dtype_size(crun_dtype_t dt) {
  switch (dt) {
#define CRUN_X_SZ(NAME, name, size) case CRUN_##NAME: return size;
    CRUN_DTYPE_MAP(CRUN_X_SZ)
#undef CRUN_X_SZ
    default: return 0;
  }
}

const char *crun_dtype_name(crun_dtype_t dt) {
  switch (dt) {
#define CRUN_X_NM(NAME, name, size) case CRUN_##NAME: return #name;
    CRUN_DTYPE_MAP(CRUN_X_NM)
#undef CRUN_X_NM
    default: return NULL;
  }
}

/* Aliases accepted besides the canonical names (torch's short names). */
static const struct { const char *alias; crun_dtype_t dt; } dtype_aliases[] = {
    {"float", CRUN_FLOAT32},  {"double", CRUN_FLOAT64}, {"half", CRUN_FLOAT16},
    {"bf16", CRUN_BFLOAT16},  {"int", CRUN_INT32},      {"long", CRUN_INT64},
    {"byte", CRUN_UINT8},     {"fp32", CRUN_FLOAT32},   {"fp64", CRUN_FLOAT64},
    {"fp16", CRUN_FLOAT16},   {"short", CRUN_INT16},    {"char", CRUN_INT8},
};

int crun_dtype_parse(const char *name, crun_dtype_t *out) {
  if (!name) return crun_error(CRUN_EINVAL, "dtype name is NULL");
  if (strncmp(name, "torch.", 6) == 0) name += 6;
  for (int i = 0; i < CRUN_DTYPE_COUNT; i++) {
    if (strcmp(name, crun_dtype_name((crun_dtype_t)i)) == 0) {
      *out = (crun_dtype_t)i;
      return 0;
    }
  }
  for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++) {
    if (strcmp(name, dtype_aliases[i].alias) == 0) {
      *out = dtype_aliases[i].dt;
      return 0;
    }
  }
  return crun_error(CRUN_EINVAL, "unknown dtype '%s' (expected float32, float64, float16, "
                    "bfloat16, int32, int64, uint8, int8, int16 or bool)", name);
}

int crun_dtype_is_integer(crun_dtype_t dt) {
  return dt == CRUN_INT32 || dt == CRUN_INT64 || dt == CRUN_UINT8 || dt == CRUN_INT8 ||
         dt == CRUN_INT16;
}

void crun_dtype_int_range(crun_dtype_t dt, int64_t *lo, int64_t *hi) {
  switch (dt) {
    case CRUN_INT8: *lo = INT8_MIN, *hi = INT8_MAX; break;
    case CRUN_UINT8: *lo = 0, *hi = UINT8_MAX; break;
    case CRUN_INT16: *lo = INT16_MIN, *hi = INT16_MAX; break;
    case CRUN_INT32: *lo = INT32_MIN, *hi = INT32_MAX; break;
    default: *lo = INT64_MIN, *hi = INT64_MAX; break;
  }
}

/* ------------------------------------------------------------ float16 */

float crun__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 0x1p-24f; /* exact: subnormal or zero */
    return crun__bits_f32(crun__f32_bits(v) | sign);
  }
  if (e == 31) return crun__bits_f32(sign | 0x7f800000u | (m << 13));
  return crun__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t crun__f32_to_f16(float f) {
  uint32_t x = crun__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu);
  if (x >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 rounds to inf */
  if (x < 0x38800000u) {                        /* below 2^-14: subnormal */
    uint32_t shift = 126u - (x >> 23);
    if (shift > 24u) return sign;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
  }
  x += 0xfffu + ((x >> 13) & 1u);
  return sign | (uint16_t)((x - (112u << 23)) >> 13);
}

static float f16_table[65536];
static pthread_once_t f16_table_once = PTHREAD_ONCE_INIT;

static void f16_table_init(void) {
  for (uint32_t i = 0; i < 65536u; i++) f16_table[i] = crun__f16_to_f32((uint16_t)i);
}

void crun__f16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
  pthread_once(&f16_table_once, f16_table_init);
  for (size_t i = 0; i < n; i++) dst[i] = f16_table[src[i]];
}

void crun__f32_to_f16_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = crun__f32_to_f16(src[i]);
}

void crun__bf16_to_f32_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = crun__bf16_to_f32(src[i]);
}

void crun__f32_to_bf16_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = crun__f32_to_bf16(src[i]);
}
