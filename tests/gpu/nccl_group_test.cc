// NcclGroup on one GPU: a group of one, whose collectives are identities
// through the whole path (agreement, staging, NCCL, copy back), host and
// device ones, and the errors that come before NCCL. Then a node's staged
// average (StagedAverage with spec.group set) on the CUDA staging device of
// ops made with an NcclGroup of one as their node group, against the host
// staging device with a ThreadGroup of one, on in-process clusters. The
// id's hand-over between processes is tested without a GPU in
// tests/worker/cuda/rendezvous_file_test.cc.
#include "worker/cuda/nccl_group.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/block_layout.h"
#include "common/grbs.h"
#include "common/prng.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tools/cluster/in_process_cluster.h"
#include "worker/cuda/cuda_device_ops.h"
#include "worker/cuda/kernels/vector_kernels.h"
#include "worker/device/host_device_ops.h"
#include "worker/group/thread_group.h"
#include "worker/ps/staged_average.h"

namespace cserps {
namespace {

using ::testing::HasSubstr;

std::string IdPath(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  return (dir / "nccl_id").string();
}

// A group of one on device 0, its id file under a directory named `name`;
// a communicator that does not come up fails the test in 30 s, not the
// default 5 minutes.
absl::StatusOr<std::unique_ptr<NcclGroup>> GroupOfOne(const std::string& name) {
  NcclGroupOptions options;
  options.id_path = IdPath(name);
  options.device = 0;
  options.setup_timeout = absl::Seconds(30);
  options.timeout = absl::Seconds(30);
  return NcclGroup::Create(0, 1, options);
}

// Values whose bits a sum with anything but zero, or a copy through the
// wrong offset, would change.
std::vector<float> Values(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 1e-3f * static_cast<float>(i) - 1e8f * (i % 3 == 0);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(NcclGroupTest, AGroupOfOneHasIdentityCollectives) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group, GroupOfOne("nccl_group_one"));
  EXPECT_EQ(group->local_rank(), 0u);
  EXPECT_EQ(group->size(), 1u);
  EXPECT_EQ(group->device(), 0);
  // A group of one needs no hand-over: no file is left.
  EXPECT_FALSE(std::filesystem::exists(
      std::filesystem::path(::testing::TempDir()) / "nccl_group_one" / "nccl_id"));

  // Growing, shrinking and growing again reuses and grows the staging.
  for (size_t n : {size_t{5}, size_t{100000}, size_t{7}, size_t{300001}}) {
    SCOPED_TRACE(n);
    const std::vector<float> expected = Values(n);
    std::vector<float> data = expected;
    CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(data)));
    EXPECT_TRUE(SameBits(data, expected));
    CSERPS_ASSERT_OK(group->Broadcast(0, absl::MakeSpan(data)));
    EXPECT_TRUE(SameBits(data, expected));
  }
  std::vector<float> empty;
  CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(empty)));
  CSERPS_ASSERT_OK(group->Broadcast(0, absl::MakeSpan(empty)));
}

TEST(NcclGroupTest, ABadRootIsRefusedBeforeJoiningAndLeavesTheGroupUsable) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group, GroupOfOne("nccl_group_root"));
  std::vector<float> data = Values(10);
  const absl::Status bad = group->Broadcast(1, absl::MakeSpan(data));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("root 1"));
  CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(data)));
  EXPECT_TRUE(SameBits(data, Values(10)));
}

