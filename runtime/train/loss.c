/* loss.c — cross entropy over class labels and mean squared error. */
#include <math.h>

#include "cuda/dispatch.h"
#include "train/check.h"

/* Reads label i (1-based) of an int32/int64 tensor. */
static int64_t label_at(const crun_tensor_t *labels, int64_t i) {
  if (crun_tensor_dtype(labels) == CRUN_INT64) return ((const int64_t *)crun_tensor_data(labels))[i];
  return ((const int32_t *)crun_tensor_data(labels))[i];
}

/* Checks the labels tensor; its values too when it is on the host (on a
 * device, the kernel checks them and fails the same way). */
static int check_labels(const char *fn, const crun_tensor_t *labels, int64_t rows, int64_t c) {
  if (!labels) return crun_error(CRUN_EINVAL, "%s: labels are missing", fn);
  crun_dtype_t dt = crun_tensor_dtype(labels);
  if (dt != CRUN_INT64 && dt != CRUN_INT32)
    return crun_error(CRUN_EINVAL, "%s: labels must be int64 or int32, got %s", fn, crun_dtype_name(dt));
  if (!crun_tensor_is_contiguous(labels))
    return crun_error(CRUN_EINVAL, "%s: labels must be contiguous", fn);
  if (crun_tensor_numel(labels) != rows)
    return crun_error(CRUN_EINVAL, "%s: %lld labels for %lld rows of logits", fn,
                      (long long)crun_tensor_numel(labels), (long long)rows);
  for (int64_t i = 0; crun_tensor_device(labels) < 0 && i < rows; i++) {
    int64_t l = label_at(labels, i);
    if (l < 1 || l > c)
      return crun_error(CRUN_ERANGE, "%s: label %lld of row %lld is out of range 1..%lld (labels are 1-based)",
                        fn, (long long)l, (long long)(i + 1), (long long)c);
  }
  return 0;
}

/* Loss of one row of logits xr[c] against label l (0-based); writes the
 * softmax into g when g != NULL and returns -log p[l]; *argmax gets the top class. */
#define CE_ROW(T, EXP)                                                               \
  static double ce_row_##T(const T *xr, int64_t c, int64_t l, T *g, double scale,    \
                           int64_t *argmax) {                                        \
    T mx = xr[0];                                                                    \
    int64_t am = 0;                                                                  \
    for (int64_t j = 1; j < c; j++)                                                  \
      if (xr[j] > mx) { mx = xr[j]; am = j; }                                        \
    double s = 0;                                                                    \
    for (int64_t j = 0; j < c; j++) s += EXP(xr[j] - mx);                            \
    double lse = (double)mx + log(s);                                                \
    if (g) {                                                                         \
      for (int64_t j = 0; j < c; j++) g[j] = (T)(exp((double)xr[j] - lse) * scale);  \
      g[l] -= (T)scale;                                                              \
    }                                                                                \
    *argmax = am;                                                                    \
    return lse - (double)xr[l];                                                      \
  }
CE_ROW(float, expf)
CE_ROW(double, exp)

/* The host loop of cross entropy over rows x [rows, c]: adds each row's
 * loss to *total and writes it into losses (x's dtype) when given, grad
 * (nullable) gets softmax - onehot scaled by scale; returns the rows whose
 * argmax is their label. */
static int64_t ce_host(const crun_tensor_t *x, const crun_tensor_t *labels, int64_t rows, int64_t c,
                       double scale, crun_tensor_t *losses, double *total, crun_tensor_t *grad) {
  int64_t ok = 0, am;
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  for (int64_t i = 0; i < rows; i++) {
    int64_t l = label_at(labels, i) - 1;
    double r;
    if (f32) {
      r = ce_row_float((const float *)crun_tensor_data(x) + i * c, c, l,
                       grad ? (float *)crun_tensor_data(grad) + i * c : NULL, scale, &am);
      if (losses) ((float *)crun_tensor_data(losses))[i] = (float)r;
    } else {
      r = ce_row_double((const double *)crun_tensor_data(x) + i * c, c, l,
                        grad ? (double *)crun_tensor_data(grad) + i * c : NULL, scale, &am);
      if (losses) ((double *)crun_tensor_data(losses))[i] = r;
    }
    *total += r;
    ok += am == l;
  }
  return ok;
}

int crun_nn_cross_entropy(const crun_tensor_t *x, const crun_tensor_t *labels, int sum,
                          double *loss, int64_t *correct, crun_tensor_t *grad) {
  int64_t rows, c;
  CRUN_CHECK(crun__train_check_2d("CrossEntropy", "input", x, &rows, &c));
  if (c == 0) return crun_error(CRUN_EINVAL, "CrossEntropy: input has 0 classes");
  CRUN_CHECK(check_labels("CrossEntropy", labels, rows, c));
  if (grad) CRUN_CHECK(crun__train_check_like("CrossEntropy", "gradInput", x, grad));
  if (rows == 0) { /* torch: the mean of no rows is 0/0 = nan, the sum 0 */
    if (loss) *loss = sum ? 0.0 : NAN;
    if (correct) *correct = 0;
    return 0;
  }
  double scale = sum ? 1.0 : 1.0 / (double)rows, total = 0;
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(labels) || CRUN__ON_DEV(grad))
    return crun__dev_cross_entropy(x, labels, scale, loss, correct, grad);
  int64_t ok = ce_host(x, labels, rows, c, scale, NULL, &total, grad);
  if (loss) *loss = total * scale;
  if (correct) *correct = ok;
  return 0;
}

