// cserps._native: the worker library as the Python package sees it (python/
// cserps). A Job is a loaded, validated job config; a Trainer is an
// ExternalTrainer (worker/trainer/external_trainer.h) on buffers the caller
// owns, passed as (address, float count): the Python side checks that they
// are contiguous float32 tensors that live as long as the trainer, in host
// memory, or with device >= 0 (a CUDA build) on that GPU, where the trainer
// runs the CUDA device ops on a stream of its own. In a job of nodes
// (cluster.local_size L > 1) each process is one local rank, and the
// trainer joins its node's group: a SocketGroup on the host, an NcclGroup on
// GPUs, meeting in the node's directory (worker/ps/worker_id.h).
//
// Errors become Python exceptions carrying the C++ message: ValueError for
// bad arguments and configs (FileNotFoundError for a missing job file),
// ConnectionError for unreachable servers, TimeoutError for an exchange the
// servers did not answer in time, RuntimeError for the rest. The GIL is
// released while a call waits for the servers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/config_load.h"
#include "common/lock_order_checks.h"
#include "common/model_spec.h"
#include "common/rank_batch_sizes.h"
#include "common/status.h"
#include "common/algorithm_catalog.h"
#include "worker/data/dataset.h"
#include "worker/group/socket_group.h"
#include "worker/ps/node_client.h"
#include "worker/ps/worker_id.h"
#include "worker/trainer/external_trainer.h"
#ifdef CSERPS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/cuda/cuda_device_ops.h"
#include "worker/cuda/kernels/cuda_status.h"
#endif
#ifdef CSERPS_HAVE_NCCL
#include "worker/cuda/nccl_group.h"
#endif

namespace py = pybind11;

namespace cserps {
namespace {

[[noreturn]] void Raise(PyObject* type, const absl::Status& status) {
  // A message may quote bytes of a file that are not UTF-8, which
  // PyErr_SetString would drop with the whole message.
  PyObject* message = PyUnicode_DecodeUTF8(status.message().data(),
                                           static_cast<Py_ssize_t>(status.message().size()),
                                           "backslashreplace");
  if (message != nullptr) {
    PyErr_SetObject(type, message);
    Py_DECREF(message);
  }
  throw py::error_already_set();
}

// Throws the exception of `status` unless it is OK. `not_found` is the type
// NOT_FOUND maps to (a missing file, or an unknown name).
void ThrowIfError(const absl::Status& status, PyObject* not_found = PyExc_ValueError) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return;
    case absl::StatusCode::kNotFound:
      Raise(not_found, status);
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
      Raise(PyExc_ValueError, status);
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      Raise(PyExc_ConnectionError, status);
    case absl::StatusCode::kDeadlineExceeded:
      Raise(PyExc_TimeoutError, status);
    default:
      Raise(PyExc_RuntimeError, status);
  }
}

absl::Span<float> Floats(uintptr_t address, size_t count) {
  return absl::MakeSpan(reinterpret_cast<float*>(address), count);
}

struct Job {
  v1::JobConfig config;
  uint64_t num_params = 0;
};

std::shared_ptr<Job> LoadJob(const std::string& path, const std::vector<std::string>& overrides) {
  absl::StatusOr<v1::JobConfig> config = LoadJobWithOverrides(path, overrides);
  ThrowIfError(config.status(), PyExc_FileNotFoundError);
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(config->model());
  ThrowIfError(spec.status());
  auto job = std::make_shared<Job>();
  job->config = *std::move(config);
  job->num_params = spec->num_params;
  return job;
}

// (features, labels, size, dim) of a split, as cserps-worker reads it:
// features float32 bytes, standardised; labels uint8 bytes.
py::tuple LoadSplit(const std::string& dir, bool train, size_t limit) {
  absl::StatusOr<Dataset> data;
  {
    py::gil_scoped_release release;
    data = LoadMnistSplit(dir, train ? Split::kTrain : Split::kTest, limit);
  }
  ThrowIfError(data.status(), PyExc_FileNotFoundError);
  return py::make_tuple(
      py::bytes(reinterpret_cast<const char*>(data->features.data()),
                data->features.size() * sizeof(float)),
      py::bytes(reinterpret_cast<const char*>(data->labels.data()), data->labels.size()),
      data->size, data->dim);
}

#ifdef CSERPS_HAVE_CUDA
using NodeDeviceGroup = DeviceGroup;
#else
class NodeDeviceGroup;  // a node's collectives on GPUs: none without CUDA
#endif

