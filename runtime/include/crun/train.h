/* crun/train.h — the hot loops of crun.nn and crun.optim: fused layer
 * kernels (Linear through BLAS, activations, log-softmax, losses, dropout)
 * and optimizer updates with torch's update rules.
 *
 * Every kernel takes float32 or float64 tensors that are contiguous and share
 * one dtype (index tensors: int32 or int64, 1-based class labels); outputs
 * are caller-allocated with the right shape. A mismatch fails with
 * CRUN_EINVAL naming the argument and both shapes/dtypes. None blocks. */
#ifndef CRUN_TRAIN_H
#define CRUN_TRAIN_H

#include <stdint.h>

#include "crun/pg.h"
#include "crun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x W^T (+ b): x [N, in], W [out, in], b [out] or NULL, y [N, out]. */
int crun_nn_linear_forward(const crun_tensor_t *x, const crun_tensor_t *w,
                           const crun_tensor_t *b, crun_tensor_t *y);

/* Backward of y = x W^T + b for grad gy [N, out]: gx = gy W (overwritten;
 * skipped when NULL), gw += gy^T x and gb += sum over rows of gy (both
 * accumulate, as Torch7's accGradParameters; gb may be NULL). */
int crun_nn_linear_backward(const crun_tensor_t *x, const crun_tensor_t *w,
                            const crun_tensor_t *gy, crun_tensor_t *gx,
                            crun_tensor_t *gw, crun_tensor_t *gb);

/* Sets how many threads BLAS (OpenBLAS) may use in this process; n <= 0
 * picks online cores / LOCAL_WORLD_SIZE (at least 1), so that ranks sharing
 * a host do not oversubscribe it, unless OPENBLAS_NUM_THREADS or
 * OMP_NUM_THREADS is set (by the user: crun-lua's default OMP_NUM_THREADS=1,
 * marked CRUN_OMP_DEFAULTED=1, does not count). Returns the number now in use. */
int crun_blas_set_threads(int n);

typedef enum { CRUN_ACT_RELU, CRUN_ACT_TANH, CRUN_ACT_SIGMOID } crun_act_t;

/* Parses "relu", "tanh", "sigmoid"; CRUN_EINVAL otherwise. */
int crun_act_parse(const char *name, crun_act_t *out);

/* y = act(x) element-wise; y may be x (in place). */
int crun_nn_act_forward(crun_act_t act, const crun_tensor_t *x, crun_tensor_t *y);

/* gx = gy * act'(x), computed from the forward output y; gx may be gy. */
int crun_nn_act_backward(crun_act_t act, const crun_tensor_t *y,
                         const crun_tensor_t *gy, crun_tensor_t *gx);

/* Row-wise log-softmax of x [N, C] into y (numerically stable); y may be x. */
int crun_nn_log_softmax_forward(const crun_tensor_t *x, crun_tensor_t *y);

/* gx = gy - exp(y) * rowsum(gy) for y = log_softmax(x); gx may be gy. */
int crun_nn_log_softmax_backward(const crun_tensor_t *y, const crun_tensor_t *gy,
                                 crun_tensor_t *gx);

/* Cross entropy of logits [N, C] against 1-based labels [N] (int32/int64):
 * *loss = mean over rows of -log softmax(x)[label] (sum when `sum` != 0),
 * *correct = rows whose argmax equals the label; grad (NULL to skip) gets
 * d loss / d logits. A label outside 1..C fails with CRUN_ERANGE. No rows:
 * *loss = nan for the mean (0/0, as torch's), 0 for the sum. */
int crun_nn_cross_entropy(const crun_tensor_t *x, const crun_tensor_t *labels, int sum,
                          double *loss, int64_t *correct, crun_tensor_t *grad);

/* Cross entropy with reduction "none": losses (a contiguous [N] tensor of
 * x's dtype) gets each row's -log softmax(x)[label], grad (NULL to skip)
 * each row's own gradient softmax - onehot, *correct as crun_nn_cross_entropy,
 * all in one pass. Host tensors only (CRUN_ENOTSUP on a device). */
