// One PushPull round of the PS client (ps_client.h), shard by shard: the
// chunking, the requests (over gRPC, or the shard's bulk channel,
// bulk_channel.h), the checks of the replies, and the retries of chunks
// that lost their connection: sent again over gRPC (a broken bulk channel
// is reconnected at the next round) with capped exponential backoff until
// the round's deadline. The server counts a rank's push once per round, so
// a retry of a push that arrived is answered from the round.
#ifndef CSERPS_WORKER_PS_PUSH_PULL_ROUND_H_
#define CSERPS_WORKER_PS_PUSH_PULL_ROUND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/block_layout.h"
#include "common/traffic_counter.h"
#include "cserps/v1/parameter_server.grpc.pb.h"
#include "worker/ps/bulk_channel.h"
#include "worker/ps/sharded_average.h"

namespace cserps {

// What a PushPull round needs of its client; every pointer outlives the
// round.
struct RoundSetup {
  const std::vector<std::unique_ptr<v1::ParameterServer::Stub>>* stubs = nullptr;
  const std::vector<std::string>* addresses = nullptr;
  uint64_t fingerprint = 0;
  uint32_t rank = 0;
  v1::Stream stream = v1::GRAD;
  uint64_t step = 0;
  uint32_t ratio = 1;
  float weight = 1;
  float lr = 0;
  uint64_t chunk_floats = 0;
  absl::Duration deadline;
  // Of one gRPC attempt (AttemptDeadline); the deadline bounds every attempt.
  absl::Duration attempt_timeout = absl::InfiniteDuration();
  // By shard: the bulk channel its chunks go over; null (or empty): gRPC.
  // Shared: a client replaces a broken channel at its next round, while a
  // round begun before may still wait on it.
  std::vector<std::shared_ptr<BulkChannel>> bulk;
  TrafficCounter* total = nullptr;   // every call's bytes
  TrafficCounter* traffic = nullptr;  // the stream's
  std::atomic<int64_t>* waited_nanos = nullptr;
  std::atomic<uint64_t>* retries = nullptr;  // chunks sent again
  // By shard: the members its latest reply reported
  // (PushPullResponse.members).
  std::atomic<uint32_t>* members = nullptr;
};

// BeginShardedAverage's round: the caller gathers and scatters.
std::unique_ptr<ShardedAverage> MakePushPullRound(RoundSetup setup,
                                                  std::vector<uint64_t> payload_sizes);

// AverageBlocks' round: `payloads` (by shard; empty for the shards the
// round does not send to) gathered from `values` and the means scattered
// into `mean`, both model-sized.
absl::Status RunHostSpanRound(RoundSetup setup, std::vector<ShardPayload> payloads,
                              absl::Span<const float> values, absl::Span<float> mean);

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_PUSH_PULL_ROUND_H_
