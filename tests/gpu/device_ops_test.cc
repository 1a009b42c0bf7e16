// CudaDeviceOps against HostDeviceOps: every operation of DeviceOps on the
// same random inputs (mixed magnitudes, d not a multiple of the block size
// or of the kernels' 256 threads), results compared bit for bit after
// Download. HostDeviceOps is the CPU worker's, so agreement means that
// every algorithm (worker/algorithms/) computes the same bits on either.
#include "worker/cuda/cuda_device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/prng.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/device/host_device_ops.h"

namespace cserps {
namespace {

constexpr uint64_t kD = 100003;  // prime: no multiple of 64 or 256
constexpr uint32_t kBlockSize = 64;
constexpr uint64_t kNumBlocks = (kD + kBlockSize - 1) / kBlockSize;

// Signs at random, magnitudes 2^-20 .. 2^20 with random mantissas, and about
// 1% zeros: sums of such floats round in every way, so a different order or
// a fused multiply-add shows up.
std::vector<float> RandomVector(uint64_t key, size_t n = kD) {
  CounterRng rng(key);
  std::vector<float> v(n);
  for (float& x : v) {
    if (rng.Below(100) == 0) {
      x = 0.0f;
      continue;
    }
    const float mantissa = 0.5f + 0.5f * rng.UniformFloat();
    const int exponent = static_cast<int>(rng.Below(41)) - 20;
    x = std::ldexp(rng.Below(2) ? mantissa : -mantissa, exponent);
  }
  return v;
}

// The first position where the bits differ, or -1.
int64_t FirstDifference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

DirectionRule Rule(v1::OptimizerConfig::Momentum kind) {
  DirectionRule rule;
  rule.kind = kind;
  rule.beta = 0.9f;
  rule.weight_decay = 5e-4f;
  return rule;
}

const v1::OptimizerConfig::Momentum kKinds[] = {v1::OptimizerConfig::NONE,
                                                v1::OptimizerConfig::HEAVY_BALL,
                                                v1::OptimizerConfig::NESTEROV};

// One buffer on each implementation holding the same values.
struct Twin {
  DeviceVector host;
  DeviceVector cuda;
};

class DeviceOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) return;  // each test skips
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    CSERPS_ASSERT_OK_AND_ASSIGN(cuda_, CudaDeviceOps::Create(kD, kBlockSize, stream_));
  }
  void TearDown() override {
    cuda_.reset();
    if (stream_ != nullptr) static_cast<void>(cudaStreamDestroy(stream_));
  }

  // Both buffers zeroed (Allocate), then set to `values` unless empty.
  absl::StatusOr<Twin> Make(const std::vector<float>& values = {}) {
    Twin twin;
    ASSIGN_OR_RETURN(twin.host, host_.Allocate());
    ASSIGN_OR_RETURN(twin.cuda, cuda_->Allocate());
    if (!values.empty()) {
      RETURN_IF_ERROR(host_.Upload(values, twin.host.data()));
      RETURN_IF_ERROR(cuda_->Upload(values, twin.cuda.data()));
    }
    return twin;
  }

  absl::StatusOr<std::vector<float>> HostContents(const Twin& twin) {
    std::vector<float> out(kD);
    RETURN_IF_ERROR(host_.Download(twin.host.data(), absl::MakeSpan(out)));
    return out;
  }
  absl::StatusOr<std::vector<float>> CudaContents(const Twin& twin) {
    std::vector<float> out(kD);
    RETURN_IF_ERROR(cuda_->Download(twin.cuda.data(), absl::MakeSpan(out)));
    return out;
  }

  // Both sides of `twin` hold the same bits.
  void ExpectSame(const Twin& twin, const std::string& what) {
    CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> host, HostContents(twin));
    CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> cuda, CudaContents(twin));
    const int64_t i = FirstDifference(host, cuda);
    EXPECT_EQ(i, -1) << what << ": host " << host[i < 0 ? 0 : i] << ", cuda "
                     << cuda[i < 0 ? 0 : i];
  }

  cudaStream_t stream_ = nullptr;
  HostDeviceOps host_{kD, kBlockSize};
  std::unique_ptr<CudaDeviceOps> cuda_;
};

