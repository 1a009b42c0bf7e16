// What the wire path could reach on this machine, measured by
// cserps-bench-wire in the same run as cserps itself, with the same shape of
// exchange: M members, each sending its payload split over S peers and
// getting the same bytes back, all members and peers in parallel, every
// connection on 127.0.0.1.
//
//   raw TCP: one socket per (member, peer); the peer's thread receives the
//     share and sends it back (a few lines of C++: the floor of what any
//     protocol on TCP can do here);
//   plain gRPC: one channel per (member, peer) to a callback generic
//     service that answers each unary call with its request's bytes;
//   memcpy: one thread copying a buffer of the payload's size.
//
// The exchanges keep their connections, and the peers' threads, open from
// Open to destruction, as cserps keeps its own across a case's slices.
#ifndef CSERPS_TOOLS_BENCH_WIRE_LIMITS_H_
#define CSERPS_TOOLS_BENCH_WIRE_LIMITS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cserps {

class LimitExchange {
 public:
  virtual ~LimitExchange() = default;
  // `rounds` rounds, after `warmup` more, of `payload_bytes` per member split
  // evenly over the peers, all members in parallel: every member's measured
  // rounds.
  virtual absl::StatusOr<std::vector<absl::Duration>> Rounds(size_t payload_bytes, int warmup,
                                                             int rounds) = 0;
};

absl::StatusOr<std::unique_ptr<LimitExchange>> OpenRawTcp(int peers, int members);
absl::StatusOr<std::unique_ptr<LimitExchange>> OpenPlainGrpc(int peers, int members);
// The time of one memcpy of `bytes` by one thread (median of `rounds`;
// copies under 16 MiB timed in batches), its buffers in cache where they fit.
absl::Duration MemcpyTime(size_t bytes, int rounds);

}  // namespace cserps

#endif  // CSERPS_TOOLS_BENCH_WIRE_LIMITS_H_