// Makes a GPU current on this thread until it goes, then the one that was
// again: torch's current device is the script's.
class CurrentDevice {
 public:
  CurrentDevice() = default;
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
#ifdef CSERPS_HAVE_CUDA
  ~CurrentDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  // `device` current; -1 (host memory) leaves the current one.
  absl::Status Set(int device) {
    if (device < 0) return absl::OkStatus();
    int current = -1;
    CSERPS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
    previous_ = current;
    CSERPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    return absl::OkStatus();
  }

 private:
  int previous_ = -1;
#else
  absl::Status Set(int) { return absl::OkStatus(); }
#endif
};

#ifdef CSERPS_HAVE_CUDA
// A stream destroyed with its owner, also one whose construction failed.
struct OwnedStream {
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};
#endif

// ExternalTrainer with a mutex: the GIL is released during its calls, so
// two Python threads could otherwise enter it at once.
class Trainer {
 public:
  Trainer(std::shared_ptr<Job> job, int requested_rank, const std::string& worker_id,
          double setup_timeout_s, double rpc_slack_s, uint64_t steps_per_epoch, int device,
          int local_rank)
      : job_(std::move(job)), device_(device) {
    ExternalTrainerOptions options;
    options.requested_rank = requested_rank;
    options.worker_id = worker_id;
    options.setup_timeout = absl::Seconds(setup_timeout_s);
    options.rpc_slack = absl::Seconds(rpc_slack_s);
    options.steps_per_epoch = steps_per_epoch;
    absl::StatusOr<std::unique_ptr<ExternalTrainer>> trainer;
    {
      py::gil_scoped_release release;
      CurrentDevice current;
      const absl::Status set = current.Set(device_);
      trainer = set.ok() ? Create(options, local_rank) : set;
    }
    ThrowIfError(trainer.status());
    trainer_ = *std::move(trainer);
  }

  ~Trainer() {
    {
      // An average left in flight waits for its round's replies, which may
      // need another Python thread's push.
      py::gil_scoped_release release;
      CurrentDevice current;
      current.Set(device_).IgnoreError();  // the trainer goes on whichever is current
      trainer_.reset();  // before stream_, which its ops queue on
    }
  }

  void InitializeModel(uintptr_t params, size_t count) {
    Call([&] {
      // Rank 0 reads torch's copies into `params`; torch then reads the model.
      RETURN_IF_ERROR(SynchronizeDevice());
      RETURN_IF_ERROR(trainer_->InitializeModel(Floats(params, count)));
      return SynchronizeDevice();
    });
  }
  void Step(float lr, uintptr_t grad, uintptr_t params, size_t count) {
    Call([&] {
      // torch's gradient is on torch's streams, the update on the ops' own:
      // each waits for the other.
      RETURN_IF_ERROR(SynchronizeDevice());
      RETURN_IF_ERROR(trainer_->Step(lr, Floats(grad, count), Floats(params, count)));
      return SynchronizeDevice();
    });
  }
  void Finish(uintptr_t params, size_t count) {
    Call([&] {
      RETURN_IF_ERROR(SynchronizeDevice());
      RETURN_IF_ERROR(trainer_->Finish(Floats(params, count)));
      return SynchronizeDevice();
    });
  }
  void PullModel(uintptr_t out, size_t count) {
    Call([&] { return trainer_->PullModel(Floats(out, count)); });
  }
  size_t StateSize() {
    py::gil_scoped_release release;  // mu_ may be held across a step's rounds
    std::lock_guard<std::mutex> lock(mu_);
    return trainer_->StateSize();
  }
  void SaveState(uintptr_t params, const std::vector<uintptr_t>& out, size_t count) {
    std::vector<absl::Span<float>> spans;
    for (uintptr_t address : out) spans.push_back(Floats(address, count));
    Call([&] {
      RETURN_IF_ERROR(SynchronizeDevice());
      return trainer_->SaveState(Floats(params, count), spans);
    });
  }
  void LoadState(uint64_t step, const std::vector<uintptr_t>& in, size_t count) {
    std::vector<absl::Span<const float>> spans;
    for (uintptr_t address : in) spans.push_back(Floats(address, count));
    Call([&] { return trainer_->LoadState(step, spans); });
  }

