#include "worker/device/host_backend.h"

namespace cserps {

absl::StatusOr<float> HostBackend::LossAndGradient(const float* params, const Batch& batch,
                                                   float* grad) {
  const size_t d = model_->spec().num_params;
  return model_->LossAndGradient(absl::MakeConstSpan(params, d), batch,
                                 absl::MakeSpan(grad, d));
}

absl::StatusOr<EvalSums> HostBackend::Evaluate(const float* params, const Batch& batch) {
  return model_->Evaluate(absl::MakeConstSpan(params, model_->spec().num_params), batch);
}

}  // namespace cserps