int crun_nn_cross_entropy_rows(const crun_tensor_t *x, const crun_tensor_t *labels, crun_tensor_t *losses,
                               int64_t *correct, crun_tensor_t *grad);

/* ClassNLLCriterion: *loss = -mean over rows of x[i, label_i] (x holds
 * log-probabilities [N, C], labels as cross entropy's); grad (nullable) gets
 * -1/N at each row's label and 0 elsewhere. No rows: *loss = nan. */
int crun_nn_nll(const crun_tensor_t *x, const crun_tensor_t *labels, double *loss, crun_tensor_t *grad);

/* Mean squared error: *loss = mean((x - t)^2); grad (NULL to skip) gets
 * 2 (x - t) / numel. No elements: *loss = nan, as torch's. */
int crun_nn_mse(const crun_tensor_t *x, const crun_tensor_t *t, double *loss,
                crun_tensor_t *grad);

/* Inverted dropout: mask[i] = 0 with probability p else 1 / (1 - p), drawn
 * from the splitmix64 stream *state (advanced); y = x * mask. 0 <= p < 1. */
int crun_nn_dropout_forward(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *mask,
                            double p, uint64_t *state);

/* y = a * b element-wise (same numel); y may alias a or b. */
int crun_nn_mul(const crun_tensor_t *a, const crun_tensor_t *b, crun_tensor_t *y);

/* torch.optim.SGD for one parameter: d = g + wd p; with momentum, buf = d on
 * the first step (first != 0) else buf = momentum buf + (1 - dampening) d, and
 * d = nesterov ? d + momentum buf : buf; then p -= lr d. buf may be NULL
 * when momentum == 0. */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  int nesterov, maximize;
} crun_sgd_opts_t;
int crun_optim_sgd_update(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *buf,
                          const crun_sgd_opts_t *o, int first);

/* torch.optim.Adam / AdamW for one parameter at 1-based step `step`:
 * Adam adds wd p to the gradient, AdamW (decoupled != 0) multiplies p by
 * (1 - lr wd); m, v are the moment buffers, vmax the amsgrad buffer (NULL
 * unless amsgrad). */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  int decoupled, amsgrad, maximize;
} crun_adam_opts_t;
int crun_optim_adam_update(crun_tensor_t *p, const crun_tensor_t *g, crun_tensor_t *m,
                           crun_tensor_t *v, crun_tensor_t *vmax, int64_t step,
                           const crun_adam_opts_t *o);


/* ---- DistributedSampler index math (torch.utils.data.DistributedSampler).
 * Indices are 0-based. num_samples = ceil(size / R), or with drop_last and
 * size % R != 0, ceil((size - R) / R) (at least 0); total_size = num_samples
 * * R. The global order (0..size-1, or a shuffled permutation of it from
 * seed + epoch) is padded by wrap-around (repeated as often as needed) or,
 * with drop_last, truncated to total_size; rank r takes positions r, r + R,
 * ... With drop_padding != 0 (set the field after init) the padded
 * duplicates are omitted, so every sample is seen exactly once over all
 * ranks. The shuffle is a Fisher-Yates permutation driven by splitmix64
 * (j = (x >> 11) % (i + 1), from the last position down), identical on
 * every rank and to lua/crun/data.lua's.
 * Resuming an epoch: crun_sampler_resume(s, start) says the first `start`
 * positions of the epoch's global order were consumed (by any number of
 * ranks); the positions start..size-1 then take the place of the whole order
 * above (num_samples, padding and striding over size - start), so a job that
 * restarts at another world size sees each remaining sample once. */
typedef struct {
  int64_t size, num_samples, total_size, epoch;
  int64_t start;            /* global positions of the epoch already consumed */
  uint64_t seed;
  int num_replicas, rank, shuffle, drop_last, drop_padding;
} crun_sampler_t;

/* Fills *s; size < 0 or above 2^62, num_replicas < 1 or rank outside [0, num_replicas)
 * fail with CRUN_EINVAL naming the value. */
