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
#include "cserps/v1/config.pb.h"
#include "worker/communicator.h"
#include "worker/optim/direction.h"

namespace cserps {

// What an algorithm is built from. Every pointer outlives the algorithm.
struct AlgorithmContext {
  const v1::JobConfig* config = nullptr;
  Communicator* comm = nullptr;
  Direction* direction = nullptr;  // this worker's momentum state
  size_t num_params = 0;
  float weight = 1.0f;  // this member's weight in averages: its batch size
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;

  // One training step t: `grad` is the stochastic gradient at `params` (this
  // worker's local model), which the step updates in place.
  virtual absl::Status Step(uint64_t step, float lr, absl::Span<const float> grad,
                            absl::Span<float> params) = 0;
};

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
