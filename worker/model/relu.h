// The rectifier between linear layers, applied in place.
#ifndef CSERPS_WORKER_MODEL_RELU_H_
#define CSERPS_WORKER_MODEL_RELU_H_

#include "absl/types/span.h"

namespace cserps {

// a = max(a, 0) element-wise.
void ReluInPlace(absl::Span<float> a);

// Given the ReLU's output `activation` and grad = dL/d(output), turns grad
// into dL/d(input): zero where the output is zero (the subgradient 0 at the
// kink). Sizes must match.
void ReluBackwardInPlace(absl::Span<const float> activation,
                         absl::Span<float> grad);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_RELU_H_
