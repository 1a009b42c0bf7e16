#include "common/metrics.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace cserps {

class MetricsRegistry::Collector::Impl : public prometheus::Collectable {
 public:
  explicit Impl(std::function<std::vector<prometheus::MetricFamily>()> collect)
      : collect_(std::move(collect)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    if (!collect_) return {};
    return collect_();
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    collect_ = nullptr;
  }

 private:
  // Held across collect_ so that Stop waits for a scrape in progress.
  mutable absl::Mutex mu_;
  std::function<std::vector<prometheus::MetricFamily>()> collect_
      ABSL_GUARDED_BY(mu_);
};

MetricsRegistry::Collector::~Collector() { impl_->Stop(); }

MetricsRegistry::MetricsRegistry()
    : registry_(std::make_shared<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() = default;

absl::StatusOr<std::unique_ptr<MetricsRegistry>> MetricsRegistry::Start(
    const std::string& address) {
  std::unique_ptr<MetricsRegistry> metrics(new MetricsRegistry());
  ASSIGN_OR_RETURN(metrics->http_,
                   MetricsHttpServer::Start(address, [m = metrics.get()] { return m->Collect(); }));
  metrics->address_ = metrics->http_->address();
  return metrics;
}

std::unique_ptr<MetricsRegistry> MetricsRegistry::WithoutEndpoint() {
  return std::unique_ptr<MetricsRegistry>(new MetricsRegistry());
}

namespace {

template <typename T, typename Builder, typename... Args>
absl::StatusOr<T*> AddSeries(Builder builder, prometheus::Registry& registry,
                             const std::string& name, const std::string& help,
                             const std::map<std::string, std::string>& labels,
                             Args&&... args) {
  try {
    prometheus::Family<T>& family = builder.Name(name).Help(help).Register(registry);
    return &family.Add(labels, std::forward<Args>(args)...);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name, ": ", e.what()));
  }
}

}  // namespace

absl::StatusOr<prometheus::Counter*> MetricsRegistry::Counter(
    const std::string& name, const std::string& help,
    const std::map<std::string, std::string>& labels) {
  return AddSeries<prometheus::Counter>(prometheus::BuildCounter(), *registry_,
                                        name, help, labels);
}

absl::StatusOr<prometheus::Gauge*> MetricsRegistry::Gauge(
    const std::string& name, const std::string& help,
    const std::map<std::string, std::string>& labels) {
  return AddSeries<prometheus::Gauge>(prometheus::BuildGauge(), *registry_,
                                      name, help, labels);
}

absl::StatusOr<prometheus::Histogram*> MetricsRegistry::Histogram(
    const std::string& name, const std::string& help,
    const std::map<std::string, std::string>& labels,
    const std::vector<double>& buckets) {
  return AddSeries<prometheus::Histogram>(prometheus::BuildHistogram(),
                                          *registry_, name, help, labels,
                                          buckets);
}

std::unique_ptr<MetricsRegistry::Collector> MetricsRegistry::AddCollector(
    std::function<std::vector<prometheus::MetricFamily>()> collect) {
  auto impl = std::make_shared<Collector::Impl>(std::move(collect));
  {
    absl::MutexLock lock(&mu_);
    collectables_.push_back(impl);
  }
  return std::unique_ptr<Collector>(new Collector(impl));
}

std::string MetricsRegistry::Collect() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  {
    absl::MutexLock lock(&mu_);
    for (const std::weak_ptr<prometheus::Collectable>& weak : collectables_) {
      if (std::shared_ptr<prometheus::Collectable> c = weak.lock()) {
        std::vector<prometheus::MetricFamily> more = c->Collect();
        families.insert(families.end(), more.begin(), more.end());
      }
    }
  }
  try {
    return prometheus::TextSerializer().Serialize(families);
  } catch (const std::exception& e) {
    return absl::StrCat("# cannot serialize metrics: ", e.what(), "\n");
  }
}

// ---------------------------------------------------------------- server

