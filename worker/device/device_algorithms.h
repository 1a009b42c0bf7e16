// The training algorithms (ALGORITHMS.md) with the model, the direction and
// every residual in device memory: the device twins of worker/algorithms/,
// written with DeviceOps (device_ops.h) and averaging through StagedAverage
// (worker/staged_average.h), so that only the selected blocks (or the top-k
// entries) cross to the host. Given the same gradients they keep the same
// bits as the host algorithms, and the servers see the same payloads: on
// HostDeviceOps this is tested on the CPU against the host algorithms
// (tests/worker/device_algorithms_test.cc), and CudaDeviceOps is held to
// HostDeviceOps by tests/gpu.
//
// Implemented: ssgd, cser and m-cser (both variants), cser-pl, csea,
// local-sgd, ef-sgd, qsparse-local-sgd, topk-ssgd, gtopk-ssgd, async-sgd.
// Not here: cocod-sgd and pipe-sgd, whose averages stay in flight across
// steps (the worker runs them on the host algorithms, with the CUDA model
// through host spans).
#ifndef CSERPS_WORKER_DEVICE_DEVICE_ALGORITHMS_H_
#define CSERPS_WORKER_DEVICE_DEVICE_ALGORITHMS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "cserps/v1/config.pb.h"
#include "worker/device/device_ops.h"
#include "worker/group/local_group.h"
#include "worker/ps_client.h"

namespace cserps {

// What a device algorithm is built from; every pointer outlives it.
struct DeviceAlgorithmContext {
  const v1::JobConfig* config = nullptr;
  // Registered. A flat worker's talks to every shard; on a node (`group`
  // set) it is this local rank's client of the node's member
  // (worker/hierarchical_communicator.h), and the averages are
  // NodeStagedAverage's.
  PsClient* client = nullptr;
  DeviceOps* ops = nullptr;       // sized for the client's layout
  LocalGroup* group = nullptr;    // null: a flat worker
  float weight = 1.0f;            // this process's batch size
};

class DeviceAlgorithm {
 public:
  virtual ~DeviceAlgorithm() = default;
  // Step t: `grad` is the gradient at `params`, which the step updates
  // (buffers of context.ops). Returns once the step's exchanges have been
  // answered and their results queued; the update itself may still be
  // running on the ops' stream.
  virtual absl::Status Step(uint64_t step, float lr, const float* grad, float* params) = 0;
  // After the last step (`step` = steps trained), as Algorithm::Finish: the
  // final full average, or what the host algorithm does instead.
  virtual absl::Status Finish(uint64_t step, float* params) = 0;
};

// Whether `config` names an algorithm implemented here, for a flat worker
// or (`on_node`) for the local ranks of a node, where the sparse methods
// and async SGD are not (their exchanges have no node path yet).
bool HasDeviceAlgorithm(const v1::AlgorithmConfig& config, bool on_node = false);

// UNIMPLEMENTED naming algorithm.name for a config HasDeviceAlgorithm
// refuses (with on_node = group != null); INVALID_ARGUMENT for a sparse method on a model of over 2^32
// floats; the device's error when a buffer cannot be allocated.
absl::StatusOr<std::unique_ptr<DeviceAlgorithm>> MakeDeviceAlgorithm(
    const DeviceAlgorithmContext& context);

}  // namespace cserps

#endif  // CSERPS_WORKER_DEVICE_DEVICE_ALGORITHMS_H_
