/* common.h — what every per-element body needs, in C and in CUDA.
 *
 * The bodies in runtime/cuda/kernels/ are written once: nvcc compiles them
 * into the device kernels of runtime/cuda/ (.cu files), and the C compiler into the
 * host implementation of the same launch API (tests/gpu_double/launch_host.c)
 * and into the tests that hold them against the CPU kernels. CRUN_HD marks a
 * body: `__host__ __device__` under nvcc, a plain static inline in C. A body
 * touches one element (or one row) and nothing else: no allocation, no error
 * text; the launchers validate arguments first. */
#ifndef CRUN_CUDA_KERNELS_COMMON_H
#define CRUN_CUDA_KERNELS_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "crun/tensor.h"

#ifdef __CUDACC__
#define CRUN_HD static __host__ __device__ __forceinline__
#else
#define CRUN_HD static inline
#endif

/* A tensor's geometry for the strided bodies: element i of the row-major
 * walk over shape sits at offset sum(idx[d] * stride[d]) (stride 0 repeats
 * an element: broadcasting). */
typedef struct {
  int ndim;
  int64_t shape[CRUN_MAX_DIMS];
  int64_t stride[CRUN_MAX_DIMS];
} crun__kgeo_t;

/* Offset of element i (0 <= i < numel) of the walk over g's shape. */
CRUN_HD int64_t crun__k_offset(const crun__kgeo_t *g, int64_t i) {
  int64_t off = 0;
  for (int d = g->ndim - 1; d >= 0; d--) {
    int64_t s = g->shape[d];
    off += (i % s) * g->stride[d];
    i /= s;
  }
  return off;
}

/* The bits of a float and back (no aliasing tricks in either language). */
CRUN_HD uint32_t crun__k_f32_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

CRUN_HD float crun__k_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

/* float16 -> float32, exact (subnormals, inf and nan included). */
CRUN_HD float crun__k_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return crun__k_bits_f32(crun__k_f32_bits((float)m * 0x1p-24f) | sign);
  if (e == 31) return crun__k_bits_f32(sign | 0x7f800000u | (m << 13));
  return crun__k_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* float32 -> float16, round to nearest even; >= 65520 -> inf, nan stays quiet. */
