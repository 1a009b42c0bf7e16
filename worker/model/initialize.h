// Deterministic, backend-independent parameter initialisation, so that every
// worker of a job (CPU or GPU) starts from a bit-identical model.
//
// Every weight tensor t has its own stream: the tensors are numbered in
// layout order, conv stages first (t = c for conv stage c, 0-based; none
// for SOFTMAX and MLP) and then linear layers (t = convs.size() + l for
// linear layer l), so SOFTMAX and MLP keep the streams they always had.
// Tensor t draws its weights, in layout order (row-major: out x in for a
// linear layer, out x in x kernel x kernel for a conv kernel), from
// CounterRng(DeriveKey(DeriveKey(seed, kModelInitLabel), t)): weight i is
// float(bound_t * (2u - 1)) computed in double, u = the stream's i-th
// UniformFloat(). bound_t = sqrt(6 / fan_in) (He-uniform) for a tensor
// followed by a ReLU (every conv kernel and every linear layer but the last)
// and sqrt(3 / fan_in) (variance 1/fan_in, LeCun-uniform) for the output
// layer, which has no ReLU after it; fan_in is `in` for a linear layer and
// in_channels * kernel * kernel for a conv kernel. Biases are zero. So every
// weight satisfies |w| <= float(bound_t).
#ifndef CSERPS_WORKER_MODEL_INITIALIZE_H_
#define CSERPS_WORKER_MODEL_INITIALIZE_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "common/model_spec.h"

namespace cserps {

// The DeriveKey label that separates the initialisation streams from other
// uses of the job seed ("MODELINI" in ASCII).
inline constexpr uint64_t kModelInitLabel = 0x4d4f44454c494e49ULL;

// The weight bound of linear layer `layer` of `spec`, as described above.
double InitWeightBound(const ModelSpec& spec, size_t layer);

// The weight bound of conv stage `stage` of `spec`, as described above.
double ConvInitWeightBound(const ModelSpec& spec, size_t stage);

// Overwrites `params` (size spec.num_params) with the initial model.
void InitializeParameters(const ModelSpec& spec, uint64_t seed,
                          absl::Span<float> params);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_INITIALIZE_H_
