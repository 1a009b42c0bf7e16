// The interface of a training algorithm (ALGORITHMS.md): what it does with
// a step's gradient, its local model and the averaging primitive. Each
// algorithm is one file next to its listing; they are created by name from
// the registry below.
#ifndef CSERPS_WORKER_ALGORITHMS_ALGORITHM_H_
#define CSERPS_WORKER_ALGORITHMS_ALGORITHM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "common/grbs.h"
#include "cserps/v1/config.pb.h"
#include "worker/communicator.h"
#include "worker/optim/direction.h"

namespace cserps {

// What an algorithm is built from. Every pointer outlives the algorithm.
struct AlgorithmContext {
  const v1::JobConfig* config = nullptr;
  Communicator* comm = nullptr;
  Direction* direction = nullptr;  // this worker's momentum state
  const BlockLayout* layout = nullptr;
  float weight = 1.0f;  // this member's weight in averages: its batch size
  uint64_t steps_per_epoch = 0;  // for schedules counted in epochs

  size_t num_params() const { return layout->num_params(); }
  const v1::AlgorithmConfig& algorithm() const { return config->algorithm(); }
};

class Algorithm {
 public:
  explicit Algorithm(const AlgorithmContext& context) : context_(context) {}
  virtual ~Algorithm() = default;

  // One training step t (0-based): `grad` is the stochastic gradient at
  // `params` (this worker's local model), which the step updates in place.
  virtual absl::Status Step(uint64_t step, float lr, absl::Span<const float> grad,
                            absl::Span<float> params) = 0;

  // After the last step; `step` is the number of steps trained (one past the
  // last step's number), so the round cannot collide with a step's. A full
  // model average (an error
  // reset with C1 = identity), after which every worker and the servers hold
  // the same, exact global model. S-SGD needs none.
  virtual absl::Status Finish(uint64_t step, absl::Span<float> params);

 protected:
  const AlgorithmContext context_;
};

// Steps after which the local methods sync: t with (t + 1) % H == 0, i.e.
// after every H-th step.
inline bool IsSyncStep(uint64_t step, uint32_t period) {
  return (step + 1) % period == 0;
}

// Calls fn(begin, end) for the float range of every block that
// GRBS(stream, step, ratio) selects, in ascending order.
template <typename Fn>
void ForEachSelectedRange(const AlgorithmContext& context, v1::Stream stream,
                          uint64_t step, uint32_t ratio, Fn fn) {
  const BlockLayout& layout = *context.layout;
  for (uint64_t b : SelectBlocks(context.config->seed(), stream, step, ratio,
                                 layout.num_blocks())) {
    fn(layout.BlockBegin(b), layout.BlockEnd(b));
  }
}

using AlgorithmFactory = std::function<absl::StatusOr<std::unique_ptr<Algorithm>>(
    const AlgorithmContext&)>;

// Name → factory. Built explicitly (no static registration): main and tests
// call DefaultAlgorithms().
class AlgorithmRegistry {
 public:
  // ALREADY_EXISTS when `name` is taken.
  absl::Status Register(const std::string& name, AlgorithmFactory factory);
  // NOT_FOUND listing the known names when `name` is unknown.
  absl::StatusOr<std::unique_ptr<Algorithm>> Create(
      const std::string& name, const AlgorithmContext& context) const;

 private:
  std::map<std::string, AlgorithmFactory> factories_;
};

// Every algorithm of this build.
const AlgorithmRegistry& DefaultAlgorithms();

}  // namespace cserps

#endif  // CSERPS_WORKER_ALGORITHMS_ALGORITHM_H_
