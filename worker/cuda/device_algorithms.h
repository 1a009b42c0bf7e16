// S-SGD, CSER and M-CSER (ALGORITHMS.md) with the model, the direction and
// the momentum in device memory: the device twins of
// worker/algorithms/ssgd.cc and cser.cc, averaging through StagedAverage
// (worker/staged_average.h). Same bits as the host algorithms given the same
// gradients: the update kernels round like the CPU code
// (worker/cuda/update_kernels.h) and the servers see the same payloads.
//
// Only CSER's MODEL_BLOCKS variant runs here; GRADIENT_BLOCKS is refused.
// Every device pointer is a model-sized buffer on the context's device; the
// work is queued on the context's stream.
#ifndef CSERPS_WORKER_CUDA_DEVICE_ALGORITHMS_H_
#define CSERPS_WORKER_CUDA_DEVICE_ALGORITHMS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/block_layout.h"
#include "cserps/v1/config.pb.h"
#include "worker/ps_client.h"
#include "worker/staged_average.h"

namespace cserps {

// What a device algorithm is built from; every pointer outlives it.
struct DeviceAlgorithmContext {
  const v1::JobConfig* config = nullptr;
  PsClient* client = nullptr;  // registered; talks to every shard
  StagingDevice* staging = nullptr;
  cudaStream_t stream = nullptr;  // the stream of the model and of `staging`
  float weight = 1.0f;            // this worker's batch size
};

class DeviceAlgorithm {
 public:
  virtual ~DeviceAlgorithm() = default;
  // Step t: `grad` is the gradient at `params`, which the step updates.
  // Returns once the step's averages have been answered and their results
  // queued; the update itself may still be running on the stream.
  virtual absl::Status Step(uint64_t step, float lr, const float* grad, float* params) = 0;
  // After the last (`step` = steps trained): the final full average of
  // Algorithm::Finish, or nothing for S-SGD.
  virtual absl::Status Finish(uint64_t step, float* params) = 0;
};

// Whether `config` names an algorithm this file implements: ssgd, or cser /
// m-cser with the MODEL_BLOCKS variant.
bool HasDeviceAlgorithm(const v1::AlgorithmConfig& config);

// UNIMPLEMENTED naming algorithm.name (or algorithm.cser_variant) for a
// config HasDeviceAlgorithm refuses; the CUDA error when the momentum
// buffer cannot be allocated.
absl::StatusOr<std::unique_ptr<DeviceAlgorithm>> MakeDeviceAlgorithm(
    const DeviceAlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_DEVICE_ALGORITHMS_H_
