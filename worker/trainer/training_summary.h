// What a training run reports: its learning curve, the end of training's
// measurements, and the summary files (<output_dir>/<base>.csv and .json)
// that tools and tests read.
#ifndef CSERPS_WORKER_TRAINER_TRAINING_SUMMARY_H_
#define CSERPS_WORKER_TRAINER_TRAINING_SUMMARY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "cserps/v1/config.pb.h"
#include "worker/model/model.h"
#include "worker/ps/ps_client.h"

namespace cserps {

// One row of the learning curve, written at the end of every epoch.
struct CurvePoint {
  uint64_t epoch = 0;     // epochs begun (the one in progress, 1-based)
  uint64_t step = 0;
  double epochs = 0;      // steps / steps per epoch: where in the training it is
  double train_loss = 0;  // mean over the epoch's steps so far
  double test_loss = 0;
  double test_accuracy = 0;
  double wall_seconds = 0;
  uint64_t bytes_pushed = 0;
  uint64_t bytes_pulled = 0;
};

// The members an elastic job's rounds waited for, from the step after
// `step` on.
struct MembershipChange {
  uint64_t step = 0;
  uint32_t members = 0;
};

// What the end of training measured.
struct FinalReport {
  double local_accuracy = 0;   // this worker's model after the last step
  double global_accuracy = 0;  // the servers' model after the final average
  uint64_t training_floats_pushed = 0;  // PushPull values of the steps
  double achieved_compression = 0;      // steps * d / training_floats_pushed
};

// correct / count of `sums` (0 for no examples).
double Accuracy(const EvalSums& sums);
// "worker_<rank>", or "worker_<rank>_<local_rank>" when local_size > 1.
std::string SummaryBaseName(const v1::JobConfig& config, uint32_t rank,
                            uint32_t local_rank);
// PushPull, sparse and async floats `client` pushed so far, over every
// stream.
uint64_t TrainingFloatsPushed(const PsClient& client);
// Sets `metrics`' per-stream byte counters from the client's totals (model
// pushes and pulls count as "other").
void ReportTraffic(const PsClient& client, WorkerMetrics& metrics);

// What a run's summary reports; every pointer is valid during the call.
struct TrainingSummary {
  const v1::JobConfig* config = nullptr;
  const PsClient* client = nullptr;
  uint32_t rank = 0;
  uint32_t local_rank = 0;
  uint64_t num_params = 0;
  uint64_t steps = 0;
  // The checkpoint's step this process resumed from (0: none): the curve,
  // the traffic and the wall time are of the steps after it.
  uint64_t resumed_from_step = 0;
  // The admission step at which it rejoined an elastic job (0: none): the
  // same.
  uint64_t joined_at_step = 0;
  // Roll backs to a restarted shard's checkpoint the run followed.
  uint32_t roll_backs = 0;
  uint32_t batch_size = 0;
  const std::vector<CurvePoint>* curve = nullptr;
  const FinalReport* final_report = nullptr;
  const std::vector<MembershipChange>* membership = nullptr;  // null: none
  double wall_seconds = 0;
};
// Makes <output_dir> and checks that this process can write a file there,
// before the training whose summary it will hold: FAILED_PRECONDITION
// naming output_dir otherwise (found at the end, the run's results were
// lost, and a restart policy trained it again only to lose them again).
absl::Status PrepareOutputDir(const v1::JobConfig& config);

// Writes <output_dir>/<SummaryBaseName>.csv (the curve) and .json.
// PrepareOutputDir's error when the folder cannot be made or written to;
// DATA_LOSS naming the file when a write fails.
absl::Status WriteTrainingSummary(const TrainingSummary& summary);

}  // namespace cserps

#endif  // CSERPS_WORKER_TRAINER_TRAINING_SUMMARY_H_
