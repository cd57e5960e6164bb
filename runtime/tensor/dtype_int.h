/* dtype_int.h — crun_dtype_size inline, for the runtime's hot paths (a
 * small collective asks it four times: ~40 instructions as calls). */
#ifndef CRUN_DTYPE_INT_H
#define CRUN_DTYPE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "crun.h"

static inline size_t crun__dtype_size(crun_dtype_t dt) {
  static const uint8_t sizes[CRUN_DTYPE_COUNT] = {
#define CRUN_X_SZ(NAME, name, size) [CRUN_##NAME] = size,
      CRUN_DTYPE_MAP(CRUN_X_SZ)
#undef CRUN_X_SZ
  };
  return (unsigned)dt < CRUN_DTYPE_COUNT ? sizes[dt] : 0;
}

#endif
