// Softmax cross-entropy of logits against integer labels, numerically stable:
// every row is shifted by its maximum before exponentiation, so no exp
// overflows and the loss is log(sum_j exp(z_j - m)) - (z_y - m).
#ifndef CSERPS_WORKER_MODEL_SOFTMAX_CROSS_ENTROPY_H_
#define CSERPS_WORKER_MODEL_SOFTMAX_CROSS_ENTROPY_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace cserps {

// `logits` is rows x classes, row-major; labels.size() == rows and every
// label < classes (checked: a violation is a programmer error).
// Returns the loss summed over rows. Unless `dlogits` is empty, writes
// grad_scale * (softmax(z) - onehot(y)) into it (rows x classes,
// overwritten); grad_scale = 1/rows gives the gradient of the mean loss.
double SoftmaxCrossEntropy(absl::Span<const float> logits,
                           absl::Span<const uint8_t> labels, size_t classes,
                           float grad_scale, absl::Span<float> dlogits);

// Number of rows whose largest logit (the lowest index among ties) is the
// label.
size_t CountTop1Correct(absl::Span<const float> logits,
                        absl::Span<const uint8_t> labels, size_t classes);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_SOFTMAX_CROSS_ENTROPY_H_
