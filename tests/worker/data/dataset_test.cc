#include "worker/data/dataset.h"

#include <sys/stat.h>

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
using ::testing::HasSubstr;
using testutil::Gzip;
using testutil::IdxBytes;

constexpr uint32_t kRows = 2;
constexpr uint32_t kCols = 3;

// Pixels for n images of kRows x kCols, covering 0 and 255.
std::vector<uint8_t> Pixels(size_t n) {
  std::vector<uint8_t> p(n * kRows * kCols);
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] = static_cast<uint8_t>((i * 37) % 256);
  }
  p[0] = 0;
  p[1] = 255;
  return p;
}

double Standardised(uint8_t pixel) { return (pixel / 255.0 - 0.2860) / 0.3530; }

class LoadMnistSplitTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  void WriteSplit(const std::string& prefix, const std::vector<uint8_t>& pixels,
                  const std::vector<uint8_t>& labels, bool gzip) {
    const uint32_t n = static_cast<uint32_t>(labels.size());
    std::string images = IdxBytes({n, kRows, kCols}, pixels);
    std::string label_bytes = IdxBytes({n}, labels);
    const std::string suffix = gzip ? ".gz" : "";
    if (gzip) {
      images = Gzip(images);
      label_bytes = Gzip(label_bytes);
    }
    testutil::WriteFile(Path(prefix + "-images-idx3-ubyte" + suffix), images);
    testutil::WriteFile(Path(prefix + "-labels-idx1-ubyte" + suffix),
                        label_bytes);
  }

  void ExpectMatches(const Dataset& data, const std::vector<uint8_t>& pixels,
                     const std::vector<uint8_t>& labels, size_t n) {
    ASSERT_EQ(data.size, n);
    EXPECT_EQ(data.dim, kRows * kCols);
    EXPECT_EQ(data.num_classes, 10u);
    ASSERT_EQ(data.features.size(), n * kRows * kCols);
    for (size_t i = 0; i < data.features.size(); ++i) {
      EXPECT_NEAR(data.features[i], Standardised(pixels[i]), 1e-5) << i;
    }
    EXPECT_EQ(data.labels,
              std::vector<uint8_t>(labels.begin(), labels.begin() + n));
  }

  const std::string dir_ = testutil::MakeTempDir();
};

TEST_F(LoadMnistSplitTest, LoadsPlainFilesAndStandardises) {
  const std::vector<uint8_t> labels = {3, 0, 9, 1, 7};
  const std::vector<uint8_t> pixels = Pixels(labels.size());
  WriteSplit("train", pixels, labels, /*gzip=*/false);
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectMatches(*data, pixels, labels, labels.size());
  // The extremes, worked by hand: (0 - .286) / .353 and (1 - .286) / .353.
  EXPECT_NEAR(data->features[0], -0.810198, 1e-5);
  EXPECT_NEAR(data->features[1], 2.022663, 1e-5);
}

TEST_F(LoadMnistSplitTest, LoadsGzipFiles) {
  const std::vector<uint8_t> labels = {5, 5, 2, 8};
  const std::vector<uint8_t> pixels = Pixels(labels.size());
  WriteSplit("t10k", pixels, labels, /*gzip=*/true);
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTest, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectMatches(*data, pixels, labels, labels.size());
}

TEST_F(LoadMnistSplitTest, LimitKeepsTheFirstExamples) {
  const std::vector<uint8_t> labels = {1, 2, 3, 4, 5, 6};
  const std::vector<uint8_t> pixels = Pixels(labels.size());
  WriteSplit("train", pixels, labels, /*gzip=*/false);
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 4);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectMatches(*data, pixels, labels, 4);

  absl::StatusOr<Dataset> all = LoadMnistSplit(dir_, Split::kTrain, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  ExpectMatches(*all, pixels, labels, labels.size());
}

TEST_F(LoadMnistSplitTest, PrefersPlainOverGzip) {
  const std::vector<uint8_t> plain_labels = {1, 1, 1};
  const std::vector<uint8_t> gz_labels = {2, 2, 2};
  WriteSplit("train", Pixels(3), plain_labels, /*gzip=*/false);
  WriteSplit("train", Pixels(3), gz_labels, /*gzip=*/true);
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->labels, plain_labels);
}