CRUN_HD uint16_t crun__k_f32_to_f16(float f) {
  uint32_t x = crun__k_f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (x < 0x38800000u) { /* a float16 subnormal (or zero) */
    uint32_t shift = 126u - (x >> 23);
    if (shift > 24u) return sign;
    uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = x - 0x38000000u; /* rebias the exponent from 127 to 15 */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

CRUN_HD float crun__k_bf16_to_f32(uint16_t h) { return crun__k_bits_f32((uint32_t)h << 16); }

/* float32 -> bfloat16, round to nearest even; nan stays a quiet nan. */
CRUN_HD uint16_t crun__k_f32_to_bf16(float f) {
  uint32_t u = crun__k_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* Saturating, truncating double -> integer (nan -> 0), as the CPU's copy. */
CRUN_HD int64_t crun__k_sat_i64(double v, double lo, double hi) {
  if (v != v) return 0;
  if (v <= lo) return (int64_t)lo;
  if (v >= hi) return (int64_t)hi;
  return (int64_t)v;
}

CRUN_HD int crun__k_is_int(int dt) {
  return dt == CRUN_INT32 || dt == CRUN_INT64 || dt == CRUN_UINT8 || dt == CRUN_INT8 || dt == CRUN_INT16;
}

/* Element i of a dtype-dt buffer as a double (crun_elem_get_double). */
CRUN_HD double crun__k_get_f64(int dt, const void *p, int64_t i) {
  switch (dt) {
    case CRUN_FLOAT32: return ((const float *)p)[i];
    case CRUN_FLOAT64: return ((const double *)p)[i];
    case CRUN_FLOAT16: return crun__k_f16_to_f32(((const uint16_t *)p)[i]);
    case CRUN_BFLOAT16: return crun__k_bf16_to_f32(((const uint16_t *)p)[i]);
    case CRUN_INT32: return ((const int32_t *)p)[i];
    case CRUN_INT64: return (double)((const int64_t *)p)[i];
    case CRUN_UINT8: return ((const uint8_t *)p)[i];
    case CRUN_INT8: return ((const int8_t *)p)[i];
    case CRUN_INT16: return ((const int16_t *)p)[i];
    case CRUN_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
  }
}

/* Stores v as element i of dtype dt (crun_elem_set_double: saturating ints). */
CRUN_HD void crun__k_set_f64(int dt, void *p, int64_t i, double v) {
  switch (dt) {
    case CRUN_FLOAT32: ((float *)p)[i] = (float)v; break;
    case CRUN_FLOAT64: ((double *)p)[i] = v; break;
    case CRUN_FLOAT16: ((uint16_t *)p)[i] = crun__k_f32_to_f16((float)v); break;
    case CRUN_BFLOAT16: ((uint16_t *)p)[i] = crun__k_f32_to_bf16((float)v); break;
    case CRUN_INT32: ((int32_t *)p)[i] = (int32_t)crun__k_sat_i64(v, -2147483648.0, 2147483647.0); break;
    case CRUN_INT64: ((int64_t *)p)[i] = crun__k_sat_i64(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case CRUN_UINT8: ((uint8_t *)p)[i] = (uint8_t)crun__k_sat_i64(v, 0.0, 255.0); break;
    case CRUN_INT8: ((int8_t *)p)[i] = (int8_t)crun__k_sat_i64(v, -128.0, 127.0); break;
    case CRUN_INT16: ((int16_t *)p)[i] = (int16_t)crun__k_sat_i64(v, -32768.0, 32767.0); break;
    case CRUN_BOOL: ((uint8_t *)p)[i] = v != 0.0; break;
    default: break;
  }
}

/* Element i of an integer (or bool) buffer as int64 (crun__elem_get_int64). */
CRUN_HD int64_t crun__k_get_i64(int dt, const void *p, int64_t i) {
  switch (dt) {
    case CRUN_INT32: return ((const int32_t *)p)[i];
    case CRUN_INT64: return ((const int64_t *)p)[i];
    case CRUN_UINT8: return ((const uint8_t *)p)[i];
    case CRUN_INT8: return ((const int8_t *)p)[i];
    case CRUN_INT16: return ((const int16_t *)p)[i];
    case CRUN_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return crun__k_sat_i64(crun__k_get_f64(dt, p, i), -9223372036854775808.0, 9223372036854774784.0);
  }
}

/* Stores v wrapping like a C cast of the int64 (crun__elem_set_int64). */
CRUN_HD void crun__k_set_i64(int dt, void *p, int64_t i, int64_t v) {
  switch (dt) {
    case CRUN_INT32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case CRUN_INT64: ((int64_t *)p)[i] = v; break;
    case CRUN_UINT8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
    case CRUN_INT8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
    case CRUN_INT16: ((int16_t *)p)[i] = (int16_t)(uint16_t)(uint64_t)v; break;
    case CRUN_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    default: crun__k_set_f64(dt, p, i, (double)v); break;
  }
}

/* Element size of dt in bytes. */
CRUN_HD int crun__k_dtype_size(int dt) {
  switch (dt) {
    case CRUN_FLOAT64: case CRUN_INT64: return 8;
    case CRUN_FLOAT32: case CRUN_INT32: return 4;
    case CRUN_FLOAT16: case CRUN_BFLOAT16: case CRUN_INT16: return 2;
    default: return 1;
  }
}

/* Copies element si of src (dtype sdt) into element di of dst (dtype ddt)
 * with the CPU copy's rules: same dtype bit-exact, integer to integer through
 * int64 (wrapping), anything else through double (saturating). */
CRUN_HD void crun__k_cast(int ddt, void *dst, int64_t di, int sdt, const void *src, int64_t si) {
  if (ddt == sdt) {
    int es = crun__k_dtype_size(ddt);
    const unsigned char *s = (const unsigned char *)src + si * es;
    unsigned char *d = (unsigned char *)dst + di * es;
    for (int b = 0; b < es; b++) d[b] = s[b];
  } else if (crun__k_is_int(ddt) && crun__k_is_int(sdt)) {
    crun__k_set_i64(ddt, dst, di, crun__k_get_i64(sdt, src, si));
  } else {
    crun__k_set_f64(ddt, dst, di, crun__k_get_f64(sdt, src, si));
  }
}

#endif
