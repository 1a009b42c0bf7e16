// The traffic of one kind of RPC, counted at either end: the bytes of its
// requests (what a client pushes and a server receives), the bytes of its
// replies (what a server sends and a client pulls), and the payload floats
// the requests carry. The services of a server shard count their calls with
// it, and so can the worker's client.
//
// Thread safety: every method may be called from any thread. The counts are
// independent relaxed atomics: each is exact and never goes down, but a
// Snapshot taken while calls are counted may hold a request without its
// floats or reply yet.
#ifndef CSERPS_COMMON_TRAFFIC_COUNTER_H_
#define CSERPS_COMMON_TRAFFIC_COUNTER_H_

#include <atomic>
#include <cstdint>

namespace cserps {

// A TrafficCounter's counts at one moment.
struct TrafficCounts {
  uint64_t request_bytes = 0;
  uint64_t reply_bytes = 0;
  uint64_t request_floats = 0;  // payload values only, not their framing
};

class TrafficCounter {
 public:
  // Counts a request of `bytes` (its serialized size) carrying `floats`
  // payload values.
  void AddRequest(uint64_t bytes, uint64_t floats = 0) {
    request_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    if (floats != 0) request_floats_.fetch_add(floats, std::memory_order_relaxed);
  }
  // Counts a reply of `bytes`.
  void AddReply(uint64_t bytes) { reply_bytes_.fetch_add(bytes, std::memory_order_relaxed); }

  TrafficCounts Snapshot() const {
    return {request_bytes_.load(std::memory_order_relaxed),
            reply_bytes_.load(std::memory_order_relaxed),
            request_floats_.load(std::memory_order_relaxed)};
  }

 private:
  std::atomic<uint64_t> request_bytes_{0};
  std::atomic<uint64_t> reply_bytes_{0};
  std::atomic<uint64_t> request_floats_{0};
};

}  // namespace cserps

#endif  // CSERPS_COMMON_TRAFFIC_COUNTER_H_
