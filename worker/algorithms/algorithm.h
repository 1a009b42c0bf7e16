// The interface of a training algorithm (ALGORITHMS.md): what it does with
// a step's gradient, its local model and the servers. Each algorithm is one
// file next to its listing, written once against the device operations
// (worker/device/device_ops.h), so that it runs on host memory on the CPU
// and on device memory on a GPU; the registry (registry.h) makes it by
// name.
//
// The base class holds what every listing's lines are made of: the
// direction rule and its momentum buffer, the GRBS block sets, and the
// averages, as verbs named after what the listings do. An average's
// mechanics (gathering the selected blocks, the staged copies, a node's
// collectives) are worker/ps/staged_average.h's.
#ifndef CSERPS_WORKER_ALGORITHMS_ALGORITHM_H_
#define CSERPS_WORKER_ALGORITHMS_ALGORITHM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/direction.h"
#include "cserps/v1/config.pb.h"
#include "worker/device/device_ops.h"
#include "worker/group/local_group.h"
#include "worker/ps/communicator.h"
#include "worker/ps/staged_average.h"

namespace cserps {

// What an algorithm is built from; every pointer outlives it.
struct AlgorithmContext {
  const v1::JobConfig* config = nullptr;
  // The servers, as this process reaches them: every shard for a flat
  // worker; on a node, this local rank's shards (worker/ps/node_client.h).
  Communicator* comm = nullptr;
  DeviceOps* ops = nullptr;     // sized for comm's layout
  LocalGroup* group = nullptr;  // the node's group; null: a flat worker
  float weight = 1.0f;          // this process's weight in averages: its batch size
  uint64_t steps_per_epoch = 0;  // for schedules counted in epochs
};

class Algorithm;

// An average started and left in flight (CoCoD-SGD, Pipe-SGD): its payloads
// are on the wire while the caller computes. Move-only; it must not outlive
// its algorithm. Destroying it uncompleted waits for the servers' replies
// and drops them; on a node, Complete is a collective, so either every
// local rank completes it or none does (a peer's Complete would wait for
// the group's timeout).
class PendingAverage {
 public:
  PendingAverage(PendingAverage&&) noexcept;
  PendingAverage& operator=(PendingAverage&&) noexcept;
  ~PendingAverage();

  // Waits for the mean and lands it in `target` as the average was started:
  // target[S] ← AVG(v[S]) (StartModelAverage) or target[S] ← target[S] −
  // η·AVG(v[S]) (StartGradientAverage, with its η). Call once.
  absl::Status Complete(float* target);

 private:
  friend class Algorithm;
  PendingAverage(Algorithm* owner, std::unique_ptr<StagingDevice> staging,
                 std::unique_ptr<StagedRound> round, ScatterKind kind, float alpha);
  void Release();

  Algorithm* owner_ = nullptr;
  std::unique_ptr<StagingDevice> staging_;
  std::unique_ptr<StagedRound> round_;  // on staging_
  ScatterKind kind_ = ScatterKind::kAssign;
  float alpha_ = 0;
};

class Algorithm {
 public:
  // The algorithm's own model-sized buffers, members of the derived class
  // that Init makes zeroed (not dereferenced before): `state`, those whose
  // contents one step leaves for the next (error buffers, x̂), which a
  // checkpoint holds; `scratch`, those each step writes before it reads.
  // `staging_devices`: how many averages it has under way at once.
  Algorithm(const AlgorithmContext& context, std::vector<DeviceVector*> state,
            std::vector<DeviceVector*> scratch = {}, int staging_devices = 1);
  Algorithm(const Algorithm&) = delete;
  Algorithm& operator=(const Algorithm&) = delete;
  virtual ~Algorithm();

  // Step t (0-based): `grad` is the stochastic gradient at `params` (this
  // worker's local model), which the step updates in place; both are
  // buffers of context.ops. Returns once the step's blocking exchanges have
  // been answered and their results queued (an average left in flight is
  // answered at a later step); the update itself may still be running on
  // the ops' stream.
  virtual absl::Status Step(uint64_t step, float lr, const float* grad,
                            float* params) = 0;

  // After the last step; `step` is the number of steps trained (one past the
  // last step's number), so the round cannot collide with a step's. By
  // default a full model average (an error reset with C1 = identity), after
  // which every worker and the servers hold the same, exact global model.
  virtual absl::Status Finish(uint64_t step, float* params);

  // Makes the buffers, the momentum buffer and the staging devices the
  // algorithm needs; the registry calls it once, before the first step.
  // Algorithms that need more extend it.
  virtual absl::Status Init();

