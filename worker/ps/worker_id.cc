#include "worker/ps/worker_id.h"

#include <unistd.h>

#include <cstdint>
#include <random>

#include "absl/strings/str_cat.h"

namespace cserps {
namespace {

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// A file-name-safe form of `text`.
std::string SafeName(const std::string& text) {
  std::string out = text;
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
    if (!ok) c = '_';
  }
  return out;
}

}  // namespace

std::string DefaultWorkerId() {
  std::random_device random;
  const uint64_t nonce = (uint64_t{random()} << 32) | random();
  return absl::StrCat(HostName(), ":", getpid(), ":", absl::Hex(nonce, absl::kZeroPad16));
}

std::string DefaultNodeId(int requested_rank) {
  if (requested_rank < 0) return HostName();
  return absl::StrCat(HostName(), ":rank", requested_rank);
}

std::string DefaultNodeGroupDir(const std::string& job_name, const std::string& node_id) {
  return absl::StrCat("/dev/shm/cserps-", SafeName(job_name), "-", SafeName(node_id));
}

}  // namespace cserps