int crun_sampler_init(crun_sampler_t *s, int64_t size, int num_replicas, int rank,
                      int shuffle, uint64_t seed, int drop_last);

/* Resumes the epoch after its first `start` global positions (0..size);
 * recomputes num_samples and total_size. CRUN_EINVAL outside that range. */
int crun_sampler_resume(crun_sampler_t *s, int64_t start);

/* Number of indices this rank gets per epoch (num_samples, or fewer with
 * drop_padding). */
int64_t crun_sampler_len(const crun_sampler_t *s);

/* Writes this rank's indices of `epoch` (>= 0) into out (room for
 * crun_sampler_len(s)) and their count into *n. */
int crun_sampler_indices(const crun_sampler_t *s, int64_t epoch, int64_t *out, int64_t *n);

/* Writes the permutation of 0..n-1 for `seed` (the sampler's shuffle). */
void crun_permutation(int64_t n, uint64_t seed, int64_t *out);


/* ---- DDP gradient reducer (torch's Reducer). Gradients (contiguous
 * float32/float64/float16/bfloat16 tensors, in registration order) are
 * grouped into flat buckets in REVERSE registration order (the order
 * backward produces them): the first bucket holds at most first_bucket_bytes,
 * the others bucket_cap_bytes (a gradient larger than the cap gets a bucket
 * of its own), and a dtype change closes the bucket. mark_ready(i) copies
 * gradient i into its bucket (no copy with grad_as_view: the gradients are
 * views of the buckets) and, with overlap, launches the async all_reduce
 * (average over the group) of every complete bucket in bucket order, so
 * every rank launches them in the same order. finalize marks the gradients
 * still unready as ready (their current values count), launches what is
 * left, waits for each bucket in order and copies the averages back into
 * the gradients, then resets for the next iteration. */
typedef struct crun_reducer crun_reducer_t;

typedef struct {
  size_t bucket_cap_bytes;   /* 0: 25 MiB */
  size_t first_bucket_bytes; /* 0: 1 MiB */
  int grad_as_view;          /* gradients become views of the buckets */
  int no_overlap;            /* launch every all_reduce only in finalize */
  int external;              /* comm hook: launch nothing; the caller takes
                                ready buckets (next_ready) and ends the
                                iteration with finish */
} crun_reducer_opts_t;

/* Builds the reducer over grads[0..n-1] (references taken) on pg (retained;
 * NULL only for planning: bucket layout queries work, communication fails
 * with CRUN_ESTATE). With grad_as_view the buckets start with the gradients'
 * values. A bad dtype or a non-contiguous gradient fails with CRUN_EINVAL
 * naming its index. */
int crun_reducer_new(crun_pg_t *pg, crun_tensor_t *const *grads, int n,
                     const crun_reducer_opts_t *opts, crun_reducer_t **out);

/* Waits for (or drops) outstanding all_reduces and frees r (NULL is fine). */
void crun_reducer_free(crun_reducer_t *r);

/* Number of buckets; bucket b's flat tensor (borrowed), its gradient count
 * and entry k (0-based gradient index and element offset in the bucket). */
int crun_reducer_num_buckets(const crun_reducer_t *r);
crun_tensor_t *crun_reducer_bucket(const crun_reducer_t *r, int b);
int crun_reducer_bucket_size(const crun_reducer_t *r, int b);
int crun_reducer_bucket_entry(const crun_reducer_t *r, int b, int k, int *grad, int64_t *offset);

/* *view = a new tensor shaped like gradient i over its slice of the bucket
 * (release it). With grad_as_view it is the gradient the reducer reduces. */
int crun_reducer_bucket_view(crun_reducer_t *r, int i, crun_tensor_t **view);

/* Gradient i is final for this iteration. Marking it twice before finalize
 * fails with CRUN_ESTATE naming it; an out-of-range i with CRUN_EINVAL. */
int crun_reducer_mark_ready(crun_reducer_t *r, int i);

