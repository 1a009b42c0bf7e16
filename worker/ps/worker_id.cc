#include "worker/ps/worker_id.h"

#include <unistd.h>

#include <cstdint>
#include <random>

#include "absl/strings/str_cat.h"

namespace cserps {

std::string DefaultWorkerId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device random;
  const uint64_t nonce = (uint64_t{random()} << 32) | random();
  return absl::StrCat(host, ":", getpid(), ":", absl::Hex(nonce, absl::kZeroPad16));
}

}  // namespace cserps