  uint32_t rank() const { return trainer_->rank(); }
  uint32_t local_rank() const { return trainer_->local_rank(); }
  uint32_t partition() const { return trainer_->partition(); }
  uint64_t step() {
    py::gil_scoped_release release;  // mu_ may be held across a step's rounds
    std::lock_guard<std::mutex> lock(mu_);
    return trainer_->step();
  }
  float weight() const { return trainer_->weight(); }
  double achieved_compression() {
    py::gil_scoped_release release;  // mu_ may be held across a step's rounds
    std::lock_guard<std::mutex> lock(mu_);
    return trainer_->achieved_compression();
  }
  uint64_t bytes_pushed() const { return trainer_->client().bytes_pushed(); }
  uint64_t bytes_pulled() const { return trainer_->client().bytes_pulled(); }

 private:
  absl::StatusOr<std::unique_ptr<ExternalTrainer>> Create(ExternalTrainerOptions options,
                                                           int local_rank) {
    const v1::JobConfig& config = job_->config;
    const uint32_t local_size = config.cluster().local_size();
    if (local_size == 1) {
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceOps> ops, MakeOps(nullptr));
      return ExternalTrainer::Create(config, options, std::move(ops));
    }
    if (local_rank < 0 || local_rank >= static_cast<int>(local_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster.local_size is ", local_size, ": each process is one local rank of a "
          "node and needs its local rank in [0, ", local_size, ") (LOCAL_RANK), not ",
          local_rank));
    }
    if (options.requested_rank < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster.local_size is ", local_size, ": the local ranks of a node meet by their "
          "node's rank, so each must claim it (RANK / LOCAL_WORLD_SIZE)"));
    }
    if (options.worker_id.empty()) options.worker_id = DefaultNodeId(options.requested_rank);
    const std::string dir = DefaultNodeGroupDir(config.name(), options.worker_id);
    PsClientOptions client;
    client.setup_timeout = options.setup_timeout;
    client.rpc_slack = options.rpc_slack;
    const absl::Duration timeout = NodeGroupTimeout(config, client);
    if (device_ < 0) {
      SocketGroupOptions group;
      group.path = absl::StrCat(dir, "/group.sock");
      group.setup_timeout = options.setup_timeout;
      group.timeout = timeout;
      ASSIGN_OR_RETURN(std::unique_ptr<SocketGroup> joined,
                       SocketGroup::Create(static_cast<uint32_t>(local_rank), local_size, group));
      return ExternalTrainer::Create(config, options, nullptr, std::move(joined));
    }
#ifdef CSERPS_HAVE_NCCL
    NcclGroupOptions group;
    group.id_path = absl::StrCat(dir, "/nccl_id");
    group.device = device_;
    group.setup_timeout = options.setup_timeout;
    group.timeout = timeout;
    ASSIGN_OR_RETURN(std::unique_ptr<NcclGroup> joined,
                     NcclGroup::Create(static_cast<uint32_t>(local_rank), local_size, group));
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceOps> ops, MakeOps(joined.get()));
    return ExternalTrainer::Create(config, options, std::move(ops), std::move(joined));
#else
    return absl::FailedPreconditionError(
        "CUDA tensors with cluster.local_size > 1: this cserps was built without NCCL "
        "(none was found beside the CUDA toolkit)");
#endif
  }

  // The ops of device_: null (HostDeviceOps) for -1, else the CUDA device
  // ops on a new stream of that GPU (stream_), with the node's group on the
  // device (null: a flat worker).
  absl::StatusOr<std::unique_ptr<DeviceOps>> MakeOps(
      [[maybe_unused]] NodeDeviceGroup* node_group) {
    if (device_ < 0) return nullptr;
#ifdef CSERPS_HAVE_CUDA
    CSERPS_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream_.stream, cudaStreamNonBlocking));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaDeviceOps> ops,
                     CudaDeviceOps::Create(job_->num_params,
                                           job_->config.algorithm().block_size(),
                                           stream_.stream, node_group));
    return std::unique_ptr<DeviceOps>(std::move(ops));
#else
    return absl::FailedPreconditionError(
        "CUDA tensors: this cserps was built without CUDA (configure with -DCSERPS_CUDA=ON "
        "where nvcc is installed)");
#endif
  }

  // Waits for all work queued on device_ (torch's and the ops').
  absl::Status SynchronizeDevice() {
#ifdef CSERPS_HAVE_CUDA
    if (device_ >= 0) CSERPS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
#endif
    return absl::OkStatus();
  }

  // Runs `f` without the GIL, with device_ current on this thread.
  template <typename F>
  void Call(F&& f) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      CurrentDevice current;
      status = current.Set(device_);
      if (status.ok()) status = f();
    }
    ThrowIfError(status);
  }

  const std::shared_ptr<Job> job_;
  const int device_;                // -1: host memory
