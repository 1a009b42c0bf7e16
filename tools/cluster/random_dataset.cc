#include "tools/cluster/random_dataset.h"

#include "common/prng.h"

namespace cserps::testing {

Dataset RandomDataset(size_t examples, size_t dim, uint32_t classes, uint64_t key) {
  Dataset data;
  data.size = examples;
  data.dim = dim;
  data.num_classes = classes;
  CounterRng rng(key);
  for (size_t i = 0; i < examples * dim; ++i) {
    data.features.push_back(2.0f * rng.UniformFloat() - 1.0f);
  }
  for (size_t i = 0; i < examples; ++i) {
    data.labels.push_back(static_cast<uint8_t>(rng.Below(classes)));
  }
  return data;
}

}  // namespace cserps::testing