namespace {

// Round latencies from a millisecond (small models, one host) to a minute
// (the default round timeout).
const std::vector<double>& LatencyBuckets() {
  static const auto* buckets = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *buckets;
}

prometheus::ClientMetric Sample(std::vector<prometheus::ClientMetric::Label> labels,
                                double value, prometheus::MetricType type) {
  prometheus::ClientMetric metric;
  metric.label = std::move(labels);
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return metric;
}

prometheus::MetricFamily Family(std::string name, std::string help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Create(
    MetricsRegistry* registry, uint32_t shard) {
  std::unique_ptr<ServerMetrics> metrics(new ServerMetrics(registry, shard));
  for (const char* stream : {"GRAD", "MODEL", "sparse"}) {
    ASSIGN_OR_RETURN(
        metrics->round_latency_[stream],
        registry->Histogram("cserps_server_round_latency_seconds",
                            "Time from a round's first push to its completion.",
                            {{"shard", absl::StrCat(shard)}, {"stream", stream}},
                            LatencyBuckets()));
  }
  return metrics;
}

void ServerMetrics::Attach(std::function<Snapshot()> snapshot) {
  const std::string shard = absl::StrCat(shard_);
  collector_ = registry_->AddCollector([shard, snapshot = std::move(snapshot)] {
    using prometheus::MetricType;
    const Snapshot s = snapshot();
    std::vector<prometheus::MetricFamily> out;
    auto single = [&](const char* name, const char* help, MetricType type,
                      uint64_t value) {
      out.push_back(Family(name, help, type));
      out.back().metric.push_back(
          Sample({{"shard", shard}}, static_cast<double>(value), type));
    };
    single("cserps_server_members_registered", "Workers registered with the shard.",
           MetricType::Gauge, s.members_registered);
    single("cserps_server_members_alive",
           "Registered workers heard from within cluster.round_timeout_s, or "
           "waiting in a call.",
           MetricType::Gauge, s.members_alive);
    single("cserps_server_members_dropped_total",
           "Ranks an elastic job dropped on the shard: they missed a round's timeout.",
           MetricType::Counter, s.members_dropped);
    single("cserps_server_members_admitted_total",
           "Ranks an elastic job admitted back on the shard at a full average (Rejoin).",
           MetricType::Counter, s.members_admitted);
    single("cserps_server_open_rounds", "Rounds (dense and sparse) waiting for pushes.",
           MetricType::Gauge, s.open_rounds);
    single("cserps_server_model_step",
           "Newest step of any completed round or applied asynchronous push.",
           MetricType::Gauge, s.newest_step);
    auto by_label = [&](const char* name, const char* help, const char* label,
                        const std::map<std::string, uint64_t>& values) {
      out.push_back(Family(name, help, MetricType::Counter));
      for (const auto& [key, value] : values) {
        out.back().metric.push_back(Sample({{"shard", shard}, {label, key}},
                                           static_cast<double>(value),
                                           MetricType::Counter));
      }
    };
    auto by_stream = [&](const char* name, const char* help,
                         const std::map<std::string, uint64_t>& values) {
      by_label(name, help, "stream", values);
    };
    by_stream("cserps_server_rounds_completed_total",
              "Rounds completed: PushPull averaging rounds (one chunk of one step), "
              "sparse rounds (one step), applied asynchronous pushes.",
              s.rounds_completed);
    by_stream("cserps_server_rounds_failed_total",
              "Rounds failed (timeout or shutdown).", s.rounds_failed);
    by_stream("cserps_server_bytes_in_total",
              "Serialized request bytes received by the shard's services.",
              s.bytes_in);
    by_stream("cserps_server_bytes_out_total",
              "Serialized reply bytes sent by the shard's services.",
              s.bytes_out);
    by_label("cserps_server_refused_total",
             "Calls refused: unauthenticated (no or a wrong job token), bad_certificate "
             "(a client certificate the job's CA did not sign), bad_input (a request the "
             "shard's checks refused).",
             "reason", s.refused);
    return out;
  });
}

void ServerMetrics::Detach() { collector_.reset(); }

void ServerMetrics::ObserveRoundLatency(const std::string& stream,
                                        absl::Duration latency) {
  auto it = round_latency_.find(stream);
  if (it != round_latency_.end()) {
    it->second->Observe(absl::ToDoubleSeconds(latency));
  }
}

// ---------------------------------------------------------------- worker

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    MetricsRegistry* registry, uint32_t rank, const std::string& algorithm) {
  std::unique_ptr<WorkerMetrics> m(new WorkerMetrics());
  const std::map<std::string, std::string> labels = {
      {"rank", absl::StrCat(rank)}, {"algorithm", algorithm}};
  auto with = [&labels](const char* name, const char* value) {
    std::map<std::string, std::string> more = labels;
    more[name] = value;
    return more;
  };
  ASSIGN_OR_RETURN(m->steps_, registry->Counter("cserps_worker_steps_total",
                                                "Training steps completed.", labels));
  ASSIGN_OR_RETURN(m->samples_per_second_,
                   registry->Gauge("cserps_worker_samples_per_second",
                                   "Training examples per second of the last step.",
                                   labels));
  // Step phases from 100 us (tiny models) to 10 s (a straggler's round).
  const std::vector<double> step_buckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                            0.005,  0.01,    0.025,  0.05,  0.1,
                                            0.25,   0.5,     1,      2.5,   10};
  const char* step_help =
      "Duration of a training step's phases: compute (forward/backward), "
      "communication (blocked waiting for the servers) and update (the rest of "
      "the algorithm's step).";
  ASSIGN_OR_RETURN(m->compute_seconds_,
                   registry->Histogram("cserps_worker_step_seconds", step_help,
                                       with("phase", "compute"), step_buckets));
  ASSIGN_OR_RETURN(m->communication_seconds_,
                   registry->Histogram("cserps_worker_step_seconds", step_help,
                                       with("phase", "communication"), step_buckets));
  ASSIGN_OR_RETURN(m->update_seconds_,
                   registry->Histogram("cserps_worker_step_seconds", step_help,
                                       with("phase", "update"), step_buckets));
  for (const char* stream : kStreams) {
    Traffic& t = m->traffic_[stream];
    ASSIGN_OR_RETURN(t.pushed,
                     registry->Counter("cserps_worker_bytes_pushed_total",
                                       "Serialized request bytes sent to servers.",
                                       with("stream", stream)));
    ASSIGN_OR_RETURN(t.pulled,
                     registry->Counter("cserps_worker_bytes_pulled_total",
                                       "Serialized reply bytes received from servers.",
                                       with("stream", stream)));
  }
  ASSIGN_OR_RETURN(m->compression_ratio_,
                   registry->Gauge("cserps_worker_compression_ratio",
                                   "Achieved compression: steps * d / floats pushed.",
                                   labels));
  ASSIGN_OR_RETURN(m->members_,
                   registry->Gauge("cserps_worker_job_members",
                                   "Members the servers' rounds wait for: num_workers until an "
                                   "elastic job drops some.",
                                   labels));
  ASSIGN_OR_RETURN(m->train_loss_, registry->Gauge("cserps_worker_train_loss",
                                                   "Training loss of the last step.",
                                                   labels));
  const char* accuracy_help =
      "Test accuracy of the local model (end of each epoch and of training) or "
      "of the servers' global model (end of training).";
  ASSIGN_OR_RETURN(m->test_accuracy_local_,
                   registry->Gauge("cserps_worker_test_accuracy", accuracy_help,
                                   with("model", "local")));
  ASSIGN_OR_RETURN(m->test_accuracy_global_,
                   registry->Gauge("cserps_worker_test_accuracy", accuracy_help,
                                   with("model", "global")));
  ASSIGN_OR_RETURN(m->learning_rate_,
                   registry->Gauge("cserps_worker_learning_rate",
                                   "Learning rate of the last step.", labels));
  return m;
}

