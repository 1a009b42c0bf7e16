#include "worker/optim/lr_schedule.h"

#include <cmath>

#include "common/status.h"

namespace cserps {
namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

LrSchedule::LrSchedule(const v1::OptimizerConfig& config,
                       size_t steps_per_epoch, size_t total_epochs)
    : kind_(config.schedule() == v1::OptimizerConfig::SCHEDULE_UNSPECIFIED
                ? v1::OptimizerConfig::CONSTANT
                : config.schedule()),
      lr_(config.lr()),
      gamma_(config.gamma()),
      step_epochs_(config.step_epochs()),
      steps_per_epoch_(steps_per_epoch),
      warmup_steps_(0),
      total_steps_(static_cast<uint64_t>(steps_per_epoch) * total_epochs) {
  CSERPS_CHECK(steps_per_epoch > 0);
  CSERPS_CHECK(kind_ == v1::OptimizerConfig::CONSTANT ||
               kind_ == v1::OptimizerConfig::STEP_DECAY ||
               kind_ == v1::OptimizerConfig::WARMUP_COSINE);
  if (kind_ == v1::OptimizerConfig::STEP_DECAY) {
    CSERPS_CHECK(step_epochs_ > 0);
  }
  if (kind_ == v1::OptimizerConfig::WARMUP_COSINE) {
    CSERPS_CHECK(config.warmup_epochs() >= 0.0f);
    warmup_steps_ = static_cast<uint64_t>(std::llround(
        static_cast<double>(config.warmup_epochs()) *
        static_cast<double>(steps_per_epoch)));
  }
}

float LrSchedule::At(uint64_t step) const {
  switch (kind_) {
    case v1::OptimizerConfig::STEP_DECAY: {
      // gamma^k as k products rather than pow, whose last bit differs between
      // C libraries: a client in any language computes these bits.
      const uint64_t decays = step / steps_per_epoch_ / step_epochs_;
      double factor = 1.0;
      for (uint64_t i = 0; i < decays; ++i) factor *= gamma_;
      return static_cast<float>(lr_ * factor);
    }
    case v1::OptimizerConfig::WARMUP_COSINE: {
      if (step < warmup_steps_) {
        return static_cast<float>(lr_ * static_cast<double>(step + 1) /
                                  static_cast<double>(warmup_steps_));
      }
      if (step >= total_steps_) return 0.0f;
      const double progress =
          static_cast<double>(step - warmup_steps_) /
          static_cast<double>(total_steps_ - warmup_steps_);
      return static_cast<float>(lr_ * 0.5 * (1.0 + std::cos(kPi * progress)));
    }
    default:
      return static_cast<float>(lr_);
  }
}

}  // namespace cserps
