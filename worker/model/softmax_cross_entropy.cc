#include "worker/model/softmax_cross_entropy.h"

#include <cmath>

#include "common/status.h"

namespace cserps {

double SoftmaxCrossEntropy(absl::Span<const float> logits,
                           absl::Span<const uint8_t> labels, size_t classes,
                           float grad_scale, absl::Span<float> dlogits) {
  const size_t rows = labels.size();
  CSERPS_CHECK(classes > 0 && logits.size() == rows * classes);
  CSERPS_CHECK(dlogits.empty() || dlogits.size() == logits.size());
  double loss_sum = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * classes;
    const size_t label = labels[r];
    CSERPS_CHECK(label < classes);
    float max_z = z[0];
    for (size_t j = 1; j < classes; ++j) max_z = z[j] > max_z ? z[j] : max_z;
    // The row is reduced in double: with many classes a float sum of
    // exponentials loses the small terms that decide the loss near zero.
    double sum_exp = 0.0;
    for (size_t j = 0; j < classes; ++j) {
      sum_exp += std::exp(static_cast<double>(z[j]) - max_z);
    }
    const double log_sum = std::log(sum_exp);
    loss_sum += log_sum - (static_cast<double>(z[label]) - max_z);
    if (!dlogits.empty()) {
      float* dz = dlogits.data() + r * classes;
      for (size_t j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(z[j]) - max_z - log_sum);
        dz[j] = static_cast<float>(grad_scale * (p - (j == label ? 1.0 : 0.0)));
      }
    }
  }
  return loss_sum;
}

size_t CountTop1Correct(absl::Span<const float> logits,
                        absl::Span<const uint8_t> labels, size_t classes) {
  const size_t rows = labels.size();
  CSERPS_CHECK(classes > 0 && logits.size() == rows * classes);
  size_t correct = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * classes;
    size_t best = 0;
    for (size_t j = 1; j < classes; ++j) {
      if (z[j] > z[best]) best = j;
    }
    if (best == labels[r]) ++correct;
  }
  return correct;
}

}  // namespace cserps
