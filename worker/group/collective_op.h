// What one member of a local group asked a collective for: every member of
// one collective must ask for the same, and a disagreement names both.
#ifndef CSERPS_WORKER_GROUP_COLLECTIVE_OP_H_
#define CSERPS_WORKER_GROUP_COLLECTIVE_OP_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace cserps {

enum class CollectiveKind : uint32_t { kAllReduceSum = 1, kBroadcast = 2 };

struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::kAllReduceSum;
  uint32_t root = 0;  // Broadcast only
  uint64_t count = 0;

  friend bool operator==(const CollectiveOp& a, const CollectiveOp& b) {
    return a.kind == b.kind && a.root == b.root && a.count == b.count;
  }
};

inline std::string Describe(const CollectiveOp& op) {
  if (op.kind == CollectiveKind::kAllReduceSum) {
    return absl::StrCat("AllReduceSum of ", op.count, " floats");
  }
  return absl::StrCat("Broadcast from local rank ", op.root, " of ", op.count, " floats");
}

}  // namespace cserps

#endif  // CSERPS_WORKER_GROUP_COLLECTIVE_OP_H_