/* Completes the iteration (see above); timeout in s (<= 0: the group's)
 * bounds each wait. On failure every outstanding all_reduce is dropped and
 * the reducer is reset (the gradients are then unspecified). */
int crun_reducer_finalize(crun_reducer_t *r, double timeout);

/* Abandons the current iteration (e.g. backward failed): waits for the
 * all_reduces already launched (bounded by their own deadlines) and clears
 * readiness. */
void crun_reducer_reset(crun_reducer_t *r);

/* Join: a rank without inputs mirrors one iteration of the ranks still
 * training: every bucket is zeroed and all-reduced (averaged) in order. */
int crun_reducer_shadow(crun_reducer_t *r, double timeout);

/* Buckets launched in the current iteration so far (for tests/tracing). */
int crun_reducer_launched(const crun_reducer_t *r);

/* External mode (opts.external, DDP communication hooks). next_ready takes
 * the next bucket, in launch order, whose gradients are all ready and
 * returns its index (-1: none yet); the caller reduces the bucket's tensor
 * itself. mark_rest marks every gradient still unready as ready (its
 * current value counts), as finalize does. finish copies every bucket back
 * into its gradients (nothing to copy with grad_as_view) and resets for the
 * next iteration; a bucket not taken yet fails it with CRUN_ESTATE naming
 * the bucket (the reducer is reset). Neither blocks. In external mode
 * finalize and shadow fail with CRUN_ESTATE. */
int crun_reducer_next_ready(crun_reducer_t *r);
int crun_reducer_mark_rest(crun_reducer_t *r);
int crun_reducer_finish(crun_reducer_t *r);

/* ---- ZeroRedundancyOptimizer partition (torch.distributed.optim's rule).
 * Parameter i has numel[i] >= 0 elements. */

/* Assigns every parameter to a rank, as torch does: parameters sorted by
 * size, largest first (ties keep index order), each to the rank with the
 * fewest elements so far (the lowest rank on ties). Writes owner[0..n-1]
 * (0-based ranks) and, if rank_numel is not NULL, each rank's total element
 * count into rank_numel[0..world-1]. Does not block. Bad sizes fail with
 * CRUN_EINVAL, a total past INT64_MAX with CRUN_ERANGE. */
int crun_zero_assign(const int64_t *numel, int n, int world, int *owner, int64_t *rank_numel);

/* The flat-buffer layout of a partition: parameters with the same owner
 * and key (e.g. a dtype index in [0, nkeys); key NULL means all 0) share one
 * flat buffer, in index order. Writes each parameter's element offset in
 * its buffer into offset[i] and, if bucket_numel is not NULL, the length of
 * buffer (rank r, key k) into bucket_numel[r * nkeys + k]. An owner or key
 * out of range fails with CRUN_EINVAL naming the parameter, an overflowing
 * length with CRUN_ERANGE. */
int crun_zero_offsets(const int64_t *numel, const int *owner, const int *key, int n, int world,
                      int nkeys, int64_t *offset, int64_t *bucket_numel);

/* ---- FSDP flat parameters (runtime/train/fsdp.c). A unit's parameters
 * live end to end in one flat buffer, in order, padded at the tail to a
 * multiple of the world size; rank r owns the r-th of the world equal
 * shards. None of these blocks. Bad input fails with CRUN_EINVAL, a length
 * past INT64_MAX with CRUN_ERANGE. */
typedef struct {
  int64_t numel;       /* the parameters' total element count */
  int64_t padded;      /* the flat buffer's length: numel rounded up to a
                          multiple of world (NO_SHARD: numel) */
  int64_t shard_numel; /* each rank's shard: padded / world (NO_SHARD: numel) */
} crun_fsdp_layout_t;

/* Lays out a unit of n parameters of numel[i] >= 0 elements on world ranks
 * (no_shard: every rank keeps the whole unpadded buffer): offset[i] is
 * parameter i's element offset in the flat buffer (the sum of the ones
 * before it), *out the lengths. n = 0 is an empty unit (all lengths 0). */
