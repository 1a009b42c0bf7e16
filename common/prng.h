// A counter-based integer PRNG: the n-th output of a stream depends only on
// (key, n), so every process that knows the key can compute any output
// without state, and every C++ standard library gives the same numbers.
// docs/protocol.md specifies it bit for bit.
#ifndef CSERPS_COMMON_PRNG_H_
#define CSERPS_COMMON_PRNG_H_

#include <cstdint>

namespace cserps {

// SplitMix64's finaliser: a bijective 64-bit mixer.
constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Derives a stream key from a parent key and a label (e.g. rank, epoch).
constexpr uint64_t DeriveKey(uint64_t key, uint64_t label) {
  return Mix64(key ^ Mix64(label + 0x9e3779b97f4a7c15ULL));
}

// A sequential view of the counter-based stream `key`.
class CounterRng {
 public:
  explicit constexpr CounterRng(uint64_t key) : key_(key) {}

  // Output n of the stream is Mix64(key + (n + 1) * golden gamma).
  uint64_t Next() { return Mix64(key_ + (++counter_) * 0x9e3779b97f4a7c15ULL); }

  // Uniform integer in [0, bound), bound > 0, by Lemire's multiply-and-reject
  // method on 64-bit outputs: integer-only and unbiased.
  uint64_t Below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

  // Uniform float in [0, 1) with 24 random bits.
  float UniformFloat() { return static_cast<float>(Next() >> 40) * 0x1.0p-24f; }

  uint64_t counter() const { return counter_; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace cserps

#endif  // CSERPS_COMMON_PRNG_H_
