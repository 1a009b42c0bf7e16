// Deterministic, backend-independent parameter initialisation, so that every
// worker of a job (CPU or GPU) starts from a bit-identical model.
//
// Layer l (0-based) draws its weights, in layout order (row-major out x in),
// from CounterRng(DeriveKey(DeriveKey(seed, kModelInitLabel), l)): weight i is
// float(bound_l * (2u - 1)) computed in double, u = the stream's i-th
// UniformFloat(). bound_l = sqrt(6 / in_l) (He-uniform) for a layer followed
// by a ReLU, and sqrt(3 / in_l) (variance 1/in_l, LeCun-uniform) for the
// output layer, which has no ReLU after it. Biases are zero. So every weight
// satisfies |w| <= float(bound_l).
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

// The weight bound of layer `layer` of `spec`, as described above.
double InitWeightBound(const ModelSpec& spec, size_t layer);

// Overwrites `params` (size spec.num_params) with the initial model.
void InitializeParameters(const ModelSpec& spec, uint64_t seed,
                          absl::Span<float> params);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_INITIALIZE_H_
