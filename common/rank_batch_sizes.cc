#include "common/rank_batch_sizes.h"

#include <algorithm>
#include <utility>

namespace cserps {
namespace {

// cluster.local_size, where a config without defaults leaves it 0.
uint32_t LocalSize(const v1::JobConfig& config) {
  return std::max<uint32_t>(1, config.cluster().local_size());
}

}  // namespace

std::vector<uint32_t> RankBatchSizes(const v1::JobConfig& config) {
  const v1::DataConfig& data = config.data();
  if (data.rank_batch_sizes_size() > 0) {
    return {data.rank_batch_sizes().begin(), data.rank_batch_sizes().end()};
  }
  if (data.rank_speeds_size() > 0) {
    // Proportional sampling: the total of (worker processes) * batch_size
    // split in proportion to the speeds by largest remainder (ties to the
    // lower rank), each rank at least 1, that one taken from the largest
    // share (validation keeps batch_size >= 1, so the total has them).
    const uint32_t n = config.cluster().num_workers() * LocalSize(config);
    const uint64_t total = uint64_t{data.batch_size()} * n;
    double speed_sum = 0;
    for (float s : data.rank_speeds()) speed_sum += s;
    std::vector<uint32_t> sizes(n);
    std::vector<std::pair<double, uint32_t>> remainders;
    uint64_t given = 0;
    for (uint32_t r = 0; r < n; ++r) {
      const double exact = total * (data.rank_speeds(r) / speed_sum);
      sizes[r] = static_cast<uint32_t>(exact);
      given += sizes[r];
      remainders.push_back({-(exact - sizes[r]), r});
    }
    std::sort(remainders.begin(), remainders.end());
    for (uint64_t i = 0; given < total; ++i, ++given) ++sizes[remainders[i % n].second];
    for (uint32_t& s : sizes) {
      if (s == 0) {
        s = 1;
        --*std::max_element(sizes.begin(), sizes.end());
      }
    }
    return sizes;
  }
  return std::vector<uint32_t>(config.cluster().num_workers() * LocalSize(config),
                               data.batch_size());
}

}  // namespace cserps