int crun_fsdp_layout(const int64_t *numel, int n, int world, int no_shard, int64_t *offset,
                     crun_fsdp_layout_t *out);

typedef struct {
  int64_t start; /* the shard's offset in the padded buffer: rank * per */
  int64_t per;   /* the shard length: ceil(numel / world) */
  int64_t first; /* the first real element it holds: min(numel, start) */
  int64_t count; /* how many real elements it holds (per - count are padding) */
} crun_fsdp_range_t;

/* The part of a flat buffer of numel elements that rank (in [0, world))
 * owns; the padding is the tail, so only the last shards hold less than
 * per real elements (and may hold none). */
int crun_fsdp_shard_range(int64_t numel, int world, int rank, crun_fsdp_range_t *out);

/* *out = a new view (release it) shaped `shape` (ndim dims) over the
 * elements [offset, offset + prod(shape)) of flat, a contiguous 1-d tensor:
 * a parameter living in the flat buffer; writes through it change flat. */
int crun_fsdp_view(crun_tensor_t *flat, int64_t offset, int ndim, const int64_t *shape, crun_tensor_t **out);

/* flatten copies each params[i] (any shape and strides, flat's dtype) into
 * flat[offset[i], offset[i] + numel); unflatten copies the other way. flat
 * is a contiguous 1-d tensor; a slot past its end or another dtype fails
 * with CRUN_EINVAL naming the parameter (the ones before it are copied).
 * A parameter must not overlap flat (use crun_fsdp_view for that). */
int crun_fsdp_flatten(crun_tensor_t *flat, crun_tensor_t *const *params, const int64_t *offset, int n);
int crun_fsdp_unflatten(crun_tensor_t *flat, crun_tensor_t *const *params, const int64_t *offset, int n);

/* ---- FSDP schedule: the bookkeeping of a model's units (0-based, in
 * forward order) for the caller that runs the collectives. A unit is
 * SHARDED (its rank holds its shard only), GATHERING (its all_gather is in
 * flight) or GATHERED (its full parameters are there); NO_SHARD units are
 * GATHERED throughout. Each call tells the caller what to do and moves the
 * states as if it did it: every rank makes the same calls in the same
 * order, so they launch the same collectives in the same order. Nothing
 * blocks; a unit out of range fails with CRUN_EINVAL. */
typedef enum { CRUN_FSDP_FULL_SHARD, CRUN_FSDP_SHARD_GRAD_OP, CRUN_FSDP_NO_SHARD } crun_fsdp_strategy_t;
typedef enum { CRUN_FSDP_SHARDED, CRUN_FSDP_GATHERING, CRUN_FSDP_GATHERED } crun_fsdp_unit_state_t;
typedef struct crun_fsdp_sched crun_fsdp_sched_t;

typedef struct {
  int launch;   /* launch the unit's all_gather now */
  int wait;     /* then wait for it and point the parameters at it */
  int prefetch; /* then launch this unit's all_gather, async (-1: none) */
} crun_fsdp_step_t;

/* A schedule of nunits units, all SHARDED (GATHERED for NO_SHARD);
 * prefetch_fwd / prefetch_bwd enable the prefetches below. */
int crun_fsdp_sched_new(int nunits, crun_fsdp_strategy_t strategy, int prefetch_fwd, int prefetch_bwd,
                        crun_fsdp_sched_t **out);
void crun_fsdp_sched_free(crun_fsdp_sched_t *s); /* NULL is fine */

/* Unit k's crun_fsdp_unit_state_t (>= 0), or a negative status. */
int crun_fsdp_sched_state(const crun_fsdp_sched_t *s, int k);

/* Unit k's forward needs its parameters: *step says whether to launch its
 * gather and whether to wait for it (k is GATHERED after); with `first`
 * (the unit's first leaf) and forward prefetch, unit k + 1, if SHARDED, is
 * the prefetch (GATHERING after). Unit k's backward is pending again. */
int crun_fsdp_sched_pre_forward(crun_fsdp_sched_t *s, int k, int first, crun_fsdp_step_t *step);

