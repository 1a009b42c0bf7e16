#include "worker/data/idx_reader.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/data/idx_test_util.h"

namespace cserps {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::Gzip;
using testutil::IdxBytes;

class IdxReaderTest : public ::testing::Test {
 protected:
  // Writes `bytes` to a fresh file and returns its path.
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    testutil::WriteFile(path, bytes);
    return path;
  }

  const std::string dir_ = testutil::MakeTempDir();
};

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 1);
  return v;
}

TEST_F(IdxReaderTest, ReadsPlainFile) {
  const std::vector<uint8_t> payload = Iota(2 * 3 * 4);
  const std::string path = Write("plain", IdxBytes({2, 3, 4}, payload));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(2, 3, 4));
  EXPECT_EQ(array->data, payload);
}

TEST_F(IdxReaderTest, ReadsGzipFile) {
  const std::vector<uint8_t> payload = Iota(300 * 2);
  const std::string path = Write("file.gz", Gzip(IdxBytes({300, 2}, payload)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(300, 2));
  EXPECT_EQ(array->data, payload);
}

TEST_F(IdxReaderTest, ReadsMultiMemberGzip) {
  // gzip permits concatenated members; gunzip reads them as one stream.
  const std::vector<uint8_t> payload = Iota(50);
  const std::string plain = IdxBytes({50}, payload);
  const std::string path =
      Write("multi.gz", Gzip(plain.substr(0, 20)) + Gzip(plain.substr(20)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->dims, ElementsAre(50));
  EXPECT_EQ(array->data, payload);
}

TEST_F(IdxReaderTest, ParseIdxNamesTheGivenName) {
  absl::StatusOr<IdxArray> array =
      ParseIdx(IdxBytes({3}, {1, 2}), "labels-from-memory");
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr("labels-from-memory"));
}

TEST_F(IdxReaderTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/does-not-exist";
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST_F(IdxReaderTest, TruncatedMagic) {
  const std::string path = Write("short", std::string("\0\0", 2));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated header")));
}

TEST_F(IdxReaderTest, TruncatedHeader) {
  // Three dimensions need a 16-byte header; keep 10 bytes of it.
  const std::string path =
      Write("header", IdxBytes({2, 3, 4}, Iota(24)).substr(0, 10));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated header"),
                    HasSubstr("16"), HasSubstr("10")));
}

TEST_F(IdxReaderTest, TruncatedPayloadSaysExpectedAndPresent) {
  // dims 4x5 need 20 payload bytes; 15 are present.
  const std::string path = Write("payload", IdxBytes({4, 5}, Iota(15)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated payload"),
                    HasSubstr("20"), HasSubstr("15")));
}

TEST_F(IdxReaderTest, TrailingBytesAreAnError) {
  // Header of 2 dims is 12 bytes; the payload ends at offset 12 + 6 = 18.
  const std::string path = Write("trailing", IdxBytes({2, 3}, Iota(9)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("3 trailing bytes"),
                    HasSubstr("offset 18")));
}

TEST_F(IdxReaderTest, WrongMagic) {
  std::string bytes = IdxBytes({4}, Iota(4));
  bytes[1] = 0x01;
  const std::string path = Write("magic", bytes);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("not an IDX file")));
}

TEST_F(IdxReaderTest, WrongTypeByteIsNamed) {
  const std::string path =
      Write("float", IdxBytes({4}, Iota(16), /*type=*/0x0D));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("type byte"), HasSubstr("0x0d"),
                    HasSubstr("float32")));
}

TEST_F(IdxReaderTest, DimensionCountOutOfRange) {
  for (int ndims : {0, 5}) {
    std::string bytes = {'\0', '\0', '\x08', static_cast<char>(ndims)};
    bytes.append(4 * 5 + 1, '\x01');
    const std::string path = Write("ndims" + std::to_string(ndims), bytes);
    absl::StatusOr<IdxArray> array = ReadIdxFile(path);
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(array.status().message(),
                AllOf(HasSubstr(path), HasSubstr("dimension count")));
  }
}

TEST_F(IdxReaderTest, ZeroDimension) {
  const std::string path = Write("zero", IdxBytes({3, 0}, {}));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("dimension 1"),
                    HasSubstr("offset 8"), HasSubstr("zero")));
}

TEST_F(IdxReaderTest, DimensionProductOverflow) {
  // (2^32 - 1)^3 does not fit in 64 bits; the file is tiny.
  const std::string path =
      Write("overflow", IdxBytes({0xffffffffu, 0xffffffffu, 0xffffffffu}, {}));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("overflow")));
}

TEST_F(IdxReaderTest, HugeDimensionsWithShortFileAreTruncation) {
  const std::string path = Write("huge", IdxBytes({0xffffffffu, 16}, Iota(8)));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated payload")));
}

TEST_F(IdxReaderTest, CorruptGzipChecksum) {
  std::string gz = Gzip(IdxBytes({64}, Iota(64)));
  // The trailer is CRC-32 then ISIZE; flipping the CRC must be detected.
  gz[gz.size() - 8] ^= 0x5a;
  const std::string path = Write("crc.gz", gz);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("corrupt gzip")));
}

TEST_F(IdxReaderTest, CorruptGzipHeader) {
  std::string gz = Gzip(IdxBytes({64}, Iota(64)));
  gz[2] = 0x07;  // compression method must be 8 (deflate)
  const std::string path = Write("method.gz", gz);
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST_F(IdxReaderTest, TruncatedGzip) {
  const std::string gz = Gzip(IdxBytes({64}, Iota(64)));
  const std::string path = Write("cut.gz", gz.substr(0, gz.size() - 12));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST_F(IdxReaderTest, GarbageAfterGzip) {
  const std::string gz = Gzip(IdxBytes({64}, Iota(64)));
  const std::string path = Write("garbage.gz", gz + "junk");
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("4 bytes of garbage"),
                    HasSubstr(std::to_string(gz.size()))));
}

TEST_F(IdxReaderTest, GzipWithTruncatedIdxPayload) {
  const std::string path = Write("short.gz", Gzip(IdxBytes({10}, Iota(4))));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated payload"),
                    HasSubstr("10"), HasSubstr("4")));
}

}  // namespace
}  // namespace cserps
