#include "common/grbs.h"

#include "absl/numeric/bits.h"
#include "common/prng.h"
#include "common/status.h"

namespace cserps {

// "GRBS" in ASCII: separates selection streams from data and init streams.
constexpr uint64_t kGrbsLabel = 0x4752425300000000ULL;

uint64_t SelectedBlockCount(uint64_t num_blocks, uint32_t ratio) {
  CSERPS_CHECK(ratio >= 1);
  if (num_blocks == 0) return 0;
  const uint64_t m = (num_blocks + ratio / 2) / ratio;
  return m == 0 ? 1 : m;
}

uint64_t GrbsKey(uint64_t job_seed, int stream, uint64_t step) {
  return DeriveKey(DeriveKey(DeriveKey(job_seed, kGrbsLabel),
                             static_cast<uint64_t>(stream)),
                   step);
}

std::vector<uint64_t> SelectBlocks(uint64_t job_seed, int stream, uint64_t step,
                                   uint32_t ratio, uint64_t num_blocks) {
  const uint64_t m = SelectedBlockCount(num_blocks, ratio);
  std::vector<uint64_t> blocks;
  blocks.reserve(m);
  if (m == num_blocks) {
    for (uint64_t b = 0; b < num_blocks; ++b) blocks.push_back(b);
    return blocks;
  }
  // Floyd: for j = N-m .. N-1 draw t uniform in [0, j]; take t unless it is
  // taken already, else take j. Every m-subset is equally likely.
  CounterRng rng(GrbsKey(job_seed, stream, step));
  // One bit per block, read back a word at a time: testing each block's bit
  // cost far more than the m draws where m is small.
  std::vector<uint64_t> taken((num_blocks + 63) / 64, 0);
  for (uint64_t j = num_blocks - m; j < num_blocks; ++j) {
    const uint64_t t = rng.Below(j + 1);
    const uint64_t b = (taken[t / 64] >> (t % 64)) & 1 ? j : t;
    taken[b / 64] |= uint64_t{1} << (b % 64);
  }
  for (uint64_t w = 0; w < taken.size(); ++w) {
    for (uint64_t bits = taken[w]; bits != 0; bits &= bits - 1) {
      blocks.push_back(w * 64 + static_cast<uint64_t>(absl::countr_zero(bits)));
    }
  }
  return blocks;
}

}  // namespace cserps
