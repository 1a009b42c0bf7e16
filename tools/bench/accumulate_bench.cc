// cserps-bench-accumulate: what a dense round's sum costs the server, and
// what float accumulation would save. For M members' pushes of one chunk:
//   double:  the server's WeightedSum (server/round_table.h): products and
//            sums in double, the last push writing the mean;
//   kept:    the same, with the pushes' values kept for the round, as the
//            bulk transport's are: the first is read with the second;
//   kahan:   float sums with Kahan compensation, then the division;
//   float:   plain float sums, then the division;
//   pairwise: float sums in a tree over the ranks (0+1, 2+3, ..., then the
//            pairs of those), then the division: independent of arrival
//            order by construction, since every push is held until the last
//            has arrived (its memory: each push's floats for the round).
// Per variant: ns per pushed float, the floats of the mean that differ from
// the double's, and those that change when the members arrive in reverse
// order (each member's reply is one mean either way; this is whether the
// bits depend on arrival order). The heap is set up as cserps-server's
// (server_main.cc); --server_heap=false leaves glibc's defaults.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/prng.h"
#include "common/vector_clones.h"
#include "server/round_table.h"

ABSL_FLAG(int, members, 16, "Pushes per round.");
ABSL_FLAG(int, floats, 262144, "Floats per push (the default chunk: 1 MiB).");
ABSL_FLAG(int, rounds, 20, "Rounds timed per variant (median).");
ABSL_FLAG(bool, equal_weights, false,
          "Every push weighted 32, not 32, 33, 34: for 1, 2, 4, ... members the weight total "
          "is then a power of two, which the server divides by with a multiply.");
ABSL_FLAG(bool, server_heap, true, "Keep freed buffers in the heap, as cserps-server does.");

namespace cserps {
namespace {

using Pushes = std::vector<std::vector<float>>;

// `kept`: every push's values stay valid for the round (Contribution::keep),
// as the bulk transport's do, so the first is read with the second.
std::vector<float> DoubleMean(const Pushes& pushes, const std::vector<float>& weights,
                              bool reverse, bool kept) {
  const uint32_t m = static_cast<uint32_t>(pushes.size());
  auto at = [&](uint32_t i) { return reverse ? m - 1 - i : i; };
  const std::shared_ptr<const void> keep =
      kept ? std::make_shared<int>(0) : std::shared_ptr<const void>();
  WeightedSum sum({weights[at(0)], 0.0f, pushes[at(0)], keep}, m);
  for (uint32_t i = 0; i < m; ++i) {
    sum.Add(at(i), {weights[at(i)], 0.0f, pushes[at(i)], keep});
  }
  const RoundMean mean = sum.Mean();
  return std::vector<float>(mean->begin(), mean->end());
}

// The float variants compiled as the server's loops are (vector_clones.h).
CSERPS_VECTOR_CLONES
std::vector<float> FloatMean(const Pushes& pushes, const std::vector<float>& weights,
                             bool reverse, bool compensated) {
  const size_t n = pushes[0].size(), m = pushes.size();
  std::vector<float> sum(n, 0.0f), carry(n, 0.0f), mean(n);
  float total = 0.0f;
  for (size_t k = 0; k < m; ++k) {
    const size_t i = reverse ? m - 1 - k : k;
    const float w = weights[i];
    const float* v = pushes[i].data();
    if (compensated) {
      for (size_t j = 0; j < n; ++j) {
        const float y = w * v[j] - carry[j];
        const float t = sum[j] + y;
        carry[j] = (t - sum[j]) - y;
        sum[j] = t;
      }
    } else {
      for (size_t j = 0; j < n; ++j) sum[j] += w * v[j];
    }
    total += w;
  }
  for (size_t j = 0; j < n; ++j) mean[j] = sum[j] / total;
  return mean;
}

CSERPS_VECTOR_CLONES
std::vector<float> PairwiseMean(const Pushes& pushes, const std::vector<float>& weights) {
  const size_t n = pushes[0].size(), m = pushes.size();
  // The tree's leaves, in rank order: w_i v_i, two of them summed at once.
  std::vector<std::unique_ptr<float[]>> level((m + 1) / 2);
  for (size_t k = 0; k < level.size(); ++k) {
    level[k].reset(new float[n]);  // every float written below
    float* out = level[k].get();
    const float wa = weights[2 * k];
    const float* a = pushes[2 * k].data();
    if (2 * k + 1 < m) {
      const float wb = weights[2 * k + 1];
      const float* b = pushes[2 * k + 1].data();
      for (size_t j = 0; j < n; ++j) out[j] = wa * a[j] + wb * b[j];
    } else {
      for (size_t j = 0; j < n; ++j) out[j] = wa * a[j];
    }
  }
  for (size_t stride = 1; stride < level.size(); stride *= 2) {
    for (size_t k = 0; k + stride < level.size(); k += 2 * stride) {
      float* out = level[k].get();
      const float* in = level[k + stride].get();
      for (size_t j = 0; j < n; ++j) out[j] += in[j];
    }
  }
  float total = 0.0f;
  for (float w : weights) total += w;
  std::vector<float> mean(n);
  for (size_t j = 0; j < n; ++j) mean[j] = level[0][j] / total;
  return mean;
}

size_t Differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t d = 0;
  for (size_t j = 0; j < a.size(); ++j) d += std::memcmp(&a[j], &b[j], sizeof(float)) != 0;
  return d;
}

template <typename Fn>
double MedianNsPerFloat(Fn fn, int rounds, double floats) {
  std::vector<double> ns;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> mean = fn();
    const auto end = std::chrono::steady_clock::now();
    if (mean.empty()) return -1;
    ns.push_back(std::chrono::duration<double, std::nano>(end - start).count() / floats);
  }
  std::sort(ns.begin(), ns.end());
  return ns[ns.size() / 2];
}

