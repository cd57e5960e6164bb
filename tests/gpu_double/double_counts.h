/* double_counts.h — how often the CUDA runtime double (cudart_double.c) was
 * asked for the calls that cost a real GPU dearly on a collective's path:
 * a steady-state call should make none of them (tests/gpu_double/c); and
 * how often the NCCL double was entered for an operation. */
#ifndef CRUN_DOUBLE_COUNTS_H
#define CRUN_DOUBLE_COUNTS_H

#define CRUN_DBL_COUNTED(X)                                                             \
  X(MALLOC, "cudaMallocAsync/cudaHostAlloc") X(FREE, "cudaFreeAsync/cudaFreeHost")     \
  X(EVENT_CREATE, "cudaEventCreate") X(EVENT_DESTROY, "cudaEventDestroy")              \
  X(STREAM_CREATE, "cudaStreamCreate") X(HOST_SYNC, "a host wait (cudaStreamSynchronize, " \
  "cudaEventSynchronize, cudaDeviceSynchronize)") X(NCCL_OP, "an NCCL operation or group (nccl_double.c)")

typedef enum {
#define CRUN_DBL_X(name, text) CRUN_DBL_##name,
  CRUN_DBL_COUNTED(CRUN_DBL_X)
#undef CRUN_DBL_X
  CRUN_DBL_NCOUNTED
} crun_dbl_counted_t;

/* Calls of kind k made by this process so far (every thread). */
long crun_dbl_count(crun_dbl_counted_t k);
/* Counts one call of kind k (the NCCL double's). */
void crun_dbl_count_add(crun_dbl_counted_t k);
/* What kind k counts, for a test's message. */
const char *crun_dbl_count_name(crun_dbl_counted_t k);

/* cudaStreamSynchronize, not counted: the NCCL double's wait for the work
 * before an operation, which stands for the device's own ordering. */
#include <cuda_runtime_api.h>
cudaError_t crun_dbl_stream_sync(cudaStream_t st);

#endif
