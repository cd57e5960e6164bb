/* map.c — crun dtypes and reduce ops to NCCL's, and NCCL errors to crun's.
 * Every crun dtype NCCL has maps to it; int16 and bool have no NCCL type:
 * they move as bytes, and bool reduces as uint8 with torch's meaning (sum
 * and max are "or" = max, product and min are "and" = min). int16 cannot be
 * reduced: ENOTSUP naming the op and the dtype, as for the bitwise ops. */
#include <stdio.h>

#include "backend/nccl/nccl_int.h"

static const struct {
  int nccl;   /* -1: none */
  int bytes;  /* moves as this many ncclUint8 per element when nccl < 0 */
} dtypes[CRUN_DTYPE_COUNT] = {
    [CRUN_FLOAT32] = {ncclFloat32, 0}, [CRUN_FLOAT64] = {ncclFloat64, 0},
    [CRUN_FLOAT16] = {ncclFloat16, 0}, [CRUN_BFLOAT16] = {ncclBfloat16, 0},
    [CRUN_INT32] = {ncclInt32, 0},     [CRUN_INT64] = {ncclInt64, 0},
    [CRUN_UINT8] = {ncclUint8, 0},     [CRUN_INT8] = {ncclInt8, 0},
    [CRUN_INT16] = {-1, 2},            [CRUN_BOOL] = {-1, 1},
};

int crun__nccl_dtype(crun_dtype_t dt, int reduces, crun_reduce_op_t op, ncclDataType_t *out, size_t *scale,
                     const char *desc, const crun_pg_t *pg) {
  if ((int)dt < 0 || dt >= CRUN_DTYPE_COUNT)
    return crun_error(CRUN_EINVAL, "%s on %s: bad dtype %d", desc, CRUN__WHO(pg, pg->rank), (int)dt);
  *scale = 1;
  if (dtypes[dt].nccl >= 0) {
    *out = (ncclDataType_t)dtypes[dt].nccl;
    return 0;
  }
  if (dt == CRUN_BOOL) { /* bytes 0/1: data moves and reduces as uint8 */
    *out = ncclUint8;
    return 0;
  }
  if (reduces)
    return crun_error(CRUN_ENOTSUP, "%s on %s: %s on %s is not supported by backend nccl (NCCL has no %s type)",
                      desc, CRUN__WHO(pg, pg->rank), crun_reduce_op_name(op), crun_dtype_name(dt), crun_dtype_name(dt));
  *out = ncclUint8;
  *scale = (size_t)dtypes[dt].bytes;
  return 0;
}

int crun__nccl_op(crun_dtype_t dt, crun_reduce_op_t op, ncclRedOp_t *out, const char *desc, const crun_pg_t *pg) {
  if (dt == CRUN_BOOL && (op == CRUN_OP_SUM || op == CRUN_OP_MAX)) { *out = ncclMax; return 0; }
  if (dt == CRUN_BOOL && (op == CRUN_OP_PRODUCT || op == CRUN_OP_MIN)) { *out = ncclMin; return 0; }
  switch (op) {
  case CRUN_OP_SUM: *out = ncclSum; return 0;
  case CRUN_OP_PRODUCT: *out = ncclProd; return 0;
  case CRUN_OP_MIN: *out = ncclMin; return 0;
  case CRUN_OP_MAX: *out = ncclMax; return 0;
  case CRUN_OP_AVG:
    if (dt == CRUN_BOOL) break;
    *out = ncclAvg;
    return 0;
  default: break;
  }
  return crun_error(CRUN_ENOTSUP, "%s on %s: reduce op %s on %s is not supported by backend nccl "
                    "(NCCL has sum, product, min, max, avg and premul_sum)", desc, CRUN__WHO(pg, pg->rank), crun_reduce_op_name(op),
                    crun_dtype_name(dt));
}

int crun__nccl_fail(ncclResult_t r, ncclComm_t comm, const char *desc, const crun_pg_t *pg, const char *call) {
  const char *last = ncclGetLastError(comm);
  int st = r == ncclInvalidArgument || r == ncclInvalidUsage ? CRUN_EINVAL : CRUN_EIO;
  return crun_error(st, "%s on %s: %s failed: %s%s%s", desc, CRUN__WHO(pg, pg->rank), call, ncclGetErrorString(r),
                    last && *last ? ": " : "", last && *last ? last : "");
}