TEST(NcclGroupTest, BadLocalRanksAndDevicesAreRefused) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_bad");
  EXPECT_EQ(NcclGroup::Create(2, 2, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::Create(0, 0, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.device = CudaDeviceCount();  // one past the last
  const absl::Status no_device = NcclGroup::Create(0, 1, options).status();
  EXPECT_EQ(no_device.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_device.message(), HasSubstr("does not exist"));
}

TEST(NcclGroupTest, ALocalRankWhoseRootNeverPublishesTimesOutNamingTheFile) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_no_root");
  options.device = 0;
  options.setup_timeout = absl::Milliseconds(100);
  options.timeout = absl::Seconds(30);
  const absl::Status status = NcclGroup::Create(1, 2, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr(options.id_path));
}

// A root whose member never comes removes the id it published, so that a
// later run's members cannot read it and join a dead root.
TEST(NcclGroupTest, ARootWhoseGroupNeverComesUpRemovesItsId) {
  CSERPS_SKIP_WITHOUT_GPU();
  NcclGroupOptions options;
  options.id_path = IdPath("nccl_group_no_member");
  options.device = 0;
  options.setup_timeout = absl::Seconds(2);
  options.timeout = absl::Seconds(30);
  const absl::Status status = NcclGroup::Create(0, 2, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_FALSE(std::filesystem::exists(options.id_path));
}

// Each device collective of a group of one is the identity, applied to
// what a scaling kernel queued on the caller's stream had written.
TEST(NcclGroupTest, AGroupOfOneHasIdentityDeviceCollectives) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group, GroupOfOne("nccl_group_device"));
  DeviceGroup& device_group = *group;
  TestStream stream;
  ASSERT_NE(stream.get(), nullptr);
  constexpr float kFactor = 3.0f;
  for (size_t n : {size_t{5}, size_t{300001}}) {
    SCOPED_TRACE(n);
    const std::vector<float> values = Values(n);
    std::vector<float> tripled(n), back(n);
    for (size_t i = 0; i < n; ++i) {
      tripled[i] = values[i] * kFactor;
      back[i] = tripled[i] / kFactor;
    }
    CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> data, Upload(values));
    CSERPS_ASSERT_OK(cuda::LaunchScale(n, /*divide=*/false, kFactor, data.data(),
                                       stream.get()));
    CSERPS_ASSERT_OK(device_group.AllReduceSumOnDevice(data.data(), n, stream.get()));
    CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> summed, Download(data.data(), n));
    EXPECT_TRUE(SameBits(summed, tripled));

    CSERPS_ASSERT_OK(cuda::LaunchScale(n, /*divide=*/true, kFactor, data.data(),
                                       stream.get()));
    CSERPS_ASSERT_OK(device_group.BroadcastOnDevice(0, data.data(), n, stream.get()));
    CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> broadcast, Download(data.data(), n));
    EXPECT_TRUE(SameBits(broadcast, back));
  }
  // Empty collectives still agree, and host collectives follow device ones.
  CSERPS_ASSERT_OK(device_group.AllReduceSumOnDevice(nullptr, 0, stream.get()));
  CSERPS_ASSERT_OK(device_group.BroadcastOnDevice(0, nullptr, 0, stream.get()));
  std::vector<float> host = Values(9);
  CSERPS_ASSERT_OK(group->AllReduceSum(absl::MakeSpan(host)));
  EXPECT_TRUE(SameBits(host, Values(9)));
}

// A device collective returns only after the work queued on the caller's
// stream before it: with some milliseconds of kernels queued there (64
// passes over 256 MB), the stream's event must have fired by the time the
// collective returns, which it could not if the collective ran beside them.
TEST(NcclGroupTest, DeviceCollectivesWaitForTheCallersStream) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group, GroupOfOne("nccl_group_device_order"));
  DeviceGroup& device_group = *group;
  TestStream stream;
  ASSERT_NE(stream.get(), nullptr);
  constexpr size_t kBig = size_t{64} << 20;
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> busy, DeviceBuffer<float>::Allocate(kBig));
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> data, Upload(Values(5)));
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  for (const bool broadcast : {false, true}) {
    SCOPED_TRACE(broadcast ? "broadcast" : "all-reduce");
    for (int pass = 0; pass < 64; ++pass) {
      CSERPS_ASSERT_OK(cuda::LaunchScale(kBig, /*divide=*/false, 1.0f, busy.data(),
                                         stream.get()));
    }
    ASSERT_EQ(cudaEventRecord(done, stream.get()), cudaSuccess);
    CSERPS_ASSERT_OK(broadcast
                         ? device_group.BroadcastOnDevice(0, data.data(), 5, stream.get())
                         : device_group.AllReduceSumOnDevice(data.data(), 5, stream.get()));
    EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  }
  ASSERT_EQ(cudaEventDestroy(done), cudaSuccess);
}