int Run() {
  const int m = absl::GetFlag(FLAGS_members), n = absl::GetFlag(FLAGS_floats);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (m < 1 || n < 1 || rounds < 1) {
    std::fprintf(stderr, "--members, --floats and --rounds must be >= 1\n");
    return 2;
  }
  Pushes pushes(m, std::vector<float>(n));
  std::vector<float> weights(m);
  CounterRng rng(7);
  for (int i = 0; i < m; ++i) {
    weights[i] = absl::GetFlag(FLAGS_equal_weights) ? 32.0f
                                                    : 32.0f + static_cast<float>(i % 3);
    // Gradient-like values: mostly small, a spread of magnitudes.
    for (float& x : pushes[i]) {
      x = (rng.UniformFloat() - 0.5f) * (rng.UniformFloat() < 0.1f ? 10.0f : 0.01f);
    }
  }
  const double floats = static_cast<double>(m) * n;
  const std::vector<float> reference = DoubleMean(pushes, weights, false, false);
  std::printf("%d members x %d floats, median of %d rounds\n", m, n, rounds);
  std::printf("%-8s %12s %22s %24s\n", "variant", "ns/float", "differ from double",
              "change with order");
  auto report = [&](const char* name, auto mean_of) {
    const double ns = MedianNsPerFloat([&] { return mean_of(false); }, rounds, floats);
    const std::vector<float> forward = mean_of(false), backward = mean_of(true);
    std::printf("%-8s %12.3f %21.4f%% %23.4f%%\n", name, ns,
                100.0 * Differing(forward, reference) / n,
                100.0 * Differing(forward, backward) / n);
  };
  report("double", [&](bool reverse) { return DoubleMean(pushes, weights, reverse, false); });
  report("kept", [&](bool reverse) { return DoubleMean(pushes, weights, reverse, true); });
  report("kahan", [&](bool reverse) { return FloatMean(pushes, weights, reverse, true); });
  report("float", [&](bool reverse) { return FloatMean(pushes, weights, reverse, false); });
  report("pairwise", [&](bool) { return PairwiseMean(pushes, weights); });
  return 0;
}

}  // namespace
}  // namespace cserps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_server_heap)) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
  }
  return cserps::Run();
}