#ifdef CSERPS_HAVE_CUDA
  OwnedStream stream_;  // the CUDA device ops', with device_ >= 0
#endif
  std::mutex mu_;  // guards the calls into trainer_
  std::unique_ptr<ExternalTrainer> trainer_;
};

}  // namespace
}  // namespace cserps

PYBIND11_MODULE(_native, m) {
  using cserps::Job;
  using cserps::Trainer;
  namespace v1 = cserps::v1;
  cserps::SkipLockOrderChecksWithNdebug();
  m.doc() = "The cserps worker library (python/cserps uses it; not a public API).";
#ifdef CSERPS_HAVE_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif

  py::class_<Job, std::shared_ptr<Job>>(m, "Job")
      .def(py::init(&cserps::LoadJob), py::arg("path"), py::arg("overrides"),
           "Loads the job config at `path`, applies the 'field.path=value' overrides, "
           "the defaults and validation.")
      .def_property_readonly("num_params", [](const Job& j) { return j.num_params; })
      .def_property_readonly("num_workers",
                             [](const Job& j) { return j.config.cluster().num_workers(); })
      .def_property_readonly("local_size",
                             [](const Job& j) { return j.config.cluster().local_size(); })
      .def_property_readonly("algorithm",
                             [](const Job& j) { return j.config.algorithm().name(); })
      .def_property_readonly("block_size",
                             [](const Job& j) { return j.config.algorithm().block_size(); })
      .def_property_readonly("epochs", [](const Job& j) { return j.config.epochs(); })
      .def_property_readonly("lr", [](const Job& j) { return j.config.optimizer().lr(); })
      .def_property_readonly("momentum",
                             [](const Job& j) { return j.config.optimizer().momentum(); })
      .def_property_readonly("momentum_kind",
                             [](const Job& j) {
                               return v1::OptimizerConfig::Momentum_Name(
                                   j.config.optimizer().momentum_kind());
                             })
      .def_property_readonly("weight_decay",
                             [](const Job& j) { return j.config.optimizer().weight_decay(); })
      .def_property_readonly("model_kind",
                             [](const Job& j) {
                               return v1::ModelConfig::Kind_Name(j.config.model().kind());
                             })
      .def_property_readonly("batch_sizes",
                             [](const Job& j) { return cserps::RankBatchSizes(j.config); })
      .def_property_readonly(
          "overall_ratio", [](const Job& j) { return cserps::OverallRatio(j.config.algorithm()); })
      .def_property_readonly("description",
                             [](const Job& j) {
                               return cserps::DescribeAlgorithm(j.config.algorithm());
                             });

  m.def("load_split", &cserps::LoadSplit, py::arg("dir"), py::arg("train"),
        py::arg("limit") = 0,
        "(features, labels, size, dim) of an MNIST-format split in `dir`, "
        "standardised as cserps-worker does.");

  py::class_<Trainer>(m, "Trainer")
      .def(py::init<std::shared_ptr<Job>, int, const std::string&, double, double, uint64_t,
                    int, int>(),
           py::arg("job"), py::arg("rank") = -1, py::arg("worker_id") = "",
           py::arg("setup_timeout_s") = 120.0, py::arg("rpc_slack_s") = 30.0,
           py::arg("steps_per_epoch") = 0, py::arg("device") = -1, py::arg("local_rank") = -1)
      .def("initialize_model", &Trainer::InitializeModel, py::arg("params"), py::arg("count"))
      .def("step", &Trainer::Step, py::arg("lr"), py::arg("grad"), py::arg("params"),
           py::arg("count"))
      .def("finish", &Trainer::Finish, py::arg("params"), py::arg("count"))
      .def("pull_model", &Trainer::PullModel, py::arg("out"), py::arg("count"))
      .def("state_size", &Trainer::StateSize)
      .def("save_state", &Trainer::SaveState, py::arg("params"), py::arg("out"),
           py::arg("count"))
      .def("load_state", &Trainer::LoadState, py::arg("step"), py::arg("buffers"),
           py::arg("count"))
      .def_property_readonly("rank", &Trainer::rank)
      .def_property_readonly("local_rank", &Trainer::local_rank)
      .def_property_readonly("partition", &Trainer::partition)
      .def_property_readonly("step_count", &Trainer::step)
      .def_property_readonly("weight", &Trainer::weight)
      .def_property_readonly("achieved_compression", &Trainer::achieved_compression)
      .def_property_readonly("bytes_pushed", &Trainer::bytes_pushed)
      .def_property_readonly("bytes_pulled", &Trainer::bytes_pulled);
}
