#include "worker/data/dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/data/idx_reader.h"

namespace cserps {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The plain file if it exists, else the ".gz" one.
absl::StatusOr<std::string> FindIdxFile(const std::string& dir,
                                        const std::string& base) {
  const std::string plain = absl::StrCat(dir, "/", base);
  if (FileExists(plain)) return plain;
  const std::string gz = absl::StrCat(plain, ".gz");
  if (FileExists(gz)) return gz;
  return absl::NotFoundError(
      absl::StrCat(plain, ": no such file (nor ", gz, ")"));
}

}  // namespace

absl::StatusOr<Dataset> LoadMnistSplit(const std::string& dir, Split split,
                                       size_t limit) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  ASSIGN_OR_RETURN(const std::string images_path,
                   FindIdxFile(dir, prefix + "-images-idx3-ubyte"));
  ASSIGN_OR_RETURN(const std::string labels_path,
                   FindIdxFile(dir, prefix + "-labels-idx1-ubyte"));
  ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));

  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: images must have 3 dimensions (count, rows, cols), file has "
        "[%s]",
        images_path, absl::StrJoin(images.dims, ", ")));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: labels must have 1 dimension (count), file has [%s]", labels_path,
        absl::StrJoin(labels.dims, ", ")));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s holds %d images but %s holds %d labels", images_path,
        images.dims[0], labels_path, labels.dims[0]));
  }
  Dataset data;
  data.size = images.dims[0];
  data.dim = size_t{images.dims[1]} * images.dims[2];
  for (size_t i = 0; i < data.size; ++i) {
    if (labels.data[i] >= data.num_classes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: label %d at index %d (uncompressed byte offset %d) is not below "
          "%d",
          labels_path, labels.data[i], i, 8 + i, data.num_classes));
    }
  }
  if (limit > 0) data.size = std::min(data.size, limit);

  std::array<float, 256> lut;
  for (size_t p = 0; p < lut.size(); ++p) {
    lut[p] =
        (static_cast<float>(p) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  }
  data.features.resize(data.size * data.dim);
  std::transform(images.data.begin(),
                 images.data.begin() + data.features.size(),
                 data.features.begin(), [&lut](uint8_t p) { return lut[p]; });
  data.labels.assign(labels.data.begin(), labels.data.begin() + data.size);
  return data;
}

}  // namespace cserps
