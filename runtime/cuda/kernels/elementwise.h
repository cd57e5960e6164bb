/* elementwise.h — binary ops (with broadcasting through crun__kgeo_t
 * strides), unary ops and clamp, with the expressions of
 * runtime/tensor/elementwise.c: integers compute in their unsigned type
 * (wrapping), maximum/minimum propagate nan, comparisons give 0/1 bytes. */
#ifndef CRUN_CUDA_KERNELS_ELEMENTWISE_H
#define CRUN_CUDA_KERNELS_ELEMENTWISE_H

#include "cuda/kernels/common.h"

/* Non-zero when binary op `op` exists for dtype dt (the CPU's bin_table). */
CRUN_HD int crun__k_bin_supported(int dt, int op) {
  if (op < 0 || op >= CRUN_BINOP_COUNT) return 0;
  if (dt == CRUN_FLOAT32 || dt == CRUN_FLOAT64) return 1;
  if (!crun__k_is_int(dt)) return 0;
  return op != CRUN_BIN_DIV && op != CRUN_BIN_POW;
}

CRUN_HD int crun__k_bin_is_cmp(int op) { return op >= CRUN_BIN_EQ; }

/* x op y for a comparison op: 1 or 0. */
#define CRUN__K_CMP(tn, T)                                                     \
  CRUN_HD uint8_t crun__k_cmp_##tn(int op, T x, T y) {                         \
    switch (op) {                                                              \
      case CRUN_BIN_EQ: return x == y;                                         \
      case CRUN_BIN_NE: return x != y;                                         \
      case CRUN_BIN_LT: return x < y;                                          \
      case CRUN_BIN_LE: return x <= y;                                         \
      case CRUN_BIN_GT: return x > y;                                          \
      default: return x >= y;                                                  \
    }                                                                          \
  }

/* x op y for an arithmetic op of an integer type T computed in U. */
#define CRUN__K_ARITH_INT(tn, T, U)                                            \
  CRUN_HD T crun__k_arith_##tn(int op, T x, T y) {                             \
    switch (op) {                                                              \
      case CRUN_BIN_ADD: return (T)((U)x + (U)y);                              \
      case CRUN_BIN_SUB: return (T)((U)x - (U)y);                              \
      case CRUN_BIN_MUL: return (T)((U)x * (U)y);                              \
      case CRUN_BIN_MAXIMUM: return y > x ? y : x;                             \
      default: return y < x ? y : x;                                           \
    }                                                                          \
  }

/* The same for float types; POW is the float pow of the type. */
#define CRUN__K_ARITH_FLOAT(tn, T, POW)                                        \
  CRUN_HD T crun__k_arith_##tn(int op, T x, T y) {                             \
    switch (op) {                                                              \
      case CRUN_BIN_ADD: return x + y;                                         \
      case CRUN_BIN_SUB: return x - y;                                         \
      case CRUN_BIN_MUL: return x * y;                                         \
      case CRUN_BIN_DIV: return x / y;                                         \
      case CRUN_BIN_POW: return POW(x, y);                                     \
      case CRUN_BIN_MAXIMUM: return x != x ? x : (y > x || y != y) ? y : x;    \
      default: return x != x ? x : (y < x || y != y) ? y : x;                  \
    }                                                                          \
  }

CRUN__K_ARITH_FLOAT(f32, float, powf)
CRUN__K_ARITH_FLOAT(f64, double, pow)
CRUN__K_ARITH_INT(i32, int32_t, uint32_t)
CRUN__K_ARITH_INT(i64, int64_t, uint64_t)
CRUN__K_ARITH_INT(u8, uint8_t, unsigned)
CRUN__K_ARITH_INT(i8, int8_t, unsigned)
CRUN__K_ARITH_INT(i16, int16_t, unsigned)
CRUN__K_CMP(f32, float)
CRUN__K_CMP(f64, double)
CRUN__K_CMP(i32, int32_t)
CRUN__K_CMP(i64, int64_t)
CRUN__K_CMP(u8, uint8_t)
CRUN__K_CMP(i8, int8_t)
CRUN__K_CMP(i16, int16_t)

/* Element i of out = a op b: a and b are read through their (broadcast)
 * strides in ga / gb, out is contiguous (uint8 for comparisons). With
 * `reverse`, out = b op a (the scalar-first form). */
#define CRUN__K_BINARY(tn, T)                                                  \
  CRUN_HD void crun__k_binary_##tn(int op, void *out, const T *a, const crun__kgeo_t *ga, \
                                   const T *b, const crun__kgeo_t *gb, int64_t i, int reverse) { \
    T x = a[crun__k_offset(ga, i)], y = b[crun__k_offset(gb, i)];              \
    if (reverse) { T t = x; x = y; y = t; }                                    \
    if (crun__k_bin_is_cmp(op)) ((uint8_t *)out)[i] = crun__k_cmp_##tn(op, x, y); \
    else ((T *)out)[i] = crun__k_arith_##tn(op, x, y);                         \
  }
CRUN__K_BINARY(f32, float)
CRUN__K_BINARY(f64, double)
CRUN__K_BINARY(i32, int32_t)
CRUN__K_BINARY(i64, int64_t)
CRUN__K_BINARY(u8, uint8_t)
CRUN__K_BINARY(i8, int8_t)
CRUN__K_BINARY(i16, int16_t)

/* Unary op on a float (the CPU's U_* expressions; F is the type's suffix). */
#define CRUN__K_UNARY(tn, T, F)                                                \
  CRUN_HD T crun__k_unary_##tn(int op, T x) {                                  \
    switch (op) {                                                              \
      case CRUN_UN_NEG: return -x;                                             \
      case CRUN_UN_EXP: return exp##F(x);                                      \
      case CRUN_UN_LOG: return log##F(x);                                      \
      case CRUN_UN_TANH: return tanh##F(x);                                    \
      case CRUN_UN_SIGMOID: return (T)1 / ((T)1 + exp##F(-x));                 \
      case CRUN_UN_RELU: return x < 0 ? (T)0 : x;                              \
      case CRUN_UN_SQRT: return sqrt##F(x);                                    \
      case CRUN_UN_ABS: return fabs##F(x);                                     \
      case CRUN_UN_SIN: return sin##F(x);                                      \
      case CRUN_UN_COS: return cos##F(x);                                      \
      case CRUN_UN_FLOOR: return floor##F(x);                                  \
      case CRUN_UN_CEIL: return ceil##F(x);                                    \
      case CRUN_UN_ROUND: return nearbyint##F(x);                              \
      case CRUN_UN_SIGN: return x != x ? x : (T)((x > 0) - (x < 0));           \
      case CRUN_UN_RECIPROCAL: return (T)1 / x;                                \
      case CRUN_UN_SQUARE: return x * x;                                       \
      case CRUN_UN_LOG1P: return log1p##F(x);                                  \
      case CRUN_UN_EXPM1: return expm1##F(x);                                  \
      default: return (T)1 / sqrt##F(x);                                       \
    }                                                                          \
  }                                                                            \
  CRUN_HD T crun__k_clamp_##tn(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
CRUN__K_UNARY(f32, float, f)
CRUN__K_UNARY(f64, double, )

#endif
