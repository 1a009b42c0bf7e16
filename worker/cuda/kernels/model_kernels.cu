#include "worker/cuda/kernels/model_kernels.h"

#include <algorithm>
#include <cmath>

#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/grid.h"

namespace cserps {
namespace cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__global__ void BiasActivationKernel(size_t rows, size_t out, const float* b,
                                     bool relu, float* y) {
  const size_t n = rows * out;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    float v = y[i] + b[i % out];
    if (relu) v = v > 0.0f ? v : 0.0f;
    y[i] = v;
  }
}

__global__ void ReluBackwardKernel(size_t n, const float* activation,
                                   float* grad) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if (!(activation[i] > 0.0f)) grad[i] = 0.0f;
  }
}

// Block (32, kBiasRows): threadIdx.x picks the column, threadIdx.y a stride
// of rows; the kBiasRows partial sums are then added in a fixed order.
constexpr int kBiasRows = 8;

__global__ void BiasGradientKernel(size_t rows, size_t out, const float* dy,
                                   float* db) {
  __shared__ float partial[kBiasRows][kWarp];
  const size_t j = blockIdx.x * size_t{kWarp} + threadIdx.x;
  float sum = 0.0f;
  if (j < out) {
    for (size_t r = threadIdx.y; r < rows; r += kBiasRows) sum += dy[r * out + j];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < out) {
    float total = 0.0f;
    for (int k = 0; k < kBiasRows; ++k) total += partial[k][threadIdx.x];
    db[j] = total;
  }
}

// One warp per row. The xor butterflies leave every lane with the same,
// bitwise identical result (each step combines two disjoint halves with a
// commutative operation).
__global__ void SoftmaxCrossEntropyKernel(size_t rows, size_t classes,
                                          const float* logits,
                                          const uint8_t* labels,
                                          float grad_scale, float* dlogits,
                                          double* row_loss,
                                          uint32_t* row_correct) {
  const size_t row =
      blockIdx.x * size_t{blockDim.x / kWarp} + threadIdx.x / kWarp;
  const unsigned lane = threadIdx.x % kWarp;
  if (row >= rows) return;  // uniform across the warp
  const float* z = logits + row * classes;
  const size_t label = labels[row];

  float max_z = -INFINITY;
  long long best = -1;
  float best_z = -INFINITY;
  for (size_t j = lane; j < classes; j += kWarp) {
    const float v = z[j];
    max_z = v > max_z ? v : max_z;
    if (best < 0 || v > best_z) {
      best = static_cast<long long>(j);
      best_z = v;
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other_max = __shfl_xor_sync(kFullMask, max_z, offset);
    max_z = other_max > max_z ? other_max : max_z;
    const float other_z = __shfl_xor_sync(kFullMask, best_z, offset);
    const long long other = __shfl_xor_sync(kFullMask, best, offset);
    if (other >= 0 &&
        (best < 0 || other_z > best_z || (other_z == best_z && other < best))) {
      best = other;
      best_z = other_z;
    }
  }

  double sum_exp = 0.0;
  for (size_t j = lane; j < classes; j += kWarp) {
    sum_exp += exp(static_cast<double>(z[j]) - max_z);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    sum_exp += __shfl_xor_sync(kFullMask, sum_exp, offset);
  }
  const double log_sum = log(sum_exp);
  const bool valid = label < classes;

  if (lane == 0) {
    row_loss[row] = valid ? log_sum - (static_cast<double>(z[label]) - max_z)
                          : static_cast<double>(NAN);
    row_correct[row] = valid && best == static_cast<long long>(label) ? 1u : 0u;
  }
  if (dlogits != nullptr) {
    float* dz = dlogits + row * classes;
    for (size_t j = lane; j < classes; j += kWarp) {
      const double p = exp(static_cast<double>(z[j]) - max_z - log_sum);
      dz[j] = valid ? static_cast<float>(grad_scale *
                                         (p - (j == label ? 1.0 : 0.0)))
                    : NAN;
    }
  }
}

// One block of kThreads; a power of two for the tree.
__global__ void SumRowsKernel(size_t rows, const double* row_loss,
                              const uint32_t* row_correct, float* mean_loss,
                              double* loss_sum, unsigned long long* correct) {
  __shared__ double loss[kThreads];
  __shared__ unsigned long long hits[kThreads];
  double l = 0.0;
  unsigned long long c = 0;
  for (size_t r = threadIdx.x; r < rows; r += kThreads) {
    l += row_loss[r];
    c += row_correct[r];
  }
  loss[threadIdx.x] = l;
  hits[threadIdx.x] = c;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      loss[threadIdx.x] += loss[threadIdx.x + half];
      hits[threadIdx.x] += hits[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (mean_loss != nullptr) {
      *mean_loss = static_cast<float>(loss[0] / static_cast<double>(rows));
    }
    if (loss_sum != nullptr) *loss_sum = loss[0];
    if (correct != nullptr) *correct = hits[0];
  }
}

}  // namespace

absl::Status LaunchBiasActivation(size_t rows, size_t out, const float* b,
                                  bool relu, float* y, cudaStream_t stream) {
  const size_t n = rows * out;
  if (n == 0) return absl::OkStatus();
  BiasActivationKernel<<<GridBlocks(n), kThreads, 0, stream>>>(
      rows, out, b, relu, y);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("BiasActivationKernel");
  return absl::OkStatus();
}

absl::Status LaunchReluBackward(size_t n, const float* activation, float* grad,
                                cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  ReluBackwardKernel<<<GridBlocks(n), kThreads, 0, stream>>>(
      n, activation, grad);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("ReluBackwardKernel");
  return absl::OkStatus();
}

absl::Status LaunchBiasGradient(size_t rows, size_t out, const float* dy,
                                float* db, cudaStream_t stream) {
  if (out == 0) return absl::OkStatus();
  const size_t blocks = (out + kWarp - 1) / kWarp;
  BiasGradientKernel<<<static_cast<unsigned>(blocks), dim3(kWarp, kBiasRows),
                       0, stream>>>(rows, out, dy, db);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("BiasGradientKernel");
  return absl::OkStatus();
}

absl::Status LaunchSoftmaxCrossEntropy(size_t rows, size_t classes,
                                       const float* logits,
                                       const uint8_t* labels, float grad_scale,
                                       float* dlogits, double* row_loss,
                                       uint32_t* row_correct,
                                       cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  constexpr size_t kRowsPerBlock = kThreads / kWarp;
  const size_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  SoftmaxCrossEntropyKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                              stream>>>(rows, classes, logits, labels,
                                        grad_scale, dlogits, row_loss,
                                        row_correct);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("SoftmaxCrossEntropyKernel");
  return absl::OkStatus();
}

absl::Status LaunchSumRows(size_t rows, const double* row_loss,
                           const uint32_t* row_correct, float* mean_loss,
                           double* loss_sum, unsigned long long* correct,
                           cudaStream_t stream) {
  SumRowsKernel<<<1, kThreads, 0, stream>>>(rows, row_loss, row_correct,
                                            mean_loss, loss_sum, correct);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("SumRowsKernel");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace cserps