/* Unit k's forward ended: returns 1 when the caller frees its full
 * parameters now (FULL_SHARD; k is SHARDED after), else 0. */
int crun_fsdp_sched_post_forward(crun_fsdp_sched_t *s, int k);

/* Unit k's backward starts: launch/wait as in pre_forward; with backward
 * prefetch, the prefetch is the nearest earlier unit whose backward has not
 * run since its forward, if that one is SHARDED. */
int crun_fsdp_sched_pre_backward(crun_fsdp_sched_t *s, int k, crun_fsdp_step_t *step);

/* Unit k's backward ended (its gradients go to reduction): returns 1 when
 * the caller frees its full parameters now (every strategy but NO_SHARD;
 * k is SHARDED after), else 0. */
int crun_fsdp_sched_post_backward(crun_fsdp_sched_t *s, int k);

/* The model's backward ended: every GATHERING unit (a prefetch nobody
 * needed; the caller waits for it and drops it) is SHARDED again. Returns
 * how many there were. */
int crun_fsdp_sched_end_backward(crun_fsdp_sched_t *s);

/* ---- Convolution and pooling (runtime/train/conv.c). Images are NCHW,
 * contiguous, float32 or float64; outputs caller-allocated with the exact
 * shape. None blocks; outputs must not alias inputs. */
typedef struct {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
} crun_conv2d_geom_t;

/* Output height/width of a convolution with kernel kh x kw:
 * (h + 2 pad - dil (k - 1) - 1) / stride + 1; CRUN_EINVAL when the dilated
 * kernel does not fit or a stride/dilation is < 1. */
int crun_nn_conv2d_out_size(int64_t h, int64_t w, int64_t kh, int64_t kw,
                            const crun_conv2d_geom_t *g, int64_t *oh, int64_t *ow);

/* y [N, O, OH, OW] = conv(x [N, C, H, W], w [O, C, KH, KW]) (+ b [O]), by
 * im2col and one GEMM per image (OpenBLAS). b may be NULL. */
int crun_nn_conv2d_forward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *b,
                           crun_tensor_t *y, const crun_conv2d_geom_t *g);

/* Backward for gradient gy [N, O, OH, OW]: gx is overwritten, gw and gb
 * accumulate (as Linear's); any of the three may be NULL. */
int crun_nn_conv2d_backward(const crun_tensor_t *x, const crun_tensor_t *w, const crun_tensor_t *gy,
                            crun_tensor_t *gx, crun_tensor_t *gw, crun_tensor_t *gb,
                            const crun_conv2d_geom_t *g);

typedef struct {
  int64_t kh, kw, stride_h, stride_w, pad_h, pad_w;
} crun_pool2d_geom_t;

/* Output height/width of a pooling window sweep (floor mode); padding may
 * be at most half the kernel (torch's rule). */
int crun_nn_pool2d_out_size(int64_t h, int64_t w, const crun_pool2d_geom_t *g, int64_t *oh,
                            int64_t *ow);

/* Max pooling; idx (int64, y's numel) gets each maximum's 0-based offset in
 * its H x W plane (padding never wins; NaN propagates). Backward overwrites
 * gx with gy routed through idx. */
int crun_nn_maxpool2d_forward(const crun_tensor_t *x, crun_tensor_t *y, crun_tensor_t *idx,
                              const crun_pool2d_geom_t *g);
int crun_nn_maxpool2d_backward(const crun_tensor_t *gy, const crun_tensor_t *idx, crun_tensor_t *gx,
                               const crun_pool2d_geom_t *g);

/* Average pooling: the divisor is the window size (count_include_pad != 0,
 * torch's default) or the number of input elements under the window.
 * Backward overwrites gx. */
int crun_nn_avgpool2d_forward(const crun_tensor_t *x, crun_tensor_t *y, const crun_pool2d_geom_t *g,
                              int count_include_pad);
int crun_nn_avgpool2d_backward(const crun_tensor_t *gy, crun_tensor_t *gx, const crun_pool2d_geom_t *g,
                               int count_include_pad);

