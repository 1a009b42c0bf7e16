// An in-memory labelled image dataset, loaded from MNIST-format IDX files
// (Fashion-MNIST in practice: /usr/share/datasets/fashion-mnist).
#ifndef CSERPS_WORKER_DATA_DATASET_H_
#define CSERPS_WORKER_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cserps {

// Fashion-MNIST's pixel statistics on [0, 1]; every split is standardised
// with these so train and test see the same transform.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

struct Dataset {
  size_t size = 0;  // number of examples
  size_t dim = 0;   // features per example (rows * cols)
  size_t num_classes = 10;
  // size * dim, row-major; pixel p becomes (p / 255 - kFashionMnistMean) /
  // kFashionMnistStd.
  std::vector<float> features;
  std::vector<uint8_t> labels;  // size, each < num_classes
};

enum class Split { kTrain, kTest };

// Loads "<dir>/train-images-idx3-ubyte" and "<dir>/train-labels-idx1-ubyte"
// (kTrain) or the "t10k-" pair (kTest), each either plain or with ".gz";
// the plain file wins when both exist. limit > 0 keeps only the first
// `limit` examples; 0 keeps all.
//
// Errors: NOT_FOUND when neither form of a file exists; the IDX reader's
// errors (see idx_reader.h); INVALID_ARGUMENT when the images are not 3-D,
// the labels not 1-D, their counts differ (names both files and counts), or
// a label is >= 10 (names the file and the example index).
absl::StatusOr<Dataset> LoadMnistSplit(const std::string& dir, Split split,
                                       size_t limit);

}  // namespace cserps

#endif  // CSERPS_WORKER_DATA_DATASET_H_
