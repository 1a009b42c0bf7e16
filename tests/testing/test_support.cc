#include "tests/testing/test_support.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/prng.h"
#include "common/status.h"

namespace cserps::testing {

absl::Status ServerSet::Start(v1::JobConfig* config, ParameterServerService::Options options) {
  // Addresses of an earlier set (a config started twice) are stale: a new
  // shard that drew one of their ports would list it twice.
  for (std::string& address : *config->mutable_cluster()->mutable_servers()) {
    address = "127.0.0.1:0";
  }
  for (int s = 0; s < config->cluster().servers_size(); ++s) {
    ASSIGN_OR_RETURN(std::unique_ptr<PsServer> server,
                     PsServer::Start(*config, s, "127.0.0.1:0", options));
    config->mutable_cluster()->set_servers(s, server->address());
    shards_.push_back(std::move(server));
  }
  return absl::OkStatus();
}

ServerSet::~ServerSet() {
  for (auto& server : shards_) server->Shutdown();
}

ReferenceDirection::ReferenceDirection(const v1::OptimizerConfig& optimizer,
                                       size_t num_params)
    : kind_(optimizer.momentum_kind()),
      beta_(optimizer.momentum()),
      lambda_(optimizer.weight_decay()),
      m_(num_params, 0.0f) {}

std::vector<float> ReferenceDirection::Compute(absl::Span<const float> g,
                                               absl::Span<const float> x) {
  std::vector<float> p(g.size());
  for (size_t j = 0; j < g.size(); ++j) {
    const float d = g[j] + lambda_ * x[j];
    switch (kind_) {
      case v1::OptimizerConfig::HEAVY_BALL:
        m_[j] = beta_ * m_[j] + d;
        p[j] = m_[j];
        break;
      case v1::OptimizerConfig::NESTEROV:
        m_[j] = beta_ * m_[j] + d;
        p[j] = d + beta_ * m_[j];
        break;
      default:
        p[j] = d;
        break;
    }
  }
  return p;
}

double RelativeL2(absl::Span<const float> a, absl::Span<const float> b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double JsonNumber(const std::string& json, const std::string& key) {
  const std::string needle = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(needle);
  if (at == std::string::npos) return -1;
  double value = -1;
  const size_t begin = at + needle.size();
  if (!absl::SimpleAtod(json.substr(begin, json.find_first_of(",\n", begin) - begin), &value)) {
    return -1;
  }
  return value;
}

absl::StatusOr<std::vector<std::unique_ptr<Trainer>>> TrainersOf(InProcessCluster& cluster,
                                                                 const Dataset& train,
                                                                 const Dataset& test) {
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 0; r < cluster.num_workers(); ++r) {
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(cluster.config(), &cluster.client(r), &train, &test));
    trainers.push_back(std::move(trainer));
  }
  return trainers;
}

}  // namespace cserps::testing
