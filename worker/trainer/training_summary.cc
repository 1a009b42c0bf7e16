#include "worker/trainer/training_summary.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/algorithm_catalog.h"
#include "common/status.h"

namespace cserps {

double Accuracy(const EvalSums& sums) {
  return static_cast<double>(sums.correct) / std::max<size_t>(1, sums.count);
}

std::string SummaryBaseName(const v1::JobConfig& config, uint32_t rank,
                            uint32_t local_rank) {
  if (config.cluster().local_size() == 1) return absl::StrCat("worker_", rank);
  return absl::StrCat("worker_", rank, "_", local_rank);
}

uint64_t TrainingFloatsPushed(const PsClient& client) {
  uint64_t floats =
      client.sparse_traffic().request_floats + client.async_traffic().request_floats;
  for (v1::Stream s : {v1::GRAD, v1::MODEL}) floats += client.traffic(s).request_floats;
  return floats;
}

void ReportTraffic(const PsClient& client, WorkerMetrics& metrics) {
  const std::pair<const char*, TrafficCounts> streams[] = {
      {"GRAD", client.traffic(v1::GRAD)},
      {"MODEL", client.traffic(v1::MODEL)},
      {"CHECKPOINT", client.traffic(v1::CHECKPOINT)},
      {"sparse", client.sparse_traffic()},
      {"async", client.async_traffic()}};
  uint64_t pushed = 0, pulled = 0;
  for (const auto& [name, traffic] : streams) {
    metrics.SetTraffic(name, traffic.request_bytes, traffic.reply_bytes);
    pushed += traffic.request_bytes;
    pulled += traffic.reply_bytes;
  }
  // Model pushes and pulls count only towards the totals.
  metrics.SetTraffic("other", client.bytes_pushed() > pushed ? client.bytes_pushed() - pushed : 0,
                      client.bytes_pulled() > pulled ? client.bytes_pulled() - pulled : 0);
}

absl::Status PrepareOutputDir(const v1::JobConfig& config) {
  const std::filesystem::path dir(config.output_dir());
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("output_dir: cannot create ", dir.string(), ": ", error.message()));
  }
  // A name of its own (mkostemp): the ranks of a job, threads of one
  // process or containers each pid 1, may share the folder.
  std::string probe = (dir / ".cserps-probe.XXXXXX").string();
  const int fd = mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "output_dir: cannot write in ", dir.string(), ": ", std::strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

absl::Status WriteTrainingSummary(const TrainingSummary& summary) {
  const v1::JobConfig& config = *summary.config;
  const PsClient& client = *summary.client;
  const FinalReport& final_report = *summary.final_report;
  const double wall_seconds = summary.wall_seconds;
  const std::filesystem::path dir(config.output_dir());
  RETURN_IF_ERROR(PrepareOutputDir(config));  // it may have gone since the start
  const std::string base = SummaryBaseName(config, summary.rank, summary.local_rank);
  {
    std::ofstream csv(dir / (base + ".csv"));
    csv << "epoch,step,train_loss,test_loss,test_accuracy,wall_seconds,bytes_pushed,bytes_pulled,"
           "epochs\n";
    for (const CurvePoint& p : *summary.curve) {
      csv << absl::StrFormat("%d,%d,%.6f,%.6f,%.6f,%.3f,%d,%d,%.4f\n", p.epoch, p.step,
                             p.train_loss, p.test_loss, p.test_accuracy,
                             p.wall_seconds, p.bytes_pushed, p.bytes_pulled, p.epochs);
    }
    if (!csv) return absl::DataLossError(absl::StrCat("cannot write ", (dir / (base + ".csv")).string()));
  }
  const CurvePoint last = summary.curve->empty() ? CurvePoint() : summary.curve->back();
  std::string changes;
  if (summary.membership != nullptr) {
    for (const MembershipChange& c : *summary.membership) {
      absl::StrAppend(&changes, changes.empty() ? "" : ", ", "{\"step\": ", c.step,
                      ", \"members\": ", c.members, "}");
    }
  }
  std::ofstream json(dir / (base + ".json"));
  const TrafficCounts grad = client.traffic(v1::GRAD);
  const TrafficCounts model = client.traffic(v1::MODEL);
  json << absl::StrFormat(
      "{\n  \"job\": \"%s\",\n  \"rank\": %d,\n  \"local_rank\": %d,\n"
      "  \"local_size\": %d,\n  \"algorithm\": \"%s\",\n"
      "  \"num_params\": %d,\n  \"epochs\": %d,\n  \"steps\": %d,\n"
      "  \"resumed_from_step\": %d,\n  \"joined_at_step\": %d,\n  \"roll_backs\": %d,\n"
      "  \"batch_size\": %d,\n  \"train_loss\": %.6f,\n  \"test_loss\": %.6f,\n"
      "  \"test_accuracy\": %.6f,\n  \"wall_seconds\": %.3f,\n"
      "  \"samples_per_second\": %.1f,\n  \"bytes_pushed\": %d,\n"
      "  \"bytes_pulled\": %d,\n"
      "  \"grad_bytes_pushed\": %d,\n  \"grad_bytes_pulled\": %d,\n"
      "  \"model_bytes_pushed\": %d,\n  \"model_bytes_pulled\": %d,\n"
      "  \"training_floats_pushed\": %d,\n  \"overall_ratio\": %.6g,\n"
      "  \"achieved_compression\": %.6g,\n"
      "  \"test_accuracy_local\": %.6f,\n  \"test_accuracy_global\": %.6f,\n"
      "  \"membership_changes\": [%s]\n}\n",
      config.name(), summary.rank, summary.local_rank, config.cluster().local_size(),
      config.algorithm().name(), summary.num_params,
      config.epochs(), summary.steps, summary.resumed_from_step, summary.joined_at_step,
      summary.roll_backs,
      summary.batch_size,
      last.train_loss, last.test_loss, last.test_accuracy, wall_seconds,
      wall_seconds > 0
          ? (summary.steps - std::max(summary.resumed_from_step, summary.joined_at_step)) *
                summary.batch_size / wall_seconds
          : 0.0,
      client.bytes_pushed(), client.bytes_pulled(), grad.request_bytes,
      grad.reply_bytes, model.request_bytes, model.reply_bytes,
      final_report.training_floats_pushed, OverallRatio(config.algorithm()),
      final_report.achieved_compression, final_report.local_accuracy,
      final_report.global_accuracy, changes);
  if (!json) return absl::DataLossError(absl::StrCat("cannot write ", (dir / (base + ".json")).string()));
  return absl::OkStatus();
}

}  // namespace cserps
