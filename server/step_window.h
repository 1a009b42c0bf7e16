// How far ahead of a shard's newest completed step a PushPull may open a
// round (docs/protocol.md 7.8).
#ifndef CSERPS_SERVER_STEP_WINDOW_H_
#define CSERPS_SERVER_STEP_WINDOW_H_

#include <cstdint>

#include "common/block_layout.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// The window L of `shard`'s PushPull rounds, in steps:
// (cluster.max_step_lag + g) · max(1, algorithm.period) for algorithms that
// train in PushPull rounds, unlimited for the others (their PushPull rounds
// are checkpoints' and final averages, at steps their own exchange's window
// has reached). Periodic algorithms push only every H steps. g covers the
// steps whose GRBS rounds select no block of the shard, which it never
// sees: with the job's largest ratio R, a step's k = SelectedBlockCount(B, R)
// blocks miss the shard's s of B with probability q <= (1 - s/B)^k, and g is
// the fewest steps for which q^g < 10^-12 (0 without ratios above 1 or
// with one shard).
uint64_t PushPullStepWindow(const v1::JobConfig& config, const BlockLayout& layout,
                            uint32_t shard);

}  // namespace cserps

#endif  // CSERPS_SERVER_STEP_WINDOW_H_
