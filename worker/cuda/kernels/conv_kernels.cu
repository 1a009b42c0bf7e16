#include "worker/cuda/kernels/conv_kernels.h"

#include <algorithm>

#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/grid.h"

namespace cserps {
namespace cuda {
namespace {

__global__ void Im2ColKernel(Conv2dShape s, const float* x, float* cols) {
  const size_t k = s.kernel, hw = s.height * s.width;
  const size_t columns = s.images * hw;
  const long long pad = static_cast<long long>(k / 2);
  const size_t count = s.in_channels * k * k * columns;
  for (size_t e = blockIdx.x * size_t{blockDim.x} + threadIdx.x; e < count;
       e += size_t{gridDim.x} * blockDim.x) {
    const size_t r = e / columns, c = e % columns;
    const size_t i = r / (k * k), ky = r / k % k, kx = r % k;
    const size_t n = c / hw, p = c % hw;
    const long long iy = static_cast<long long>(p / s.width + ky) - pad;
    const long long ix = static_cast<long long>(p % s.width + kx) - pad;
    float v = 0.0f;
    if (iy >= 0 && iy < static_cast<long long>(s.height) && ix >= 0 &&
        ix < static_cast<long long>(s.width)) {
      v = x[((n * s.in_channels + i) * s.height + static_cast<size_t>(iy)) *
                s.width +
            static_cast<size_t>(ix)];
    }
    cols[e] = v;
  }
}

__global__ void Col2ImKernel(Conv2dShape s, const float* cols, float* dx) {
  const size_t k = s.kernel, hw = s.height * s.width;
  const size_t columns = s.images * hw;
  const long long pad = static_cast<long long>(k / 2);
  const long long height = static_cast<long long>(s.height);
  const long long width = static_cast<long long>(s.width);
  const size_t count = s.images * s.in_channels * hw;
  for (size_t e = blockIdx.x * size_t{blockDim.x} + threadIdx.x; e < count;
       e += size_t{gridDim.x} * blockDim.x) {
    const size_t plane = e / hw;  // n * in_channels + i
    const size_t i = plane % s.in_channels, n = plane / s.in_channels;
    const long long iy = static_cast<long long>(e % hw / s.width);
    const long long ix = static_cast<long long>(e % s.width);
    float sum = 0.0f;
    for (size_t ky = 0; ky < k; ++ky) {
      // Output row oy read this pixel through kernel row ky when
      // oy + ky - pad == iy.
      const long long oy = iy + pad - static_cast<long long>(ky);
      if (oy < 0 || oy >= height) continue;
      for (size_t kx = 0; kx < k; ++kx) {
        const long long ox = ix + pad - static_cast<long long>(kx);
        if (ox < 0 || ox >= width) continue;
        sum += cols[((i * k + ky) * k + kx) * columns + n * hw +
                    static_cast<size_t>(oy * width + ox)];
      }
    }
    dx[e] = sum;
  }
}

__global__ void BiasMaxPoolReluKernel(Conv2dShape s, const float* conv,
                                      const float* b, float* pooled,
                                      uint8_t* argmax) {
  const size_t w = s.width, hw = s.height * s.width;
  const size_t ph = s.height / 2, pw = s.width / 2;
  const size_t columns = s.images * hw;
  const size_t count = s.images * s.out_channels * ph * pw;
  for (size_t q = blockIdx.x * size_t{blockDim.x} + threadIdx.x; q < count;
       q += size_t{gridDim.x} * blockDim.x) {
    const size_t px = q % pw, py = q / pw % ph;
    const size_t plane = q / (pw * ph);  // n * out_channels + o
    const size_t o = plane % s.out_channels, n = plane / s.out_channels;
    const float* top = conv + o * columns + n * hw + 2 * py * w + 2 * px;
    const float bias = b[o];
    const float window[4] = {top[0] + bias, top[1] + bias, top[w] + bias,
                             top[w + 1] + bias};
    int best = 0;
    for (int j = 1; j < 4; ++j) {
      if (window[j] > window[best]) best = j;
    }
    const float v = window[best];
    pooled[q] = v > 0.0f ? v : 0.0f;
    argmax[q] = static_cast<uint8_t>(best);
  }
}

__global__ void MaxPoolBackwardKernel(Conv2dShape s, const float* dpooled,
                                      const uint8_t* argmax, float* dconv) {
  const size_t w = s.width, hw = s.height * s.width;
  const size_t ph = s.height / 2, pw = s.width / 2;
  const size_t columns = s.images * hw;
  const size_t count = s.out_channels * columns;
  for (size_t e = blockIdx.x * size_t{blockDim.x} + threadIdx.x; e < count;
       e += size_t{gridDim.x} * blockDim.x) {
    const size_t o = e / columns, c = e % columns;
    const size_t n = c / hw, y = c % hw / w, x = c % w;
    float g = 0.0f;
    if (y / 2 < ph && x / 2 < pw) {
      const size_t q = ((n * s.out_channels + o) * ph + y / 2) * pw + x / 2;
      if (size_t{argmax[q]} == 2 * (y % 2) + x % 2) g = dpooled[q];
    }
    dconv[e] = g;
  }
}

// One block per channel.
__global__ void ChannelSumsKernel(size_t columns, const float* dconv,
                                  bool accumulate, float* db) {
  __shared__ double partial[kThreads];
  const float* row = dconv + blockIdx.x * columns;
  double sum = 0.0;
  for (size_t j = threadIdx.x; j < columns; j += kThreads) sum += row[j];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float total = static_cast<float>(partial[0]);
    db[blockIdx.x] = accumulate ? db[blockIdx.x] + total : total;
  }
}

}  // namespace

absl::Status LaunchIm2Col(const Conv2dShape& shape, const float* x, float* cols,
                          cudaStream_t stream) {
  const size_t n = shape.in_channels * shape.kernel * shape.kernel *
                   shape.images * shape.height * shape.width;
  if (n == 0) return absl::OkStatus();
  Im2ColKernel<<<GridBlocks(n), kThreads, 0, stream>>>(shape, x, cols);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("Im2ColKernel");
  return absl::OkStatus();
}

absl::Status LaunchCol2Im(const Conv2dShape& shape, const float* cols,
                          float* dx, cudaStream_t stream) {
  const size_t n =
      shape.images * shape.in_channels * shape.height * shape.width;
  if (n == 0) return absl::OkStatus();
  Col2ImKernel<<<GridBlocks(n), kThreads, 0, stream>>>(shape, cols, dx);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("Col2ImKernel");
  return absl::OkStatus();
}

absl::Status LaunchBiasMaxPoolRelu(const Conv2dShape& shape, const float* conv,
                                   const float* b, float* pooled,
                                   uint8_t* argmax, cudaStream_t stream) {
  const size_t n = shape.images * shape.out_channels * (shape.height / 2) *
                   (shape.width / 2);
  if (n == 0) return absl::OkStatus();
  BiasMaxPoolReluKernel<<<GridBlocks(n), kThreads, 0, stream>>>(
      shape, conv, b, pooled, argmax);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("BiasMaxPoolReluKernel");
  return absl::OkStatus();
}

absl::Status LaunchMaxPoolBackward(const Conv2dShape& shape,
                                   const float* dpooled, const uint8_t* argmax,
                                   float* dconv, cudaStream_t stream) {
  const size_t n =
      shape.out_channels * shape.images * shape.height * shape.width;
  if (n == 0) return absl::OkStatus();
  MaxPoolBackwardKernel<<<GridBlocks(n), kThreads, 0, stream>>>(
      shape, dpooled, argmax, dconv);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("MaxPoolBackwardKernel");
  return absl::OkStatus();
}

absl::Status LaunchChannelSums(size_t out_channels, size_t columns,
                               const float* dconv, bool accumulate, float* db,
                               cudaStream_t stream) {
  if (out_channels == 0) return absl::OkStatus();
  ChannelSumsKernel<<<static_cast<unsigned>(out_channels), kThreads, 0,
                      stream>>>(columns, dconv, accumulate, db);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("ChannelSumsKernel");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace cserps
