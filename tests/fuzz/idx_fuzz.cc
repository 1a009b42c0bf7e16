// libFuzzer target: the IDX reader (plain and gzip) on arbitrary bytes. A
// parsed array must hold exactly the product of its dimensions.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "worker/data/idx_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<cserps::IdxArray> array =
      cserps::ParseIdx(absl::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!array.ok()) return 0;
  uint64_t elements = 1;
  for (uint32_t d : array->dims) elements *= d;
  if (elements != array->data.size()) std::abort();
  return 0;
}
