// The learning rate as a function of the global step (OptimizerConfig's
// schedule). With lr, gamma, step_epochs, warmup_epochs from the config,
// S = steps_per_epoch, T = S * total_epochs, W = round(warmup_epochs * S):
//   CONSTANT (or SCHEDULE_UNSPECIFIED): lr
//   STEP_DECAY:    lr * gamma^floor(epoch / step_epochs), epoch = floor(step/S)
//   WARMUP_COSINE: lr * (step + 1) / W                     for step < W,
//                  lr * 0.5 * (1 + cos(pi * (step - W) / (T - W)))  for
//                  W <= step < T, and 0 from step T on (training is over).
// Computed in double, step by step as docs/protocol.md 18 specifies,
// returned as float. Immutable, so any thread may call.
#ifndef CSERPS_WORKER_OPTIM_LR_SCHEDULE_H_
#define CSERPS_WORKER_OPTIM_LR_SCHEDULE_H_

#include <cstddef>
#include <cstdint>

#include "cserps/v1/config.pb.h"

namespace cserps {

class LrSchedule {
 public:
  // `config` must have passed the job config validation (STEP_DECAY needs
  // step_epochs > 0; warmup_epochs >= 0), and steps_per_epoch > 0; a
  // violation is a programmer error and aborts.
  LrSchedule(const v1::OptimizerConfig& config, size_t steps_per_epoch,
             size_t total_epochs);

  // Learning rate for global step `step` (0-based).
  float At(uint64_t step) const;

  uint64_t warmup_steps() const { return warmup_steps_; }
  uint64_t total_steps() const { return total_steps_; }

 private:
  v1::OptimizerConfig::Schedule kind_;
  double lr_;
  double gamma_;
  uint64_t step_epochs_;
  uint64_t steps_per_epoch_;
  uint64_t warmup_steps_;
  uint64_t total_steps_;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_OPTIM_LR_SCHEDULE_H_