TEST_F(DeviceOpsTest, CreateRejectsBlockSizeZero) {
  CSERPS_SKIP_WITHOUT_GPU();
  EXPECT_EQ(CudaDeviceOps::Create(kD, 0, stream_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DeviceOpsTest, AllocateZeroesAndUploadDownloadCopyRoundTrip) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceVector zeroed, cuda_->Allocate());
  std::vector<float> contents(kD, 1.0f);
  CSERPS_ASSERT_OK(cuda_->Download(zeroed.data(), absl::MakeSpan(contents)));
  EXPECT_EQ(FirstDifference(contents, std::vector<float>(kD, 0.0f)), -1);

  const std::vector<float> values = RandomVector(1);
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin a, Make(values));
  CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> back, CudaContents(a));
  EXPECT_EQ(FirstDifference(back, values), -1);

  CSERPS_ASSERT_OK_AND_ASSIGN(Twin b, Make());
  CSERPS_ASSERT_OK(host_.Copy(a.host.data(), b.host.data()));
  CSERPS_ASSERT_OK(cuda_->Copy(a.cuda.data(), b.cuda.data()));
  ExpectSame(b, "Copy");
  CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> copied, CudaContents(b));
  EXPECT_EQ(FirstDifference(copied, values), -1);

  EXPECT_EQ(cuda_->Upload(absl::MakeConstSpan(values).subspan(1), b.cuda.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_->Download(b.cuda.data(), absl::MakeSpan(contents).subspan(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

// Direction then Descend over several steps (the momentum carries state),
// with p separate from g and with p aliasing g.
TEST_F(DeviceOpsTest, DirectionAndDescendMatchHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const auto kind : kKinds) {
    for (const bool alias : {false, true}) {
      const std::string name =
          v1::OptimizerConfig::Momentum_Name(kind) + (alias ? " p=g" : "");
      const DirectionRule rule = Rule(kind);
      CSERPS_ASSERT_OK_AND_ASSIGN(Twin x, Make(RandomVector(DeriveKey(10, kind))));
      CSERPS_ASSERT_OK_AND_ASSIGN(Twin m, Make());
      CSERPS_ASSERT_OK_AND_ASSIGN(Twin p, Make());
      for (uint64_t step = 0; step < 3; ++step) {
        CSERPS_ASSERT_OK_AND_ASSIGN(Twin g,
                                    Make(RandomVector(DeriveKey(11 + step, kind))));
        Twin& out = alias ? g : p;
        const bool momentum = kind != v1::OptimizerConfig::NONE;
        CSERPS_ASSERT_OK(host_.Direction(rule, g.host.data(), x.host.data(),
                                         momentum ? m.host.data() : nullptr,
                                         out.host.data()));
        CSERPS_ASSERT_OK(cuda_->Direction(rule, g.cuda.data(), x.cuda.data(),
                                          momentum ? m.cuda.data() : nullptr,
                                          out.cuda.data()));
        ExpectSame(out, name + " p, step " + std::to_string(step));
        ExpectSame(m, name + " m, step " + std::to_string(step));
        CSERPS_ASSERT_OK(host_.Descend(0.05f, out.host.data(), x.host.data()));
        CSERPS_ASSERT_OK(cuda_->Descend(0.05f, out.cuda.data(), x.cuda.data()));
        ExpectSame(x, name + " x, step " + std::to_string(step));
      }
    }
  }
}

// The fused step against the host's, and against the host's Direction then
// Descend, which the contract says it equals.
TEST_F(DeviceOpsTest, SgdStepMatchesHostAndDirectionThenDescend) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const auto kind : kKinds) {
    const std::string name = v1::OptimizerConfig::Momentum_Name(kind);
    const DirectionRule rule = Rule(kind);
    const bool momentum = kind != v1::OptimizerConfig::NONE;
    const std::vector<float> x0 = RandomVector(DeriveKey(20, kind));
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin x, Make(x0));
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin m, Make());
    // The two-pass reference, on the host.
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin x2, Make(x0));
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin m2, Make());
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin p2, Make());
    for (uint64_t step = 0; step < 3; ++step) {
      CSERPS_ASSERT_OK_AND_ASSIGN(Twin g, Make(RandomVector(DeriveKey(21 + step, kind))));
      CSERPS_ASSERT_OK(host_.SgdStep(rule, 0.1f, g.host.data(),
                                     momentum ? m.host.data() : nullptr, x.host.data()));
      CSERPS_ASSERT_OK(cuda_->SgdStep(rule, 0.1f, g.cuda.data(),
                                      momentum ? m.cuda.data() : nullptr, x.cuda.data()));
      ExpectSame(x, name + " x, step " + std::to_string(step));
      ExpectSame(m, name + " m, step " + std::to_string(step));

      CSERPS_ASSERT_OK(host_.Direction(rule, g.host.data(), x2.host.data(),
                                       momentum ? m2.host.data() : nullptr, p2.host.data()));
      CSERPS_ASSERT_OK(host_.Descend(0.1f, p2.host.data(), x2.host.data()));
      CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> fused, CudaContents(x));
      CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> two_pass, HostContents(x2));
      EXPECT_EQ(FirstDifference(fused, two_pass), -1) << name << " step " << step;
    }
  }
}

