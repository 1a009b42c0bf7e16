#include "server/buffer_pool.h"

namespace cserps {

size_t PoolCapacity(size_t n) {
  size_t c = 1;
  while (c < n) c <<= 1;
  return c;
}

}  // namespace cserps
