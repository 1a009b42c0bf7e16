// The arithmetic of one sparse top-k round (docs/protocol.md, Section 14):
// parsing a member's push, summing the members' sparse vectors and choosing
// the entries the round returns. Pure functions; thread-safe.
#ifndef CSERPS_SERVER_SPARSE_AGGREGATE_H_
#define CSERPS_SERVER_SPARSE_AGGREGATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/sparse_vector.h"

namespace cserps {

// What every member of a completed round receives: the wire bytes of
// SparsePushPullResponse.indices and .values.
struct SparseReply {
  std::string indices;
  std::string values;
};

enum class SparseSelection {
  kGlobalTopK,  // gtopk-ssgd: the k entries of largest |sum|
  kUnion,       // topk-ssgd: every index some member pushed
};

// Decodes a push to a shard owning floats [first, end) whose k_s is `k`.
// INVALID_ARGUMENT, naming the problem, when: a byte length is not a
// multiple of 4; indices and values differ in count; the count is not `k`;
// an index lies outside [first, end) (with its position); an index is not
// greater than the one before it (unsorted or duplicate, with the position).
absl::StatusOr<SparseVector> ParseSparsePush(absl::string_view indices,
                                              absl::string_view values,
                                              uint64_t k, uint64_t first,
                                              uint64_t end);
// The checks of ParseSparsePush past the byte lengths, on entries already
// decoded (as the bulk transport reads them, as many values as indices): as
// many as `k`, inside [first, end), strictly ascending.
absl::Status CheckSparseEntries(const SparseVector& entries, uint64_t k, uint64_t first,
                                uint64_t end);

// Sums `pushes` (one per member, in rank order) per index: in double, in
// rank order, rounded to float32 once. kUnion keeps every index; kGlobalTopK
// the `k` entries of largest |float32 sum| (a NaN counts as infinite),
// ties broken by the lower index, all of them when the union has
// at most `k`. The result is ascending by index. O(N log P + U) for N
// entries pushed by P members, U of them distinct.
SparseVector AggregateSparse(absl::Span<const SparseVector> pushes,
                              SparseSelection selection, uint64_t k);

// Little-endian packing of indices and values (the wire format).
SparseReply EncodeSparse(const SparseVector& entries);

}  // namespace cserps

#endif  // CSERPS_SERVER_SPARSE_AGGREGATE_H_
