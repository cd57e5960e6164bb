/*
 * crun.h — the whole public C API of libcrunrt.
 *
 * crun is torch.distributed rebuilt as a small C runtime: stores, process groups
 * with backends, collectives with async work handles, DDP bucketing and the
 * distributed sampler. Every fallible function returns a crun_status (0 ok, a
 * negative CRUN_E* code otherwise); the detail text of the last failure on the
 * calling thread is in crun_last_error().
 *
 * The API is split by area into crun/<area>.h so that each area can be read in
 * one sitting; include this header only.
 */
#ifndef CRUN_H
#define CRUN_H

#include "crun/core.h"
#include "crun/store.h"
#include "crun/tensor.h"
#include "crun/cuda.h"
#include "crun/pg.h"
#include "crun/train.h"

#endif /* CRUN_H */