int crun_nn_cross_entropy_rows(const crun_tensor_t *x, const crun_tensor_t *labels, crun_tensor_t *losses,
                               int64_t *correct, crun_tensor_t *grad) {
  int64_t rows, c;
  double total = 0;
  CRUN_CHECK(crun__train_check_2d("CrossEntropy", "input", x, &rows, &c));
  if (c == 0) return crun_error(CRUN_EINVAL, "CrossEntropy: input has 0 classes");
  CRUN_CHECK(check_labels("CrossEntropy", labels, rows, c));
  if (grad) CRUN_CHECK(crun__train_check_like("CrossEntropy", "gradInput", x, grad));
  CRUN_CHECK(crun__train_check_float("CrossEntropy", "losses", losses));
  if (crun_tensor_dtype(losses) != crun_tensor_dtype(x) || crun_tensor_numel(losses) != rows)
    return crun_error(CRUN_EINVAL, "CrossEntropy: losses must be %lld elements of the input's dtype",
                      (long long)rows);
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(labels) || CRUN__ON_DEV(grad) || CRUN__ON_DEV(losses))
    return crun_error(CRUN_ENOTSUP, "CrossEntropy: per-row losses are computed on the host only");
  int64_t ok = ce_host(x, labels, rows, c, 1.0, losses, &total, grad);
  if (correct) *correct = ok;
  return 0;
}

int crun_nn_mse(const crun_tensor_t *x, const crun_tensor_t *t, double *loss, crun_tensor_t *grad) {
  CRUN_CHECK(crun__train_check_float("MSE", "input", x));
  CRUN_CHECK(crun__train_check_like("MSE", "target", x, t));
  if (grad) CRUN_CHECK(crun__train_check_like("MSE", "gradInput", x, grad));
  int64_t n = crun_tensor_numel(x);
  if (n == 0) { /* torch: the mean of no elements is nan (host or device) */
    if (loss) *loss = NAN;
    return 0;
  }
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(t) || CRUN__ON_DEV(grad)) return crun__dev_mse(x, t, loss, grad);
  double s = 0, k = 2.0 / (double)n;
  for (int64_t i = 0; i < n; i++) {
    double d;
    if (crun_tensor_dtype(x) == CRUN_FLOAT32) {
      d = (double)((const float *)crun_tensor_data(x))[i] - ((const float *)crun_tensor_data(t))[i];
      if (grad) ((float *)crun_tensor_data(grad))[i] = (float)(k * d);
    } else {
      d = ((const double *)crun_tensor_data(x))[i] - ((const double *)crun_tensor_data(t))[i];
      if (grad) ((double *)crun_tensor_data(grad))[i] = k * d;
    }
    s += d * d;
  }
  if (loss) *loss = s / (double)n;
  return 0;
}

int crun_nn_nll(const crun_tensor_t *x, const crun_tensor_t *labels, double *loss, crun_tensor_t *grad) {
  static const char *fn = "ClassNLLCriterion";
  int64_t rows, c;
  CRUN_CHECK(crun__train_check_2d(fn, "input", x, &rows, &c));
  CRUN_CHECK(check_labels(fn, labels, rows, c));
  if (grad) CRUN_CHECK(crun__train_check_like(fn, "gradInput", x, grad));
  if (rows == 0) { /* torch: the mean of no rows is nan */
    if (loss) *loss = NAN;
    return 0;
  }
  double scale = 1.0 / (double)rows, total = 0;
  if (CRUN__ON_DEV(x) || CRUN__ON_DEV(labels) || CRUN__ON_DEV(grad)) return crun__dev_nll(x, labels, scale, loss, grad);
  int f32 = crun_tensor_dtype(x) == CRUN_FLOAT32;
  for (int64_t i = 0; i < rows; i++) {
    int64_t l = label_at(labels, i) - 1;
    for (int64_t j = 0; grad && j < c; j++) {
      double g = j == l ? -scale : 0.0;
      if (f32) ((float *)crun_tensor_data(grad))[i * c + j] = (float)g;
      else ((double *)crun_tensor_data(grad))[i * c + j] = g;
    }
    total -= f32 ? (double)((const float *)crun_tensor_data(x))[i * c + l] : ((const double *)crun_tensor_data(x))[i * c + l];
  }
  if (loss) *loss = total * scale;
  return 0;
}
