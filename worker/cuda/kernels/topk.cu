#include "worker/cuda/kernels/topk.h"

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/grid.h"

namespace cserps {
namespace cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr uint32_t kInfBits = 0x7f800000u;
// Keys are < 2^63: magnitude bits (31) above 32 position bits.
constexpr int kKeyBits = 63;

size_t AlignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Bits needed to hold every position below n (at least 1).
int PositionBits(uint64_t n) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) < n) ++bits;
  return bits;
}

// The workspace, carved in a fixed order so that the size query and the
// launch agree.
struct Layout {
  size_t keys_a = 0, keys_b = 0, pos_a = 0, pos_b = 0, temp = 0;
  size_t temp_bytes = 0;
  size_t total = 0;
};

__global__ void MakeKeysKernel(const float* values, uint32_t n,
                               uint64_t* keys) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    uint32_t magnitude = __float_as_uint(values[i]) & 0x7fffffffu;
    if (magnitude > kInfBits) magnitude = kInfBits;  // NaN ranks as infinity
    keys[i] = (uint64_t{magnitude} << 32) | (0xffffffffu - static_cast<uint32_t>(i));
  }
}

__global__ void KeyPositionsKernel(const uint64_t* keys, uint32_t k,
                                   uint32_t* positions) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < k;
       i += uint64_t{gridDim.x} * blockDim.x) {
    positions[i] = 0xffffffffu - static_cast<uint32_t>(keys[i]);
  }
}

__global__ void AllPositionsKernel(const float* values, uint32_t n,
                                   uint32_t* positions, float* selected) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    positions[i] = static_cast<uint32_t>(i);
    selected[i] = values[i];
  }
}

__global__ void SelectKernel(const float* values, const uint32_t* sorted,
                             uint32_t k, uint32_t* positions, float* selected) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < k;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t p = sorted[i];
    positions[i] = p;
    selected[i] = values[p];
  }
}

absl::StatusOr<Layout> MakeLayout(uint64_t n, uint64_t k) {
  if (n >= (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TopK: ", n, " values; positions are 32-bit, so n must be < 2^32"));
  }
  Layout layout;
  if (k == 0 || k >= n) return layout;
  const uint32_t items = static_cast<uint32_t>(n);
  const uint32_t kept = static_cast<uint32_t>(k);
  size_t sort_keys = 0, sort_positions = 0;
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  CSERPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
      nullptr, sort_keys, keys, items, 0, kKeyBits));
  cub::DoubleBuffer<uint32_t> positions(nullptr, nullptr);
  CSERPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeys(
      nullptr, sort_positions, positions, kept, 0, PositionBits(n)));
  size_t offset = 0;
  layout.keys_a = offset;
  offset += AlignUp(n * sizeof(uint64_t));
  layout.keys_b = offset;
  offset += AlignUp(n * sizeof(uint64_t));
  layout.pos_a = offset;
  offset += AlignUp(k * sizeof(uint32_t));
  layout.pos_b = offset;
  offset += AlignUp(k * sizeof(uint32_t));
  layout.temp = offset;
  layout.temp_bytes = std::max(sort_keys, sort_positions);
  layout.total = offset + AlignUp(layout.temp_bytes);
  return layout;
}

}  // namespace

absl::StatusOr<size_t> TopKWorkspaceBytes(uint64_t n, uint64_t k) {
  ASSIGN_OR_RETURN(const Layout layout, MakeLayout(n, k));
  return layout.total;
}

absl::Status LaunchTopK(const float* values, uint64_t n, uint64_t k,
                        void* workspace, size_t workspace_bytes,
                        uint32_t* positions, float* selected,
                        cudaStream_t stream) {
  ASSIGN_OR_RETURN(const Layout layout, MakeLayout(n, k));
  if (k == 0 || n == 0) return absl::OkStatus();
  const uint32_t items = static_cast<uint32_t>(n);
  if (k >= n) {
    AllPositionsKernel<<<GridBlocks(n), kThreads, 0, stream>>>(values, items,
                                                          positions, selected);
    CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("AllPositionsKernel");
    return absl::OkStatus();
  }
  if (workspace_bytes < layout.total) {
    return absl::InvalidArgumentError(
        absl::StrCat("TopK: workspace of ", workspace_bytes, " bytes; n = ", n,
                     ", k = ", k, " needs ", layout.total));
  }
  const uint32_t kept = static_cast<uint32_t>(k);
  char* base = static_cast<char*>(workspace);
  cub::DoubleBuffer<uint64_t> keys(
      reinterpret_cast<uint64_t*>(base + layout.keys_a),
      reinterpret_cast<uint64_t*>(base + layout.keys_b));
  cub::DoubleBuffer<uint32_t> sorted(
      reinterpret_cast<uint32_t*>(base + layout.pos_a),
      reinterpret_cast<uint32_t*>(base + layout.pos_b));
  void* temp = base + layout.temp;

  MakeKeysKernel<<<GridBlocks(n), kThreads, 0, stream>>>(values, items,
                                                     keys.Current());
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("MakeKeysKernel");
  size_t temp_bytes = layout.temp_bytes;
  CSERPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
      temp, temp_bytes, keys, items, 0, kKeyBits, stream));
  KeyPositionsKernel<<<GridBlocks(k), kThreads, 0, stream>>>(
      keys.Current(), kept, sorted.Current());
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("KeyPositionsKernel");
  temp_bytes = layout.temp_bytes;
  CSERPS_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeys(
      temp, temp_bytes, sorted, kept, 0, PositionBits(n), stream));
  SelectKernel<<<GridBlocks(k), kThreads, 0, stream>>>(values, sorted.Current(),
                                                   kept, positions, selected);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("SelectKernel");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace cserps
