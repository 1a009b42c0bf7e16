#include "worker/cuda/kernels/vector_kernels.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/grid.h"

namespace cserps {
namespace cuda {
namespace {

template <bool kDivide>
__global__ void ScaleKernel(size_t n, float factor, float* x) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    x[i] = kDivide ? __fdiv_rn(x[i], factor) : __fmul_rn(x[i], factor);
  }
}

__global__ void ScaleAddKernel(size_t n, float a, const float* p,
                               const float* e, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __fadd_rn(__fmul_rn(a, p[i]), e[i]);
  }
}

__global__ void AddDifferenceKernel(size_t n, const float* e, const float* a,
                                    const float* b, float* out) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    out[i] = __fadd_rn(e[i], __fsub_rn(a[i], b[i]));
  }
}

__global__ void AccumulateKernel(size_t n, float lr, float lambda,
                                 const float* g, const float* x, float* r) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float p = __fadd_rn(g[i], __fmul_rn(lambda, x[i]));
    r[i] = __fadd_rn(r[i], __fmul_rn(lr, p));
  }
}

template <ScatterOp kOp>
__global__ void ScatterSparseKernel(size_t count, const uint32_t* indices,
                                    const float* values, float divisor,
                                    float* x) {
  for (size_t e = blockIdx.x * size_t{blockDim.x} + threadIdx.x; e < count;
       e += size_t{gridDim.x} * blockDim.x) {
    const uint32_t j = indices[e];
    if (kOp == ScatterOp::kZero) {
      x[j] = 0.0f;
    } else if (kOp == ScatterOp::kAssignDivided) {
      x[j] = __fdiv_rn(values[e], divisor);
    } else {
      x[j] = __fsub_rn(x[j], __fdiv_rn(values[e], divisor));
    }
  }
}

template <bool kNesterov>
__global__ void ApplyMomentumKernel(size_t n, float beta, const float* u,
                                    float* m, float* x) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float next = __fadd_rn(__fmul_rn(beta, m[i]), u[i]);
    m[i] = next;
    const float step = kNesterov ? __fadd_rn(u[i], __fmul_rn(beta, next)) : next;
    x[i] = __fsub_rn(x[i], step);
  }
}

}  // namespace

absl::Status LaunchScale(size_t n, bool divide, float factor, float* x,
                         cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  if (divide) {
    ScaleKernel<true><<<GridBlocks(n), kThreads, 0, stream>>>(n, factor, x);
  } else {
    ScaleKernel<false><<<GridBlocks(n), kThreads, 0, stream>>>(n, factor, x);
  }
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleKernel");
  return absl::OkStatus();
}

absl::Status LaunchScaleAdd(size_t n, float a, const float* p, const float* e,
                            float* out, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  ScaleAddKernel<<<GridBlocks(n), kThreads, 0, stream>>>(n, a, p, e, out);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("ScaleAddKernel");
  return absl::OkStatus();
}

absl::Status LaunchAddDifference(size_t n, const float* e, const float* a,
                                 const float* b, float* out,
                                 cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  AddDifferenceKernel<<<GridBlocks(n), kThreads, 0, stream>>>(n, e, a, b, out);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("AddDifferenceKernel");
  return absl::OkStatus();
}

absl::Status LaunchAccumulate(size_t n, float lr, float lambda, const float* g,
                              const float* x, float* r, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  AccumulateKernel<<<GridBlocks(n), kThreads, 0, stream>>>(n, lr, lambda, g, x, r);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("AccumulateKernel");
  return absl::OkStatus();
}

absl::Status LaunchScatterSparse(ScatterOp op, size_t count,
                                 const uint32_t* indices, const float* values,
                                 float divisor, float* x, cudaStream_t stream) {
  switch (op) {
    case ScatterOp::kZero:
    case ScatterOp::kAssignDivided:
    case ScatterOp::kSubtractDivided:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "LaunchScatterSparse: unknown op ", static_cast<int>(op)));
  }
  if (count == 0) return absl::OkStatus();
  switch (op) {
    case ScatterOp::kZero:
      ScatterSparseKernel<ScatterOp::kZero><<<GridBlocks(count), kThreads, 0, stream>>>(
          count, indices, values, divisor, x);
      break;
    case ScatterOp::kAssignDivided:
      ScatterSparseKernel<ScatterOp::kAssignDivided>
          <<<GridBlocks(count), kThreads, 0, stream>>>(count, indices, values,
                                                   divisor, x);
      break;
    case ScatterOp::kSubtractDivided:
      ScatterSparseKernel<ScatterOp::kSubtractDivided>
          <<<GridBlocks(count), kThreads, 0, stream>>>(count, indices, values,
                                                   divisor, x);
      break;
  }
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("ScatterSparseKernel");
  return absl::OkStatus();
}

absl::Status LaunchApplyMomentum(const DirectionRule& rule, size_t n,
                                 const float* u, float* m, float* x,
                                 cudaStream_t stream) {
  const bool nesterov = rule.kind == v1::OptimizerConfig::NESTEROV;
  if (!nesterov && rule.kind != v1::OptimizerConfig::HEAVY_BALL) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LaunchApplyMomentum: momentum kind ", static_cast<int>(rule.kind),
        " is neither HEAVY_BALL nor NESTEROV"));
  }
  if (n == 0) return absl::OkStatus();
  if (nesterov) {
    ApplyMomentumKernel<true><<<GridBlocks(n), kThreads, 0, stream>>>(n, rule.beta,
                                                                  u, m, x);
  } else {
    ApplyMomentumKernel<false><<<GridBlocks(n), kThreads, 0, stream>>>(n, rule.beta,
                                                                   u, m, x);
  }
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("ApplyMomentumKernel");
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace cserps