TEST_F(DeviceOpsTest, ScaleAddAddDifferenceAndAccumulateMatchHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin p, Make(RandomVector(30)));
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin e, Make(RandomVector(31)));
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin a, Make(RandomVector(32)));
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin b, Make(RandomVector(33)));
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin out, Make());

  CSERPS_ASSERT_OK(host_.ScaleAdd(0.3f, p.host.data(), e.host.data(), out.host.data()));
  CSERPS_ASSERT_OK(cuda_->ScaleAdd(0.3f, p.cuda.data(), e.cuda.data(), out.cuda.data()));
  ExpectSame(out, "ScaleAdd");

  CSERPS_ASSERT_OK(host_.AddDifference(e.host.data(), a.host.data(), b.host.data(),
                                       out.host.data()));
  CSERPS_ASSERT_OK(cuda_->AddDifference(e.cuda.data(), a.cuda.data(), b.cuda.data(),
                                        out.cuda.data()));
  ExpectSame(out, "AddDifference");

  // In place (out = e), as EF-SGD and QSparse use them.
  CSERPS_ASSERT_OK(host_.ScaleAdd(0.7f, p.host.data(), e.host.data(), e.host.data()));
  CSERPS_ASSERT_OK(cuda_->ScaleAdd(0.7f, p.cuda.data(), e.cuda.data(), e.cuda.data()));
  ExpectSame(e, "ScaleAdd in place");
  CSERPS_ASSERT_OK(host_.AddDifference(e.host.data(), a.host.data(), b.host.data(),
                                       e.host.data()));
  CSERPS_ASSERT_OK(cuda_->AddDifference(e.cuda.data(), a.cuda.data(), b.cuda.data(),
                                        e.cuda.data()));
  ExpectSame(e, "AddDifference in place");

  CSERPS_ASSERT_OK_AND_ASSIGN(Twin r, Make(RandomVector(34)));
  for (int step = 0; step < 2; ++step) {
    CSERPS_ASSERT_OK(
        host_.Accumulate(0.1f, 5e-4f, a.host.data(), b.host.data(), r.host.data()));
    CSERPS_ASSERT_OK(
        cuda_->Accumulate(0.1f, 5e-4f, a.cuda.data(), b.cuda.data(), r.cuda.data()));
    ExpectSame(r, "Accumulate, step " + std::to_string(step));
  }
}

