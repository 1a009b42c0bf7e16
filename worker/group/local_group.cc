#include "worker/group/local_group.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {

absl::Status ShareStatus(LocalGroup& group, const absl::Status& mine,
                         absl::string_view what) {
  std::vector<float> codes(group.size(), 0.0f);
  codes[group.local_rank()] = static_cast<float>(mine.code());
  const absl::Status shared = group.AllReduceSum(absl::MakeSpan(codes));
  if (!mine.ok()) return mine;
  RETURN_IF_ERROR(shared);
  for (uint32_t j = 0; j < codes.size(); ++j) {
    if (codes[j] != 0.0f) {
      return absl::Status(
          static_cast<absl::StatusCode>(codes[j]),
          absl::StrCat(what, ": local rank ", j, " failed with ",
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(codes[j])),
                       " (its own error says why)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace cserps
