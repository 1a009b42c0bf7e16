// The element-wise and reduction kernels of the CUDA model (cuda_model.h);
// the matrix products are cuBLAS calls there. Internal to worker/cuda.
//
// Every launcher enqueues on `stream` and returns at once (no
// synchronisation, no allocation); the Status reports a failed launch only,
// a fault inside the kernel surfaces at the next synchronising call. All
// matrices are row-major; pointers are device pointers. Each kernel mirrors
// one CPU helper of worker/model and says which.
#ifndef CSERPS_WORKER_CUDA_KERNELS_MODEL_KERNELS_H_
#define CSERPS_WORKER_CUDA_KERNELS_MODEL_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace cserps {
namespace cuda {

// y[r][j] += b[j] for every row of y (rows x out); then, when `relu`,
// y = y > 0 ? y : 0 (ReluInPlace: a NaN becomes 0).
absl::Status LaunchBiasActivation(size_t rows, size_t out, const float* b,
                                  bool relu, float* y, cudaStream_t stream);

// grad[i] = 0 wherever !(activation[i] > 0), for i < n (ReluBackwardInPlace).
absl::Status LaunchReluBackward(size_t n, const float* activation, float* grad,
                                cudaStream_t stream);

// db[j] = sum over rows of dy[r][j] (dy: rows x out), overwriting db; the
// bias half of LinearBackward. Summed in a fixed order: deterministic.
absl::Status LaunchBiasGradient(size_t rows, size_t out, const float* dy,
                                float* db, cudaStream_t stream);

// Per row r of `logits` (rows x classes), as SoftmaxCrossEntropy and
// CountTop1Correct compute it: row_loss[r] = log(sum_j exp(z_j - m)) -
// (z_label - m) with m the row maximum, reduced in double;
// row_correct[r] = 1 when the largest logit (lowest index among ties) is the
// label, else 0; and, unless dlogits is null, dlogits[r][j] =
// grad_scale * (softmax(z)_j - [j == label]). A label >= classes (which the
// device cannot reject) gives a NaN row loss and a NaN gradient row.
absl::Status LaunchSoftmaxCrossEntropy(size_t rows, size_t classes,
                                       const float* logits,
                                       const uint8_t* labels, float grad_scale,
                                       float* dlogits, double* row_loss,
                                       uint32_t* row_correct,
                                       cudaStream_t stream);

// Sums row_loss and row_correct over `rows` (> 0) rows in a fixed order
// (deterministic) and writes whichever outputs are non-null: *mean_loss =
// float(sum / rows), *loss_sum = sum, *correct = number of correct rows.
absl::Status LaunchSumRows(size_t rows, const double* row_loss,
                           const uint32_t* row_correct, float* mean_loss,
                           double* loss_sum, unsigned long long* correct,
                           cudaStream_t stream);

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_MODEL_KERNELS_H_
