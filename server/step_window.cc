#include "server/step_window.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/algorithm_catalog.h"
#include "common/grbs.h"

namespace cserps {
namespace {

constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  return b != 0 && a > kUnlimited / b ? kUnlimited : a * b;
}

// g: steps after which the chance that none of them selected a block of the
// shard is under 10^-12.
uint64_t MissedSteps(const v1::AlgorithmConfig& algorithm, const BlockLayout& layout,
                     uint32_t shard) {
  const uint32_t ratio =
      std::max({algorithm.ratio(), algorithm.ratio_c1(), algorithm.ratio_c2(), 1u});
  const uint64_t blocks = layout.num_blocks();
  const uint64_t own = layout.ShardEndBlock(shard) - layout.ShardFirstBlock(shard);
  if (ratio == 1 || own == 0 || own == blocks) return 0;
  const double k = static_cast<double>(SelectedBlockCount(blocks, ratio));
  // ln q, q = (1 - s/B)^k: drawing without replacement misses less often.
  const double log_miss =
      k * std::log1p(-static_cast<double>(own) / static_cast<double>(blocks));
  const double steps = std::ceil(std::log(1e-12) / log_miss);
  return steps >= static_cast<double>(kUnlimited) ? kUnlimited : static_cast<uint64_t>(steps);
}

}  // namespace

uint64_t PushPullStepWindow(const v1::JobConfig& config, const BlockLayout& layout,
                            uint32_t shard) {
  const absl::StatusOr<AlgorithmInfo> algorithm = FindAlgorithm(config.algorithm().name());
  if (!algorithm.ok() || algorithm->exchange != Exchange::kAverages) return kUnlimited;
  const uint64_t lag = config.cluster().max_step_lag();
  const uint64_t missed = MissedSteps(config.algorithm(), layout, shard);
  const uint64_t steps = missed > kUnlimited - lag ? kUnlimited : lag + missed;
  return SaturatingMul(steps, std::max<uint32_t>(1, config.algorithm().period()));
}

}  // namespace cserps
