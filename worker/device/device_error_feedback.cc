// EF-SGD and QSparse-local-SGD with GRBS on the device (ALGORITHMS.md; the
// host twins are worker/algorithms/ef_sgd.cc and qsparse_local_sgd.cc):
// the error buffer keeps what the selection left out.
#include "common/status.h"
#include "worker/algorithms/algorithm.h"
#include "worker/device/device_algorithm_base.h"

namespace cserps {
namespace {

class DeviceEfSgd final : public DeviceAlgorithmBase {
 public:
  using DeviceAlgorithmBase::DeviceAlgorithmBase;

  absl::Status Init() override {
    RETURN_IF_ERROR(DeviceAlgorithmBase::Init());
    RETURN_IF_ERROR(Allocate(&p_));
    RETURN_IF_ERROR(Allocate(&a_));
    return Allocate(&e_);
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    const uint32_t r = algorithm().ratio();
    RETURN_IF_ERROR(ops().Direction(rule_, g, x, momentum_.data(), p_.data()));
    // a = η·p + e.
    RETURN_IF_ERROR(ops().ScaleAdd(lr, p_.data(), e_.data(), a_.data()));
    // lr 1: a already carries η, and the servers apply x[S] -= AVG(a[S]);
    // so does this worker.
    RETURN_IF_ERROR(Average(v1::GRAD, t, r, /*lr=*/1.0f, a_.data(), ScatterKind::kAxpy,
                            -1.0f, x));
    // e = a off S, 0 on S.
    RETURN_IF_ERROR(ops().Copy(a_.data(), e_.data()));
    return ops().FillBlocks(Blocks(v1::GRAD, t, r), 0.0f, e_.data());
  }

  // The shared model is the servers' model already.
  absl::Status Finish(uint64_t, float*) override { return absl::OkStatus(); }

 private:
  DeviceVector p_, a_, e_;
};

class DeviceQsparseLocalSgd final : public DeviceAlgorithmBase {
 public:
  using DeviceAlgorithmBase::DeviceAlgorithmBase;

  absl::Status Init() override {
    RETURN_IF_ERROR(DeviceAlgorithmBase::Init());
    RETURN_IF_ERROR(Allocate(&u_));
    RETURN_IF_ERROR(Allocate(&e_));
    return Allocate(&x_hat_);
  }

  absl::Status Step(uint64_t t, float lr, const float* g, float* x) override {
    if (!started_) {  // x̂ starts at the common start
      RETURN_IF_ERROR(ops().Copy(x, x_hat_.data()));
      started_ = true;
    }
    RETURN_IF_ERROR(ops().SgdStep(rule_, lr, g, momentum_.data(), x));
    if (!IsSyncStep(t, algorithm().period())) return absl::OkStatus();

    const uint32_t r = algorithm().ratio();
    // u = e + (x̂ − x).
    RETURN_IF_ERROR(ops().AddDifference(e_.data(), x_hat_.data(), x, u_.data()));
    // lr 1: the servers hold x̂ and apply x̂[S] -= AVG(u[S]); so does this
    // worker.
    RETURN_IF_ERROR(Average(v1::GRAD, t, r, /*lr=*/1.0f, u_.data(), ScatterKind::kAxpy,
                            -1.0f, x_hat_.data()));
    // e = u off S, 0 on S; the local model restarts from x̂.
    RETURN_IF_ERROR(ops().Copy(u_.data(), e_.data()));
    RETURN_IF_ERROR(ops().FillBlocks(Blocks(v1::GRAD, t, r), 0.0f, e_.data()));
    return ops().Copy(x_hat_.data(), x);
  }

 private:
  DeviceVector u_, e_, x_hat_;
  bool started_ = false;
};

}  // namespace

std::unique_ptr<DeviceAlgorithmBase> MakeDeviceEfSgd(const DeviceAlgorithmContext& context) {
  return std::make_unique<DeviceEfSgd>(context);
}

std::unique_ptr<DeviceAlgorithmBase> MakeDeviceQsparseLocalSgd(
    const DeviceAlgorithmContext& context) {
  return std::make_unique<DeviceQsparseLocalSgd>(context);
}

}  // namespace cserps
