// Inputs of the local-group tests, shared by every implementation's.
#ifndef CSERPS_TESTS_WORKER_GROUP_GROUP_INPUTS_H_
#define CSERPS_TESTS_WORKER_GROUP_GROUP_INPUTS_H_

#include <cstdint>
#include <cstring>
#include <vector>

namespace cserps {

// Member r's input: floats of very different magnitudes, so that the sum's
// bits depend on the order of the additions (e.g. (1e8 + 1) - 1e8 = 0 but
// (1e8 - 1e8) + 1 = 1 in float32).
inline std::vector<float> Input(uint32_t r, size_t n, uint32_t round) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch ((i + r) % 3) {
      case 0: v[i] = 1e8f; break;
      case 1: v[i] = 1.0f + 0.37f * static_cast<float>(r + round) + 1e-3f * i; break;
      default: v[i] = -1e8f; break;
    }
  }
  return v;
}

// The sum of every member's Input in local-rank order, in float32.
inline std::vector<float> OrderedSum(uint32_t size, size_t n, uint32_t round) {
  std::vector<float> sum = Input(0, n, round);
  for (uint32_t r = 1; r < size; ++r) {
    const std::vector<float> in = Input(r, n, round);
    for (size_t i = 0; i < n; ++i) sum[i] += in[i];
  }
  return sum;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace cserps

#endif  // CSERPS_TESTS_WORKER_GROUP_GROUP_INPUTS_H_