void WorkerMetrics::RecordStep(absl::Duration compute, absl::Duration communication,
                               absl::Duration update, uint32_t batch_size, double loss,
                               double lr) {
  steps_->Increment();
  compute_seconds_->Observe(absl::ToDoubleSeconds(compute));
  communication_seconds_->Observe(absl::ToDoubleSeconds(communication));
  update_seconds_->Observe(absl::ToDoubleSeconds(update));
  const double seconds = absl::ToDoubleSeconds(compute + communication + update);
  if (seconds > 0) samples_per_second_->Set(batch_size / seconds);
  train_loss_->Set(loss);
  learning_rate_->Set(lr);
}

void WorkerMetrics::SetTraffic(const std::string& stream, uint64_t bytes_pushed,
                               uint64_t bytes_pulled) {
  auto it = traffic_.find(stream);
  if (it == traffic_.end()) return;
  Traffic& t = it->second;
  // PsClient's totals only grow; guard anyway so a counter never goes down.
  if (bytes_pushed > t.last_pushed) {
    t.pushed->Increment(static_cast<double>(bytes_pushed - t.last_pushed));
    t.last_pushed = bytes_pushed;
  }
  if (bytes_pulled > t.last_pulled) {
    t.pulled->Increment(static_cast<double>(bytes_pulled - t.last_pulled));
    t.last_pulled = bytes_pulled;
  }
}

}  // namespace cserps
