// The backend-neutral model interface the trainer uses: a classifier over the
// flat parameter vector of common/model_spec.h. CpuModel (cpu_model.h)
// implements it with OpenBLAS; HostBackend (worker/device/host_backend.h)
// trains it on host memory. The CUDA model (worker/cuda/kernels/
// cuda_model.h) has the same mathematics on device buffers.
//
// A Model owns only its layout and scratch space, never the parameters: the
// caller passes `params` (and `grad`) on every call and keeps them alive for
// the call's duration. One Model serves one thread; use one per thread.
#ifndef CSERPS_WORKER_MODEL_MODEL_H_
#define CSERPS_WORKER_MODEL_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model_spec.h"
#include "cserps/v1/config.pb.h"
#include "worker/data/batch.h"

namespace cserps {

// Sums over the examples seen, so that batches of any size can be added and
// divided once at the end (mean loss = loss_sum / count).
struct EvalSums {
  // Adds the sums of more examples.
  void Add(const EvalSums& more) {
    loss_sum += more.loss_sum;
    correct += more.correct;
    count += more.count;
  }

  double loss_sum = 0;
  size_t correct = 0;
  size_t count = 0;
};

// Every method requires params.size() == spec().num_params and a batch with
// batch.dim == spec().input_dim, features.size() == size * dim,
// labels.size() == size and every label < spec().num_classes; a violation is a
// programmer error (Trainer::Create checks the data against the model) and
// aborts. A backend's own failure (a device error) is returned.
class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelSpec& spec() const = 0;

  // Deterministic initialisation from `seed`, identical on every backend and
  // host (see initialize.h for the exact streams): weights uniform, biases
  // zero. params.size() == spec().num_params.
  virtual void Initialize(uint64_t seed, absl::Span<float> params) const = 0;

  // Returns the mean softmax cross-entropy over the batch and writes
  // d(mean loss)/d(params) into `grad` (overwritten, same layout as params).
  // An empty batch gives loss 0 and a zero gradient. Not thread-safe: uses
  // the model's scratch buffers.
  virtual absl::StatusOr<float> LossAndGradient(absl::Span<const float> params,
                                                const Batch& batch,
                                                absl::Span<float> grad) = 0;

  // Returns the batch's summed loss, correct top-1 predictions (ties go to
  // the lowest class index) and example count. Not thread-safe either.
  virtual absl::StatusOr<EvalSums> Evaluate(absl::Span<const float> params,
                                            const Batch& batch) = 0;
};

// The CPU (OpenBLAS) backend for `config`; InvalidArgument naming the field
// when the config describes no valid model or a FLAT one.
absl::StatusOr<std::unique_ptr<Model>> MakeCpuModel(
    const v1::ModelConfig& config);

}  // namespace cserps

#endif  // CSERPS_WORKER_MODEL_MODEL_H_