TEST(NcclGroupTest, ADeviceBroadcastFromABadRootIsRefusedBeforeJoining) {
  CSERPS_SKIP_WITHOUT_GPU();
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group, GroupOfOne("nccl_group_device_root"));
  TestStream stream;
  ASSERT_NE(stream.get(), nullptr);
  const std::vector<float> values = Values(10);
  CSERPS_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> data, Upload(values));
  const absl::Status bad = group->BroadcastOnDevice(1, data.data(), 10, stream.get());
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("root 1"));
  // Refused before joining: the group is not broken.
  CSERPS_ASSERT_OK(group->AllReduceSumOnDevice(data.data(), 10, stream.get()));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::vector<float> after, Download(data.data(), 10));
  EXPECT_TRUE(SameBits(after, values));
}

// A node of GPUs needs its collectives on the device: ops made without a
// node group refuse a node's staging device (whatever the group), ops made
// with the NcclGroup make one; a flat worker's staging device has none.
TEST(NcclGroupTest, MakeStagingForANodeNeedsTheOpsNodeGroup) {
  CSERPS_SKIP_WITHOUT_GPU();
  TestStream stream;
  ASSERT_NE(stream.get(), nullptr);
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaDeviceOps> flat_ops,
                              CudaDeviceOps::Create(100, 16, stream.get()));
  std::vector<std::unique_ptr<ThreadGroup>> threads = ThreadGroup::Create(1);
  const absl::Status refused = flat_ops->MakeStaging(threads[0].get()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("NCCL"));

  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<NcclGroup> group, GroupOfOne("nccl_group_staging"));
  // The group alone is not enough: the ops must have been made with it.
  const absl::Status without = flat_ops->MakeStaging(group.get()).status();
  EXPECT_EQ(without.code(), absl::StatusCode::kFailedPrecondition);

  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaDeviceOps> ops,
                              CudaDeviceOps::Create(100, 16, stream.get(), group.get()));
  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StagingDevice> node,
                              ops->MakeStaging(group.get()));
  CSERPS_ASSERT_OK(node->ScaleStaging(StagingDevice::Scale::kMultiply, 2.0f, 0, 100));
  CSERPS_ASSERT_OK(node->AllReduceStaging(100));
  CSERPS_ASSERT_OK(node->BroadcastStaging(0, 10, 90));
  EXPECT_EQ(node->ScaleStaging(StagingDevice::Scale::kDivide, 2.0f, 50, 51).code(),
            absl::StatusCode::kInvalidArgument);

  CSERPS_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StagingDevice> flat,
                              ops->MakeStaging(nullptr));
  const absl::Status scale =
      flat->ScaleStaging(StagingDevice::Scale::kMultiply, 2.0f, 0, 10);
  EXPECT_EQ(scale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(scale.message(), HasSubstr("ScaleStaging"));
  const absl::Status all_reduce = flat->AllReduceStaging(10);
  EXPECT_EQ(all_reduce.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(all_reduce.message(), HasSubstr("AllReduceStaging"));
  const absl::Status broadcast = flat->BroadcastStaging(0, 0, 10);
  EXPECT_EQ(broadcast.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(broadcast.message(), HasSubstr("BroadcastStaging"));
}

// --- A node's staged average on the device ---------------------------------

constexpr uint32_t kBlockSize = 32;
constexpr uint32_t kShards = 3;
// SOFTMAX 399 -> 10: d = 4000 = 125 blocks of 32 over 3 shards.
constexpr uint64_t kInputDim = 399;
constexpr uint64_t kD = kInputDim * 10 + 10;
constexpr uint64_t kSeed = 57;
constexpr float kLr = 0.25f;
// The node's weight: a multiplication and a division by 3 round, so the
// device's scaling must round as the host's does.
constexpr float kNodeWeight = 3.0f;
constexpr float kPeerWeight = 2.0f;

constexpr char kCser[] =
    R"pb(name: "cser" cser_variant: GRADIENT_BLOCKS period: 2 ratio_c1: 4 ratio_c2: 8)pb";
constexpr char kSsgd[] = R"pb(name: "ssgd")pb";

// Worker 0 is the node under test (one local rank); worker 1 a plain peer,
// so that the servers' means are not the node's own values.
v1::JobConfig NodeConfig(const std::string& algorithm) {
  return testing::TestConfig(absl::StrCat(R"pb(
    name: "nccl-node-average-test"
    seed: )pb", kSeed, R"pb(
    cluster {
      servers: "127.0.0.1:0" servers: "127.0.0.1:0" servers: "127.0.0.1:0"
      num_workers: 2
      round_timeout_s: 20
    }
    model { kind: SOFTMAX input_dim: )pb", kInputDim, R"pb( num_classes: 10 }
    data { batch_size: 8 }
    optimizer { lr: 0.1 }
    algorithm { )pb", algorithm, " block_size: ", kBlockSize, R"pb( }
    epochs: 1
  )pb"));
}

std::vector<float> RankValues(int rank, uint64_t salt) {
  std::vector<float> v(kD);
  CounterRng rng(7919 * rank + salt);
  for (float& x : v) x = rng.UniformFloat() * 4 - 2;
  return v;
}

struct NodeCase {
  const char* algorithm;
  v1::Stream stream;
  uint64_t step;
  uint32_t ratio;
  ScatterKind kind;
};

struct NodeResult {
  std::vector<float> target;  // worker 0's, after the round
  std::vector<float> server_model;
};

// One round on a fresh cluster: worker 0 as a node of one local rank
// (StagedAverage with spec.group set), on the CUDA staging device of ops
// made with an NcclGroup of one (`on_device`) or on the host staging device
// with a ThreadGroup of one; worker 1 through AverageBlocks.
// kAssign rounds average the target in place (CSER's model); kAxpy rounds
// apply target -= lr * the mean of other values (S-SGD's gradient).
absl::StatusOr<NodeResult> RunNodeRound(const NodeCase& c, bool on_device,
                                        const std::string& id_name) {
  ASSIGN_OR_RETURN(std::unique_ptr<testing::InProcessCluster> cluster,
                   testing::InProcessCluster::Start(NodeConfig(c.algorithm), kD));
  RETURN_IF_ERROR(cluster->client(0).PushModel(RankValues(9, 9)));
  const bool assign = c.kind == ScatterKind::kAssign;
  NodeResult result;
  result.target = RankValues(0, 1);
  const std::vector<float> p = RankValues(0, 2);

  // Declared in this order so that the staging device goes first, then the
  // buffers, the group and the stream.
  TestStream stream;
  if (stream.get() == nullptr) return absl::InternalError("cudaStreamCreate failed");
  std::vector<std::unique_ptr<ThreadGroup>> threads = ThreadGroup::Create(1);
  std::unique_ptr<NcclGroup> nccl;
  std::unique_ptr<CudaDeviceOps> ops;
  DeviceBuffer<float> x_device, p_device;
  std::unique_ptr<StagingDevice> device;
  LocalGroup* group = threads[0].get();
  const float* values = assign ? result.target.data() : p.data();
  float* target = result.target.data();
  if (on_device) {
    ASSIGN_OR_RETURN(nccl, GroupOfOne(id_name));
    group = nccl.get();
    ASSIGN_OR_RETURN(ops, CudaDeviceOps::Create(kD, kBlockSize, stream.get(), nccl.get()));
    ASSIGN_OR_RETURN(x_device, Upload(result.target));
    ASSIGN_OR_RETURN(p_device, Upload(p));
    ASSIGN_OR_RETURN(device, ops->MakeStaging(nccl.get()));
    values = assign ? x_device.data() : p_device.data();
    target = x_device.data();
  } else {
    device = std::make_unique<HostStagingDevice>(kD, kBlockSize, group);
  }

  const BlockLayout layout(kD, kBlockSize, kShards);
  StagedAverageSpec spec;
  spec.layout = &layout;
  spec.job_seed = kSeed;
  spec.stream = c.stream;
  spec.step = c.step;
  spec.ratio = c.ratio;
  spec.weight = kNodeWeight;
  spec.group = group;
  RETURN_IF_ERROR(cluster->OnEveryRank([&](int rank) -> absl::Status {
    if (rank == 1) {
      std::vector<float> mean(kD, 0.0f);
      return cluster->client(1).AverageBlocks(c.stream, c.step, c.ratio,
                                              RankValues(1, assign ? 1 : 2), kPeerWeight,
                                              kLr, absl::MakeSpan(mean));
    }
    return StagedAverage(
        spec,
        [&](float node_weight) {
          return cluster->client(0).BeginShardedAverage(c.stream, c.step, c.ratio,
                                                        node_weight, kLr);
        },
        *device, values, c.kind, -kLr, target);
  }));
  if (on_device) {
    CSERPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream.get()));
    ASSIGN_OR_RETURN(result.target, Download(x_device.data(), kD));
  }
  result.server_model.resize(kD);
  RETURN_IF_ERROR(cluster->client(0).PullModel(absl::MakeSpan(result.server_model), false));
  return result;
}

class NodeAverageOnDeviceTest : public ::testing::TestWithParam<NodeCase> {};

TEST_P(NodeAverageOnDeviceTest, MatchesTheHostStagingDeviceBitForBit) {
  CSERPS_SKIP_WITHOUT_GPU();
  const NodeCase c = GetParam();
  const std::string name = absl::StrCat("nccl_node_", c.step, "_", c.ratio);
  CSERPS_ASSERT_OK_AND_ASSIGN(const NodeResult host, RunNodeRound(c, false, name));
  CSERPS_ASSERT_OK_AND_ASSIGN(const NodeResult gpu, RunNodeRound(c, true, name));
  EXPECT_TRUE(SameBits(gpu.target, host.target));
  EXPECT_TRUE(SameBits(gpu.server_model, host.server_model));

  // Not vacuous: the round moved the selected floats and only those.
  const std::vector<float> before = RankValues(0, 1);
  std::vector<bool> selected(kD, false);
  for (uint64_t b : SelectBlocks(kSeed, c.stream, c.step, c.ratio,
                                 (kD + kBlockSize - 1) / kBlockSize)) {
    for (uint64_t j = b * kBlockSize; j < std::min(kD, (b + 1) * kBlockSize); ++j) {
      selected[j] = true;
    }
  }
  uint64_t moved = 0, num_selected = 0;
  for (uint64_t j = 0; j < kD; ++j) {
    num_selected += selected[j];
    if (!selected[j]) {
      ASSERT_EQ(std::memcmp(&gpu.target[j], &before[j], sizeof(float)), 0) << "float " << j;
    } else {
      moved += gpu.target[j] != before[j];
    }
  }
  EXPECT_GT(num_selected, 0u);
  EXPECT_GT(moved, num_selected / 2);
}

INSTANTIATE_TEST_SUITE_P(
    Rounds, NodeAverageOnDeviceTest,
    ::testing::Values(NodeCase{kCser, v1::MODEL, 3, 4, ScatterKind::kAssign},
                      NodeCase{kSsgd, v1::GRAD, 0, 1, ScatterKind::kAxpy}));

}  // namespace
}  // namespace cserps
