// The kernels of a CNN conv stage on the device (cuda_model.h): im2col and
// its adjoint col2im around the cuBLAS products, bias + 2x2 max-pool + ReLU
// and its backward, and the bias gradient. Internal to worker/cuda.
//
// Same conventions as model_kernels.h: every launcher enqueues on `stream`
// and returns at once (no synchronisation, no allocation), the Status reports
// a failed launch only, pointers are device pointers. Shapes are the CPU's
// Conv2dShape (worker/model/conv2d_layer.h): `images` NCHW images of
// in_channels x height x width in, out_channels x height x width out, an odd
// kernel, stride 1, 'same' zero padding of kernel / 2.
//
// Between the products the convolution's output lives channel-major, as on
// the CPU: an out_channels x columns matrix, columns = images * height *
// width, column n * height * width + y * width + x for pixel (y, x) of image
// n. The im2col matrix has in_channels * kernel^2 rows (row (i * kernel +
// ky) * kernel + kx) and the same columns.
//
// Every kernel writes each output element from one thread, summing in a
// fixed order: no atomics, so runs repeat bit for bit.
#ifndef CSERPS_WORKER_CUDA_KERNELS_CONV_KERNELS_H_
#define CSERPS_WORKER_CUDA_KERNELS_CONV_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/model/conv2d_layer.h"

namespace cserps {
namespace cuda {

// cols (overwritten) = the im2col matrix of x (images x in_channels x
// height x width): cols[r][c] = x(n, i, y + ky - pad, x + kx - pad), or 0
// outside the image. The Im2Col of conv2d_layer.cc.
absl::Status LaunchIm2Col(const Conv2dShape& shape, const float* x, float* cols,
                          cudaStream_t stream);

// dx (images x in_channels x height x width, overwritten) = the adjoint of
// im2col: each input pixel sums, in (ky, kx) order, the cols entries that
// were copied from it. One thread per input pixel.
absl::Status LaunchCol2Im(const Conv2dShape& shape, const float* cols,
                          float* dx, cudaStream_t stream);

// From the channel-major product `conv` (out_channels x columns) and the
// bias b (out_channels): z = conv + b (float, as Conv2dForward adds it),
// then per 2x2 window of z, as MaxPoolForward then ReluInPlace do it:
// pooled (images x out_channels x height / 2 x width / 2, NCHW) = the
// window's maximum through ReLU (v > 0 ? v : 0), argmax (same size) = 2 * dy
// + dx of that maximum, the first in the order (0,0), (0,1), (1,0), (1,1)
// winning ties. An odd last row or column is in no window.
absl::Status LaunchBiasMaxPoolRelu(const Conv2dShape& shape, const float* conv,
                                   const float* b, float* pooled,
                                   uint8_t* argmax, cudaStream_t stream);

// dconv (out_channels x columns, channel-major, overwritten) = dpooled
// (NCHW, as pooled above) routed to each window's recorded maximum, 0
// everywhere else (MaxPoolBackward). One thread per dconv element.
absl::Status LaunchMaxPoolBackward(const Conv2dShape& shape,
                                   const float* dpooled, const uint8_t* argmax,
                                   float* dconv, cudaStream_t stream);

// db[o] = sum over the `columns` entries of row o of dconv (out_channels x
// columns), summed in double in a fixed order, then added as a float to
// db[o] when `accumulate` (a later group of images) or written otherwise.
absl::Status LaunchChannelSums(size_t out_channels, size_t columns,
                               const float* dconv, bool accumulate, float* db,
                               cudaStream_t stream);

}  // namespace cuda
}  // namespace cserps

#endif  // CSERPS_WORKER_CUDA_KERNELS_CONV_KERNELS_H_
