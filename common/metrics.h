// Prometheus metrics of servers and workers (docs/metrics.md): a registry
// with an HTTP /metrics endpoint, and the metric handles of one server shard
// (ServerMetrics) or one worker (WorkerMetrics).
//
// Every family is built once, when its owner is created; the objects that
// update metrics keep the handles. prometheus-cpp reports bad names, label
// clashes and unbindable addresses by throwing: every call into it here
// catches std::exception and returns an absl::Status instead, so no
// exception leaves this module.
//
// Thread safety: handles (prometheus::Counter, Gauge, Histogram) may be
// updated from any thread; scrapes run on the endpoint's own thread.
#ifndef CSERPS_COMMON_METRICS_H_
#define CSERPS_COMMON_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics_http.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace cserps {

class MetricsRegistry {
 public:
  // Serves http://ADDRESS/metrics, ADDRESS being "host:port"; port 0 picks a
  // free port (see address()). INVALID_ARGUMENT for an address without a
  // port, UNAVAILABLE when it cannot be bound; both name the address.
  static absl::StatusOr<std::unique_ptr<MetricsRegistry>> Start(
      const std::string& address);
  // A registry without an endpoint (Collect() reads it): for tests.
  static std::unique_ptr<MetricsRegistry> WithoutEndpoint();
  ~MetricsRegistry();

  // "host:port" with the port actually bound; empty without an endpoint.
  const std::string& address() const { return address_; }

  // A time series of family `name`, built on first use (the help text of
  // the first use wins). Errors (bad name or labels, name already used by
  // another type) are INVALID_ARGUMENT naming the metric. The handle lives
  // as long as the registry.
  absl::StatusOr<prometheus::Counter*> Counter(
      const std::string& name, const std::string& help,
      const std::map<std::string, std::string>& labels);
  absl::StatusOr<prometheus::Gauge*> Gauge(
      const std::string& name, const std::string& help,
      const std::map<std::string, std::string>& labels);
  absl::StatusOr<prometheus::Histogram*> Histogram(
      const std::string& name, const std::string& help,
      const std::map<std::string, std::string>& labels,
      const std::vector<double>& buckets);

  // Families computed at scrape time by `collect` (e.g. from counters an
  // object keeps anyway). `collect` is called until the returned handle is
  // destroyed; its destructor waits for a scrape in progress, so `collect`
  // may use objects that outlive the handle.
  class Collector;
  std::unique_ptr<Collector> AddCollector(
      std::function<std::vector<prometheus::MetricFamily>()> collect);

  // The text exposition of everything registered, as a scrape sees it.
  std::string Collect() const;

 private:
  MetricsRegistry();

  std::shared_ptr<prometheus::Registry> registry_;
  std::string address_;
  // Families computed at scrape time, read by Collect.
  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables_
      ABSL_GUARDED_BY(mu_);
  // Last: stopped before the members its scrapes read are destroyed.
  std::unique_ptr<MetricsHttpServer> http_;
};

class MetricsRegistry::Collector {
 public:
  ~Collector();

