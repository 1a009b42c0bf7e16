#include "worker/cuda/kernels/update_kernels.h"

#include <algorithm>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "worker/cuda/kernels/cuda_status.h"
#include "worker/cuda/kernels/grid.h"

namespace cserps {
namespace cuda {
namespace {

enum class Kind { kNone, kHeavyBall, kNesterov };

// p for element i, advancing m[i]; the rounding order of ComputeDirection.
template <Kind kKind>
__device__ __forceinline__ float DirectionAt(size_t i, float beta,
                                             float lambda, const float* grad,
                                             const float* params, float* m) {
  const float d = __fadd_rn(grad[i], __fmul_rn(lambda, params[i]));
  if (kKind == Kind::kNone) return d;
  const float next = __fadd_rn(__fmul_rn(beta, m[i]), d);
  m[i] = next;
  if (kKind == Kind::kHeavyBall) return next;
  return __fadd_rn(d, __fmul_rn(beta, next));
}

template <Kind kKind>
__global__ void DirectionKernel(size_t n, float beta, float lambda,
                                const float* grad, const float* params,
                                float* m, float* direction) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    direction[i] = DirectionAt<kKind>(i, beta, lambda, grad, params, m);
  }
}

__global__ void DescendKernel(size_t n, float lr, const float* direction,
                              float* params) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    params[i] = __fsub_rn(params[i], __fmul_rn(lr, direction[i]));
  }
}

template <Kind kKind>
__global__ void SgdStepKernel(size_t n, float beta, float lambda, float lr,
                              const float* grad, float* m, float* params) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const float p = DirectionAt<kKind>(i, beta, lambda, grad, params, m);
    params[i] = __fsub_rn(params[i], __fmul_rn(lr, p));
  }
}

absl::StatusOr<Kind> KindOf(const DirectionRule& rule) {
  switch (rule.kind) {
    case v1::OptimizerConfig::MOMENTUM_UNSPECIFIED:
    case v1::OptimizerConfig::NONE:
      return Kind::kNone;
    case v1::OptimizerConfig::HEAVY_BALL:
      return Kind::kHeavyBall;
    case v1::OptimizerConfig::NESTEROV:
      return Kind::kNesterov;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer.momentum_kind: unknown value ", static_cast<int>(rule.kind)));
  }
}

// The launchers of the kernels that follow `rule`: InvalidArgument for an
// unknown kind, nothing for n == 0, else
// launch(std::integral_constant<Kind, kind>{}) (the kernels take the
// momentum kind as a template parameter) and the check of the launch of
// `kernel`.
template <typename Launch>
absl::Status LaunchForRule(const DirectionRule& rule, size_t n, const char* kernel,
                           Launch launch) {
  const absl::StatusOr<Kind> kind = KindOf(rule);
  if (!kind.ok()) return kind.status();
  if (n == 0) return absl::OkStatus();
  switch (*kind) {
    case Kind::kNone:
      launch(std::integral_constant<Kind, Kind::kNone>{});
      break;
    case Kind::kHeavyBall:
      launch(std::integral_constant<Kind, Kind::kHeavyBall>{});
      break;
    case Kind::kNesterov:
      launch(std::integral_constant<Kind, Kind::kNesterov>{});
      break;
  }
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED(kernel);
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchDirection(const DirectionRule& rule, size_t n,
                             const float* grad, const float* params,
                             float* momentum, float* direction,
                             cudaStream_t stream) {
  return LaunchForRule(rule, n, "DirectionKernel", [&](auto kind) {
    DirectionKernel<decltype(kind)::value><<<GridBlocks(n), kThreads, 0, stream>>>(
        n, rule.beta, rule.weight_decay, grad, params, momentum, direction);
  });
}

absl::Status LaunchDescend(size_t n, float lr, const float* direction,
                           float* params, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  DescendKernel<<<GridBlocks(n), kThreads, 0, stream>>>(n, lr, direction, params);
  CSERPS_CUDA_RETURN_IF_LAUNCH_FAILED("DescendKernel");
  return absl::OkStatus();
}

absl::Status LaunchSgdStep(const DirectionRule& rule, size_t n, float lr,
                           const float* grad, float* momentum, float* params,
                           cudaStream_t stream) {
  return LaunchForRule(rule, n, "SgdStepKernel", [&](auto kind) {
    SgdStepKernel<decltype(kind)::value><<<GridBlocks(n), kThreads, 0, stream>>>(
        n, rule.beta, rule.weight_decay, lr, grad, momentum, params);
  });
}

}  // namespace cuda
}  // namespace cserps
