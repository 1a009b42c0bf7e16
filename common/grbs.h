// GRBS: the global random block selection that every worker and every server
// computes identically from the job seed (docs/protocol.md, "Block
// selection"). A push carries values only; both sides derive the block ids.
#ifndef CSERPS_COMMON_GRBS_H_
#define CSERPS_COMMON_GRBS_H_

#include <cstdint>
#include <vector>

namespace cserps {

// Number of blocks selected at ratio R from num_blocks:
// m = max(1, round(num_blocks / R)) with round half up, in integers;
// m = num_blocks when R == 1; 0 when num_blocks == 0. R >= 1.
uint64_t SelectedBlockCount(uint64_t num_blocks, uint32_t ratio);

// The key of the selection stream for (job_seed, stream, step).
uint64_t GrbsKey(uint64_t job_seed, int stream, uint64_t step);

// The m distinct block ids of (job_seed, stream, step) at `ratio`, ascending:
// Robert Floyd's sampling of m out of num_blocks, each draw an unbiased
// bounded integer (Lemire) from CounterRng(GrbsKey(...)). R == 1 returns
// every block without drawing.
std::vector<uint64_t> SelectBlocks(uint64_t job_seed, int stream, uint64_t step,
                                   uint32_t ratio, uint64_t num_blocks);

}  // namespace cserps

#endif  // CSERPS_COMMON_GRBS_H_
