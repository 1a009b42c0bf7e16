// libFuzzer target: the checkpoint reader. Odd first bytes feed the input
// as a whole file; even ones make the bytes after the next four (the
// section count) the payload of a file with a valid header and CRC (the
// format of docs/reliability.md), so that the section table, not the CRC, is what the
// fuzzer explores. Every file must be read back or refused, never crash,
// and what is read back must account for the payload's every float.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "common/checkpoint_file.h"

namespace {

constexpr cserps::CheckpointId kId{0x1234abcd5678ef00ull, 300, cserps::CheckpointRole::kRank, 2};

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::string WithHeader(uint32_t sections, absl::string_view payload) {
  std::string file;
  Put<uint32_t>(&file, 0x4B435343);  // "CSCK"
  Put<uint32_t>(&file, 1);
  Put<uint64_t>(&file, kId.fingerprint);
  Put<uint64_t>(&file, kId.step);
  Put<uint32_t>(&file, static_cast<uint32_t>(kId.role));
  Put<uint32_t>(&file, kId.index);
  Put<uint32_t>(&file, sections);
  Put<uint32_t>(&file, 0);
  Put<uint64_t>(&file, payload.size());
  uLong crc = crc32(0, reinterpret_cast<const Bytef*>(file.data()), 48);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(payload.data()),
              static_cast<uInt>(payload.size()));
  Put<uint32_t>(&file, static_cast<uint32_t>(crc));
  Put<uint32_t>(&file, 0);
  file.append(payload.data(), payload.size());
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  uint32_t count = 0;
  std::memcpy(&count, data + 1, sizeof(count));
  const absl::string_view input(reinterpret_cast<const char*>(data) + 5, size - 5);
  const std::string file = (data[0] & 1) ? std::string(input) : WithHeader(count, input);
  absl::StatusOr<std::vector<cserps::CheckpointSection>> sections =
      cserps::ParseCheckpointFile(file, "fuzz", kId);
  if (!sections.ok() || (data[0] & 1)) return 0;
  size_t bytes = 0;
  for (const cserps::CheckpointSection& s : *sections) {
    bytes += 4 + s.name.size() + 8 + s.values.size() * sizeof(float);
  }
  if (bytes != input.size()) std::abort();
  return 0;
}