  // A checkpoint between two steps, taken in three calls:
  // SettleForCheckpoint(x) lands what the algorithm keeps in flight from one
  // step to the next (CoCoD-SGD's and Pipe-SGD's averages: it waits for the
  // servers' reply; on a node a collective) into its state buffers, so that
  // StateBuffers(), the momentum buffer first, then hold its whole state on
  // this worker; `x` is the model after the last step. Copies of them taken
  // after t steps, loaded into a fresh algorithm of the same job followed by
  // ResumeAfter(t), make its next step the same to the bit as this one's.
  virtual absl::Status SettleForCheckpoint(const float* x);
  // A checkpoint's average after `steps` steps (after SettleForCheckpoint):
  // x ← AVG(x) over every block on the CHECKPOINT stream, an error reset
  // after which every worker and the servers hold the same global model
  // and the servers have written their files of the step.
  absl::Status AverageForCheckpoint(uint64_t steps, float* x);
  std::vector<float*> StateBuffers();
  // Derives what the loaded state buffers do not hold from the step count.
  virtual absl::Status ResumeAfter(uint64_t steps);
  // Every worker and the servers hold the model `x`: after a full average
  // (AverageForCheckpoint calls it), and for a worker admitted into a
  // running job (elastic) with the servers' model, its state buffers zeroed,
  // after ResumeAfter. Sets the state that follows (QSparse-local-SGD's
  // common model x̂ = x).
  virtual absl::Status AdoptGlobalModel(const float* x);
  // Drops the averages it keeps in flight, waiting for their replies (or
  // their failure): before loading a checkpoint into this algorithm, which
  // goes back to it in place (a restarted server, docs/reliability.md).
  virtual void AbandonInFlight() {}

 protected:
  const v1::JobConfig& config() const { return *context_.config; }
  const v1::AlgorithmConfig& algorithm() const { return context_.config->algorithm(); }
  const AlgorithmContext& context() const { return context_; }
  DeviceOps& ops() { return *context_.ops; }
  Communicator& comm() { return *context_.comm; }
  const DirectionRule& rule() const { return rule_; }
  // Direction's momentum buffer; null for NONE.
  float* momentum() { return momentum_.data(); }

  // A new zeroed buffer of the ops, kept by `*buffer`.
  absl::Status Allocate(DeviceVector* buffer);
  // The blocks GRBS(stream, t, ratio) selects, ascending.
  std::vector<uint64_t> Blocks(v1::Stream stream, uint64_t t, uint32_t ratio) const;

  // x[S] ← AVG(x[S]) with S = GRBS(MODEL, t, ratio) (ratio 1: every block).
  absl::Status AverageModel(uint64_t t, uint32_t ratio, float* x);
  // target[S] ← AVG(p[S]) with S = GRBS(GRAD, t, ratio); the servers apply
  // x[S] ← x[S] − η·AVG(p[S]) to their model.
  absl::Status AverageGradient(uint64_t t, uint32_t ratio, float lr, const float* p,
                               float* target);
  // x[S] ← x[S] − η·AVG(p[S]) with S = GRBS(GRAD, t, ratio), here as on the
  // servers.
  absl::Status DescendByAverage(uint64_t t, uint32_t ratio, float lr, const float* p,
                                float* x);
  // The starts of AverageModel (every block) and DescendByAverage (every
  // block, the descent by η happening at Complete), returning with the
  // average in flight. `values` may change once the ops' queue has passed
  // the call.
  absl::StatusOr<PendingAverage> StartModelAverage(uint64_t t, const float* values);
  absl::StatusOr<PendingAverage> StartGradientAverage(uint64_t t, float lr,
                                                      const float* values);

 private:
  friend class PendingAverage;

  // The average of round (stream, t, ratio) of this process.
  StagedAverageSpec Spec(v1::Stream stream, uint64_t t, uint32_t ratio) const;
  absl::Status Average(v1::Stream stream, uint64_t t, uint32_t ratio, float lr,
                       const float* values, ScatterKind kind, float alpha, float* target);
  absl::StatusOr<PendingAverage> StartPending(v1::Stream stream, uint64_t t, float lr,
                                              const float* values, ScatterKind kind,
                                              float alpha);
  // A staging device no average uses; FAILED_PRECONDITION when every one
  // of them is in use (more averages in flight than the algorithm declared).
  absl::StatusOr<std::unique_ptr<StagingDevice>> TakeStaging();
  void ReturnStaging(std::unique_ptr<StagingDevice> staging);

  const AlgorithmContext context_;
  const DirectionRule rule_;
  const std::vector<DeviceVector*> state_;
  const std::vector<DeviceVector*> scratch_;
  const int staging_devices_;
  DeviceVector momentum_;  // Direction's; empty for NONE
  std::vector<std::unique_ptr<StagingDevice>> idle_staging_;
};

// Steps after which the periodic methods sync: t with (t + 1) % H == 0,
// i.e. after every H-th step.
inline bool IsSyncStep(uint64_t step, uint32_t period) {
  return (step + 1) % period == 0;
}

}  // namespace cserps

#endif  // CSERPS_WORKER_ALGORITHMS_ALGORITHM_H_
