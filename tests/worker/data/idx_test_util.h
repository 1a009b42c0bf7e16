// Helpers for tests that write their own IDX files.
#ifndef CSERPS_TESTS_WORKER_DATA_IDX_TEST_UTIL_H_
#define CSERPS_TESTS_WORKER_DATA_IDX_TEST_UTIL_H_

#include <stdlib.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace cserps {
namespace testutil {

// An IDX file: magic 00 00, `type`, dims.size(), big-endian dims, payload.
inline std::string IdxBytes(const std::vector<uint32_t>& dims,
                            const std::vector<uint8_t>& payload,
                            uint8_t type = 0x08) {
  std::string out = {'\0', '\0', static_cast<char>(type),
                     static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      out.push_back(static_cast<char>((d >> shift) & 0xff));
    }
  }
  out.append(payload.begin(), payload.end());
  return out;
}

// One gzip member holding `plain`, written by zlib's deflate.
inline std::string Gzip(const std::string& plain) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8,
                         Z_DEFAULT_STRATEGY),
            Z_OK);
  std::string out(deflateBound(&zs, plain.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  zs.avail_in = static_cast<uInt>(plain.size());
  zs.next_out = reinterpret_cast<Bytef*>(&out[0]);
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good()) << path;
}

// A fresh directory under testing::TempDir().
inline std::string MakeTempDir() {
  std::string templ = ::testing::TempDir() + "/cserps_data_XXXXXX";
  char* dir = mkdtemp(&templ[0]);
  EXPECT_NE(dir, nullptr) << templ;
  return templ;
}

}  // namespace testutil
}  // namespace cserps

#endif  // CSERPS_TESTS_WORKER_DATA_IDX_TEST_UTIL_H_
