// The launch shape of the grid-stride kernels of worker/cuda/: blocks of
// kThreads threads, and no more blocks than it takes to fill an H200 (more
// only adds scheduling work; the kernels stride over the rest).
#ifndef CSERPS_WORKER_CUDA_KERNELS_GRID_H_
#define CSERPS_WORKER_CUDA_KERNELS_GRID_H_

#include <algorithm>
#include <cstdint>

namespace cserps {
namespace cuda {

constexpr int kThreads = 256;  // a power of two, for the reduction trees

// Blocks for n elements, one thread each, capped at 65536.
inline unsigned GridBlocks(uint64_t n) {
  return static_cast<unsigned>(std::min<uint64_t>((n + kThreads - 1) / kThreads, 65536));
}

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_GRID_H_