/* ---- Normalisation and embedding (runtime/train/norm.c). Batch-norm
 * inputs are viewed as [N, C, S] (S = product of the dims after C);
 * statistics are contiguous float64 [C] tensors whatever the input dtype,
 * so SyncBatchNorm can all_reduce them between the steps below. */

/* out[c] = sum over n, s of (a - ma[c]) * (b - mb[c]); b NULL means the
 * factor 1, ma/mb NULL mean 0. */
int crun_nn_bn_reduce(const crun_tensor_t *a, const crun_tensor_t *ma, const crun_tensor_t *b,
                      const crun_tensor_t *mb, crun_tensor_t *out);

/* y = (x - mean[c]) invstd[c] w[c] + b[c] (w, b may be NULL: 1 and 0). */
int crun_nn_bn_apply(const crun_tensor_t *x, const crun_tensor_t *mean, const crun_tensor_t *invstd,
                     const crun_tensor_t *w, const crun_tensor_t *b, crun_tensor_t *y);

/* gx = (gy - mean_dy[c] - (x - mean[c]) invstd[c]^2 mean_dy_xmu[c]) invstd[c] w[c],
 * with mean_dy = mean of gy and mean_dy_xmu = mean of gy (x - mean) over
 * the (global) batch in training; both NULL in eval mode (fixed statistics). */
int crun_nn_bn_backward_input(const crun_tensor_t *gy, const crun_tensor_t *x,
                              const crun_tensor_t *mean, const crun_tensor_t *invstd,
                              const crun_tensor_t *w, const crun_tensor_t *mean_dy,
                              const crun_tensor_t *mean_dy_xmu, crun_tensor_t *gx);

/* gw[c] += sum_dy_xmu[c] invstd[c], gb[c] += sum_dy[c] (either may be NULL). */
int crun_nn_bn_param_grads(const crun_tensor_t *sum_dy, const crun_tensor_t *sum_dy_xmu,
                           const crun_tensor_t *invstd, crun_tensor_t *gw, crun_tensor_t *gb);

/* Layer norm over rows of d elements: y = (x - mean) rstd w + b per row,
 * rstd = 1 / sqrt(biased var + eps); mean and rstd (float64, one per row)
 * are saved for backward. w, b may be NULL. Backward: gx overwritten, gw
 * and gb accumulate; gx, gw, gb may be NULL. */
int crun_nn_layer_norm_forward(const crun_tensor_t *x, int64_t d, const crun_tensor_t *w,
                               const crun_tensor_t *b, double eps, crun_tensor_t *y,
                               crun_tensor_t *mean, crun_tensor_t *rstd);
int crun_nn_layer_norm_backward(const crun_tensor_t *gy, const crun_tensor_t *x, int64_t d,
                                const crun_tensor_t *mean, const crun_tensor_t *rstd,
                                const crun_tensor_t *w, crun_tensor_t *gx, crun_tensor_t *gw,
                                crun_tensor_t *gb);

/* Embedding: y[i] = w[idx[i]] for 1-based indices (int32/int64; one out of
 * 1..V fails with CRUN_ERANGE naming it), w [V, D], y with numel(idx) * D
 * elements. Backward: gw[idx[i]] += gy[i], skipping idx[i] == padding_idx
 * (0: none). */
int crun_nn_embedding_forward(const crun_tensor_t *idx, const crun_tensor_t *w, crun_tensor_t *y);
int crun_nn_embedding_backward(const crun_tensor_t *idx, const crun_tensor_t *gy, crun_tensor_t *gw,
                               int64_t padding_idx);

/* Reads the whole gzip (or plain) file at path into a malloc'd buffer
 * (*out, *len; free it) through zlib. Fails with CRUN_EIO naming the file,
 * CRUN_ERANGE past max_bytes of output. Blocks on file I/O. */
int crun_gunzip_file(const char *path, size_t max_bytes, char **out, size_t *len);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_TRAIN_H */