// The first block, a run of neighbours, scattered blocks and the short last
// block; twice in a row, so the second block list is uploaded while the
// first may still be in flight.
TEST_F(DeviceOpsTest, FillBlocksMatchesHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  std::vector<uint64_t> blocks = {0, 1, 2, 3};
  CounterRng rng(40);
  for (uint64_t b = 10; b < kNumBlocks - 1; ++b) {
    if (rng.Below(5) == 0) blocks.push_back(b);
  }
  blocks.push_back(kNumBlocks - 1);
  const std::vector<uint64_t> others = {5, 6, kNumBlocks / 2, kNumBlocks - 2};

  CSERPS_ASSERT_OK_AND_ASSIGN(Twin x, Make(RandomVector(41)));
  CSERPS_ASSERT_OK(host_.FillBlocks(blocks, 0.0f, x.host.data()));
  CSERPS_ASSERT_OK(cuda_->FillBlocks(blocks, 0.0f, x.cuda.data()));
  CSERPS_ASSERT_OK(host_.FillBlocks(others, -1.5f, x.host.data()));
  CSERPS_ASSERT_OK(cuda_->FillBlocks(others, -1.5f, x.cuda.data()));
  ExpectSame(x, "FillBlocks");

  // The last block is short: its final float is kD - 1, and nothing beyond.
  CSERPS_ASSERT_OK_AND_ASSIGN(const std::vector<float> filled, CudaContents(x));
  EXPECT_EQ(filled[kD - 1], 0.0f);
  EXPECT_EQ(filled[5 * kBlockSize], -1.5f);

  const std::vector<uint64_t> outside = {kNumBlocks};
  EXPECT_EQ(cuda_->FillBlocks(outside, 0.0f, x.cuda.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Ranges like shards, one with k >= size, one with k == 0, an empty one, and
// one whose k cuts through a group of many equal |values| of both signs, so
// the tie break (lower position first) decides.
TEST_F(DeviceOpsTest, TopKMatchesHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  std::vector<float> values = RandomVector(50);
  constexpr uint64_t kTieBegin = 30050, kTieSize = 40000;
  CounterRng rng(51);
  uint64_t num_big = 0, num_tied = 0;
  for (uint64_t j = kTieBegin; j < kTieBegin + kTieSize; ++j) {
    const uint64_t r = rng.Below(100);
    const float sign = rng.Below(2) ? 1.0f : -1.0f;
    if (r == 0) {
      values[j] = sign * (1.0f + rng.UniformFloat());
      ++num_big;
    } else if (r < 30) {
      values[j] = sign * 0.25f;
      ++num_tied;
    } else {
      values[j] = sign * 0.1f * rng.UniformFloat();
    }
  }
  const uint64_t tie_k = num_big + num_tied / 2;  // half of the ties make it
  const std::vector<TopKRange> ranges = {
      {0, 30000, 1000},
      {30000, 50, 80},
      {kTieBegin, kTieSize, tie_k},
      {70050, 0, 5},
      {70050, 20000, 0},
      {90050, kD - 90050, 777},
  };
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin v, Make(values));

  SparseVector host_out, cuda_out;
  cuda_out.indices = {1, 2, 3};  // cleared first
  cuda_out.values = {1.0f, 2.0f, 3.0f};
  CSERPS_ASSERT_OK(host_.TopK(v.host.data(), ranges, &host_out));
  CSERPS_ASSERT_OK(cuda_->TopK(v.cuda.data(), ranges, &cuda_out));
  const uint64_t expected = 1000 + 50 + tie_k + 0 + 0 + 777;
  ASSERT_EQ(host_out.indices.size(), expected);
  EXPECT_EQ(cuda_out.indices, host_out.indices);
  ASSERT_EQ(cuda_out.values.size(), host_out.values.size());
  EXPECT_EQ(std::memcmp(cuda_out.values.data(), host_out.values.data(),
                        host_out.values.size() * sizeof(float)),
            0);
  // The range with k >= size takes all of it.
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(cuda_out.indices[1000 + i], 30000 + i);

  // Again with a larger range (the workspace grows) and fewer entries.
  const std::vector<TopKRange> whole = {{0, kD, 12345}};
  CSERPS_ASSERT_OK(host_.TopK(v.host.data(), whole, &host_out));
  CSERPS_ASSERT_OK(cuda_->TopK(v.cuda.data(), whole, &cuda_out));
  ASSERT_EQ(host_out.indices.size(), 12345u);
  EXPECT_EQ(cuda_out.indices, host_out.indices);
  ASSERT_EQ(cuda_out.values.size(), host_out.values.size());
  EXPECT_EQ(std::memcmp(cuda_out.values.data(), host_out.values.data(),
                        host_out.values.size() * sizeof(float)),
            0);

  const std::vector<TopKRange> outside = {{kD - 10, 11, 1}};
  EXPECT_EQ(cuda_->TopK(v.cuda.data(), outside, &cuda_out).code(),
            absl::StatusCode::kInvalidArgument);
}

// All three ops, in unsorted index order, with a divisor that rounds; a
// second, larger scatter grows the buffers while the first may be in flight.
TEST_F(DeviceOpsTest, ScatterSparseMatchesHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  CounterRng rng(60);
  auto random_indices = [&](uint64_t one_in) {
    std::vector<uint32_t> indices;
    for (uint32_t j = 0; j < kD; ++j) {
      if (rng.Below(one_in) == 0) indices.push_back(j);
    }
    // Reverse halves: distinct, not ascending.
    std::reverse(indices.begin(), indices.begin() + indices.size() / 2);
    return indices;
  };
  const std::vector<float> all_values = RandomVector(61);
  const struct {
    SparseOp op;
    const char* name;
  } ops[] = {{SparseOp::kZero, "kZero"},
             {SparseOp::kAssignDivided, "kAssignDivided"},
             {SparseOp::kSubtractDivided, "kSubtractDivided"}};
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin x, Make(RandomVector(62)));
  for (const uint64_t one_in : {50, 7}) {
    for (const auto& op : ops) {
      const std::vector<uint32_t> indices = random_indices(one_in);
      std::vector<float> values;
      if (op.op != SparseOp::kZero) {
        values.assign(all_values.begin(), all_values.begin() + indices.size());
      }
      CSERPS_ASSERT_OK(host_.ScatterSparse(op.op, indices, values, 3.0f, x.host.data()));
      CSERPS_ASSERT_OK(cuda_->ScatterSparse(op.op, indices, values, 3.0f, x.cuda.data()));
      ExpectSame(x, std::string(op.name) + ", one in " + std::to_string(one_in));
    }
  }
  const std::vector<uint32_t> indices = {1, 2};
  const std::vector<float> one_value = {1.0f};
  EXPECT_EQ(cuda_->ScatterSparse(SparseOp::kAssignDivided, indices, one_value, 3.0f,
                                 x.cuda.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<uint32_t> outside = {static_cast<uint32_t>(kD)};
  EXPECT_EQ(cuda_->ScatterSparse(SparseOp::kZero, outside, {}, 1.0f, x.cuda.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DeviceOpsTest, ApplyMomentumMatchesHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  for (const auto kind : {v1::OptimizerConfig::HEAVY_BALL, v1::OptimizerConfig::NESTEROV}) {
    const std::string name = v1::OptimizerConfig::Momentum_Name(kind);
    const DirectionRule rule = Rule(kind);
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin x, Make(RandomVector(DeriveKey(70, kind))));
    CSERPS_ASSERT_OK_AND_ASSIGN(Twin m, Make());
    for (uint64_t step = 0; step < 3; ++step) {
      CSERPS_ASSERT_OK_AND_ASSIGN(Twin u, Make(RandomVector(DeriveKey(71 + step, kind))));
      CSERPS_ASSERT_OK(host_.ApplyMomentum(rule, u.host.data(), m.host.data(), x.host.data()));
      CSERPS_ASSERT_OK(
          cuda_->ApplyMomentum(rule, u.cuda.data(), m.cuda.data(), x.cuda.data()));
      ExpectSame(m, name + " m, step " + std::to_string(step));
      ExpectSame(x, name + " x, step " + std::to_string(step));
    }
  }
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin t, Make());
  EXPECT_EQ(cuda_->ApplyMomentum(Rule(v1::OptimizerConfig::NONE), t.cuda.data(),
                                 t.cuda.data(), t.cuda.data())
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A staged round through MakeStaging's device, as StagedAverage drives it:
// gather, copy out, change the host copy, copy back, scatter with an axpy.
TEST_F(DeviceOpsTest, StagingMatchesHost) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StagingDevice> host_staging,
                              host_.MakeStaging(nullptr));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StagingDevice> cuda_staging,
                              cuda_->MakeStaging(nullptr));
  const std::vector<uint64_t> blocks = {0, 7, 8, 100, kNumBlocks - 1};
  const uint64_t gathered = 4 * kBlockSize + (kD - (kNumBlocks - 1) * kBlockSize);
  const std::vector<float> mean = RandomVector(80, gathered);
  CSERPS_ASSERT_OK_AND_ASSIGN(Twin x, Make(RandomVector(81)));
  for (const auto& [staging, model] :
       {std::make_pair(host_staging.get(), x.host.data()),
        std::make_pair(cuda_staging.get(), x.cuda.data())}) {
    CSERPS_ASSERT_OK(staging->Gather(model, blocks));
    CSERPS_ASSERT_OK(staging->CopyToHost(0, 0, gathered));
    CSERPS_ASSERT_OK(staging->WaitCopied(0));
    absl::Span<float> host = staging->host();
    for (uint64_t i = 0; i < gathered; ++i) host[i] = host[i] + mean[i];
    CSERPS_ASSERT_OK(staging->CopyToStaging(0, gathered));
    CSERPS_ASSERT_OK(staging->Scatter(ScatterKind::kAxpy, -0.05f, model));
  }
  ExpectSame(x, "staged axpy");
}

}  // namespace
}  // namespace cserps