TEST_F(LoadMnistSplitTest, SplitsUseTheirOwnFiles) {
  WriteSplit("t10k", Pixels(2), {0, 1}, /*gzip=*/false);
  EXPECT_TRUE(LoadMnistSplit(dir_, Split::kTest, 0).ok());
  absl::StatusOr<Dataset> train = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(train.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(train.status().message(),
              HasSubstr(Path("train-images-idx3-ubyte")));
}

TEST_F(LoadMnistSplitTest, MissingLabelsFile) {
  WriteSplit("train", Pixels(2), {0, 1}, /*gzip=*/false);
  ASSERT_EQ(::remove(Path("train-labels-idx1-ubyte").c_str()), 0);
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(),
              HasSubstr(Path("train-labels-idx1-ubyte")));
}

TEST_F(LoadMnistSplitTest, CountMismatchNamesBothFilesAndCounts) {
  testutil::WriteFile(Path("train-images-idx3-ubyte"),
                      IdxBytes({7, kRows, kCols}, Pixels(7)));
  testutil::WriteFile(Path("train-labels-idx1-ubyte"),
                      IdxBytes({4}, {0, 1, 2, 3}));
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(Path("train-images-idx3-ubyte")),
                    HasSubstr(Path("train-labels-idx1-ubyte")), HasSubstr("7"),
                    HasSubstr("4")));
}

TEST_F(LoadMnistSplitTest, LabelOutOfRangeNamesTheIndex) {
  WriteSplit("train", Pixels(5), {0, 9, 4, 10, 2}, /*gzip=*/false);
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(Path("train-labels-idx1-ubyte")),
                    HasSubstr("index 3"), HasSubstr("10")));
}

TEST_F(LoadMnistSplitTest, ImagesMustBeThreeDimensional) {
  testutil::WriteFile(Path("train-images-idx3-ubyte"),
                      IdxBytes({3, kRows * kCols}, Pixels(3)));
  testutil::WriteFile(Path("train-labels-idx1-ubyte"),
                      IdxBytes({3}, {0, 1, 2}));
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(Path("train-images-idx3-ubyte")),
                    HasSubstr("3 dimensions")));
}

TEST_F(LoadMnistSplitTest, LabelsMustBeOneDimensional) {
  testutil::WriteFile(Path("train-images-idx3-ubyte"),
                      IdxBytes({2, kRows, kCols}, Pixels(2)));
  testutil::WriteFile(Path("train-labels-idx1-ubyte"),
                      IdxBytes({2, 1}, {0, 1}));
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              HasSubstr(Path("train-labels-idx1-ubyte")));
}

TEST_F(LoadMnistSplitTest, ReaderErrorsPassThrough) {
  WriteSplit("train", Pixels(2), {0, 1}, /*gzip=*/false);
  // Replace the images with a truncated payload.
  testutil::WriteFile(Path("train-images-idx3-ubyte"),
                      IdxBytes({2, kRows, kCols}, Pixels(1)));
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir_, Split::kTrain, 0);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(),
              HasSubstr(Path("train-images-idx3-ubyte")));
}

TEST(FashionMnistTest, LoadsTheRealTestSplit) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    GTEST_SKIP() << dir << " is absent (Debian package dataset-fashion-mnist)";
  }
  absl::StatusOr<Dataset> data = LoadMnistSplit(dir, Split::kTest, 0);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->size, 10000u);
  EXPECT_EQ(data->dim, 784u);
  EXPECT_EQ(data->features.size(), 10000u * 784u);
  std::vector<int> per_class(10, 0);
  for (uint8_t label : data->labels) ++per_class[label];
  for (int c = 0; c < 10; ++c) EXPECT_GT(per_class[c], 0) << "class " << c;
  // The constants are Fashion-MNIST's own statistics, so the standardised
  // test split has mean near 0 and standard deviation near 1.
  double sum = 0, sum_sq = 0;
  for (float f : data->features) {
    sum += f;
    sum_sq += static_cast<double>(f) * f;
  }
  const double mean = sum / data->features.size();
  const double var = sum_sq / data->features.size() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.04);
}

}  // namespace
}  // namespace cserps
