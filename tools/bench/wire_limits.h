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
// Each returns the median round (every member's rounds together), after
// `warmup` rounds, of `rounds` rounds.
#ifndef CSERPS_TOOLS_BENCH_WIRE_LIMITS_H_
#define CSERPS_TOOLS_BENCH_WIRE_LIMITS_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cserps {

struct ExchangeShape {
  int peers = 1;    // S: shards
  int members = 1;  // M
  size_t payload_bytes = 0;  // per member, split evenly over the peers
  int warmup = 2;
  int rounds = 20;
};

absl::StatusOr<absl::Duration> RawTcpRound(const ExchangeShape& shape);
absl::StatusOr<absl::Duration> PlainGrpcRound(const ExchangeShape& shape);
// The time of one memcpy of `bytes` (median of `rounds`).
absl::Duration MemcpyTime(size_t bytes, int rounds);

}  // namespace cserps

#endif  // CSERPS_TOOLS_BENCH_WIRE_LIMITS_H_
