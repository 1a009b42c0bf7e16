// A view of a mini-batch: `size` examples of `dim` features, row-major, and
// their labels. The owner of the storage (an EpochBatcher or a test) keeps it
// alive and unchanged while the view is used.
#ifndef CSERPS_WORKER_DATA_BATCH_H_
#define CSERPS_WORKER_DATA_BATCH_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace cserps {

struct Batch {
  absl::Span<const float> features;  // size * dim
  absl::Span<const uint8_t> labels;  // size
  size_t size = 0;
  size_t dim = 0;
};

}  // namespace cserps

#endif  // CSERPS_WORKER_DATA_BATCH_H_