 private:
  friend class MetricsRegistry;
  class Impl;
  explicit Collector(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// One server shard's metrics (labels shard, stream).
class ServerMetrics {
 public:
  // What the shard's services count, read at every scrape.
  struct Snapshot {
    // Rounds by stream: "GRAD" / "MODEL" / "CHECKPOINT" (PushPull), "sparse"
    // (SparsePushPull), "async" (AsyncPushPull: one applied push is one
    // round; a push failed at shutdown is a failed one).
    std::map<std::string, uint64_t> rounds_completed;
    std::map<std::string, uint64_t> rounds_failed;
    uint64_t members_registered = 0;
    // Members heard from within cluster.round_timeout_s, or waiting in a
    // call (server/member_activity.h).
    uint64_t members_alive = 0;
    // Ranks an elastic job dropped (ClusterConfig.elastic), and admitted
    // back.
    uint64_t members_dropped = 0;
    uint64_t members_admitted = 0;
    uint64_t open_rounds = 0;  // dense and sparse
    uint64_t newest_step = 0;
    // Traffic by stream: the streams above for the requests they accepted
    // and the replies they sent, and "other" for the rest (PushModel and
    // PullModel, refused requests).
    std::map<std::string, uint64_t> bytes_in;
    std::map<std::string, uint64_t> bytes_out;
    // Calls refused by reason: "unauthenticated" (no or a wrong job token),
    // "bad_certificate" (a client certificate the job's CA did not sign),
    // "bad_input" (a request the shard's checks refused).
    std::map<std::string, uint64_t> refused;
  };

  // `registry` outlives the result.
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Create(
      MetricsRegistry* registry, uint32_t shard);

  // Starts reading `snapshot` at scrape time; call once. `snapshot` is
  // called until Detach or destruction.
  void Attach(std::function<Snapshot()> snapshot);
  // Stops reading the snapshot; waits for a scrape in progress.
  void Detach();

  // A round of `stream` ("GRAD", "MODEL" or "sparse"; others are ignored)
  // completed `latency` after its first push.
  void ObserveRoundLatency(const std::string& stream, absl::Duration latency);

 private:
  ServerMetrics(MetricsRegistry* registry, uint32_t shard)
      : registry_(registry), shard_(shard) {}

  MetricsRegistry* const registry_;
  const uint32_t shard_;
  std::map<std::string, prometheus::Histogram*> round_latency_;
  std::unique_ptr<MetricsRegistry::Collector> collector_;
};

// One worker's metrics (labels rank, algorithm; stream and phase where they
// apply). Not thread-safe to update from several threads at once (the
// trainer's loop is the only writer).
class WorkerMetrics {
 public:
  static constexpr const char* kStreams[] = {"GRAD", "MODEL", "CHECKPOINT", "sparse", "async",
                                             "other"};

  // `registry` outlives the result.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(
      MetricsRegistry* registry, uint32_t rank, const std::string& algorithm);

  // One finished step: its phases' durations (forward/backward, blocked
  // waiting for the servers, the rest of the algorithm's step) and what it
  // measured.
  void RecordStep(absl::Duration compute, absl::Duration communication,
                  absl::Duration update, uint32_t batch_size, double loss, double lr);
  // Cumulative bytes of `stream` (one of kStreams) so far; counters advance
  // by the growth since the last call.
  void SetTraffic(const std::string& stream, uint64_t bytes_pushed,
                  uint64_t bytes_pulled);
  void SetCompressionRatio(double ratio) { compression_ratio_->Set(ratio); }
  // The members the servers' rounds wait for (fewer once an elastic job
  // dropped some).
  void SetMembers(uint32_t members) { members_->Set(members); }
  void SetTestAccuracy(bool global, double accuracy) {
    (global ? test_accuracy_global_ : test_accuracy_local_)->Set(accuracy);
  }

 private:
  WorkerMetrics() = default;

  struct Traffic {
    prometheus::Counter* pushed = nullptr;
    prometheus::Counter* pulled = nullptr;
    uint64_t last_pushed = 0;
    uint64_t last_pulled = 0;
  };

  prometheus::Counter* steps_ = nullptr;
  prometheus::Gauge* samples_per_second_ = nullptr;
  prometheus::Histogram* compute_seconds_ = nullptr;
  prometheus::Histogram* communication_seconds_ = nullptr;
  prometheus::Histogram* update_seconds_ = nullptr;
  std::map<std::string, Traffic> traffic_;
  prometheus::Gauge* compression_ratio_ = nullptr;
  prometheus::Gauge* members_ = nullptr;
  prometheus::Gauge* train_loss_ = nullptr;
  prometheus::Gauge* test_accuracy_local_ = nullptr;
  prometheus::Gauge* test_accuracy_global_ = nullptr;
  prometheus::Gauge* learning_rate_ = nullptr;
};

}  // namespace cserps

#endif  // CSERPS_COMMON_METRICS_H_
