// RankBatchSizes: how many examples each worker process takes per step, as
// the job config (cserps.v1.JobConfig) gives them.
//
// Thread-compatible: it only reads its argument.
#ifndef CSERPS_COMMON_RANK_BATCH_SIZES_H_
#define CSERPS_COMMON_RANK_BATCH_SIZES_H_

#include <cstdint>
#include <vector>

#include "cserps/v1/config.pb.h"

namespace cserps {

// The per-process batch sizes (num_workers x local_size, node-major):
// data.rank_batch_sizes when set, else proportional to rank_speeds, else
// copies of data.batch_size. rank_speeds, when set, must have one entry per
// process, as ValidateJobConfig checks; a cluster.local_size of 0 counts as 1.
std::vector<uint32_t> RankBatchSizes(const v1::JobConfig& config);

}  // namespace cserps

#endif  // CSERPS_COMMON_RANK_BATCH_SIZES_H_
