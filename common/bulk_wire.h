// The bulk transport's frames (docs/protocol.md 17): PushPull and
// SparsePushPull rounds and AsyncPushPull calls over a plain TCP connection
// per shard, the payload written and read in place, next to gRPC, which
// keeps every other call.
// Fixed little-endian headers; the payload is the float32 bytes of
// docs/protocol.md 3 (a sparse one: its uint32 indices, then its values).
//
//   client -> server  Hello once (with the job's token, if it has one),
//                     then Requests;
//   server -> client  a Reply to the Hello, then one Reply per Request, in
//                     the order their rounds complete (request_id matches).
#ifndef CSERPS_COMMON_BULK_WIRE_H_
#define CSERPS_COMMON_BULK_WIRE_H_

#include <cstdint>
#include <cstring>

namespace cserps::bulk {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "bulk frames are little-endian; add byte swapping before building on a "
              "big-endian host");

// "CSB1": the first four bytes of a connection.
inline constexpr uint32_t kMagic = 0x31425343;
inline constexpr uint32_t kVersion = 1;
// Request kinds, the first u32 of every request.
inline constexpr uint32_t kPushPull = 1;
inline constexpr uint32_t kSparsePushPull = 2;
inline constexpr uint32_t kAsyncPushPull = 3;
// Longest error message a reply carries; longer ones are cut.
inline constexpr uint32_t kMaxMessageBytes = 4096;
// Longest token a hello may carry.
inline constexpr uint32_t kMaxTokenBytes = 4096;

struct Hello {
  static constexpr size_t kBytes = 24;
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t fingerprint = 0;
  uint32_t rank = 0;
  // The bytes of the job's token that follow the hello; 0: none.
  uint32_t token_bytes = 0;
};

// One PushPull: the fields of docs/protocol.md 8.2, then `count` floats.
struct Request {
  static constexpr size_t kBytes = 48;
  uint32_t kind = kPushPull;
  uint32_t count = 0;
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint32_t stream = 0;
  uint32_t ratio = 1;
  uint32_t chunk = 0;
  float weight = 1;
  float lr = 0;
};

// One SparsePushPull (docs/protocol.md 14): `count` entries follow, their
// uint32 indices, then their float32 values. As long as a Request.
struct SparseRequest {
  static constexpr size_t kBytes = 48;
  uint32_t kind = kSparsePushPull;
  uint32_t count = 0;
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint32_t k = 0;  // the shard's k_s
};

// One AsyncPushPull (docs/protocol.md 15.1): the gradient of floats
// [offset, offset + count) follows. As long as a Request.
struct AsyncRequest {
  static constexpr size_t kBytes = 48;
  uint32_t kind = kAsyncPushPull;
  uint32_t count = 0;
  uint64_t request_id = 0;
  uint64_t step = 0;
  uint64_t offset = 0;
  float lr = 0;
};

// The answer to a Hello (request_id 0) or a request: a status code (gRPC's
// numbering), then `message_bytes` of its message (code != 0), or `count`
// floats of the mean (code 0; a SparsePushPull's: `count` entries, indices
// then values; an AsyncPushPull's: the chunk's `count` floats right after
// its push).
struct Reply {
  static constexpr size_t kBytes = 24;
  uint32_t code = 0;
  uint32_t count = 0;
  uint64_t request_id = 0;
  uint32_t message_bytes = 0;
  // A mean's reply: the members the shard's rounds wait for (as
  // PushPullResponse.members); 0 in other replies.
  uint32_t members = 0;
};

namespace internal {
template <typename T>
inline void Put(char* out, size_t at, T v) { std::memcpy(out + at, &v, sizeof(T)); }
template <typename T>
inline T Get(const char* in, size_t at) {
  T v;
  std::memcpy(&v, in + at, sizeof(T));
  return v;
}
}  // namespace internal

inline void Encode(const Hello& h, char* out) {
  using internal::Put;
  std::memset(out, 0, Hello::kBytes);
  Put(out, 0, h.magic);
  Put(out, 4, h.version);
  Put(out, 8, h.fingerprint);
  Put(out, 16, h.rank);
  Put(out, 20, h.token_bytes);
}
inline Hello DecodeHello(const char* in) {
  using internal::Get;
  return {Get<uint32_t>(in, 0), Get<uint32_t>(in, 4), Get<uint64_t>(in, 8),
          Get<uint32_t>(in, 16), Get<uint32_t>(in, 20)};
}

inline void Encode(const Request& r, char* out) {
  using internal::Put;
  std::memset(out, 0, Request::kBytes);
  Put(out, 0, r.kind);
  Put(out, 4, r.count);
  Put(out, 8, r.request_id);
  Put(out, 16, r.step);
  Put(out, 24, r.stream);
  Put(out, 28, r.ratio);
  Put(out, 32, r.chunk);
  Put(out, 36, r.weight);
  Put(out, 40, r.lr);
}
inline Request DecodeRequest(const char* in) {
  using internal::Get;
  return {Get<uint32_t>(in, 0), Get<uint32_t>(in, 4),  Get<uint64_t>(in, 8),
          Get<uint64_t>(in, 16), Get<uint32_t>(in, 24), Get<uint32_t>(in, 28),
          Get<uint32_t>(in, 32), Get<float>(in, 36),    Get<float>(in, 40)};
}

inline void Encode(const SparseRequest& r, char* out) {
  using internal::Put;
  std::memset(out, 0, SparseRequest::kBytes);
  Put(out, 0, r.kind);
  Put(out, 4, r.count);
  Put(out, 8, r.request_id);
  Put(out, 16, r.step);
  Put(out, 24, r.k);
}
inline SparseRequest DecodeSparseRequest(const char* in) {
  using internal::Get;
  return {Get<uint32_t>(in, 0), Get<uint32_t>(in, 4), Get<uint64_t>(in, 8),
          Get<uint64_t>(in, 16), Get<uint32_t>(in, 24)};
}

inline void Encode(const AsyncRequest& r, char* out) {
  using internal::Put;
  std::memset(out, 0, AsyncRequest::kBytes);
  Put(out, 0, r.kind);
  Put(out, 4, r.count);
  Put(out, 8, r.request_id);
  Put(out, 16, r.step);
  Put(out, 24, r.offset);
  Put(out, 32, r.lr);
}
inline AsyncRequest DecodeAsyncRequest(const char* in) {
  using internal::Get;
  return {Get<uint32_t>(in, 0), Get<uint32_t>(in, 4), Get<uint64_t>(in, 8),
          Get<uint64_t>(in, 16), Get<uint64_t>(in, 24), Get<float>(in, 32)};
}

inline void Encode(const Reply& r, char* out) {
  using internal::Put;
  std::memset(out, 0, Reply::kBytes);
  Put(out, 0, r.code);
  Put(out, 4, r.count);
  Put(out, 8, r.request_id);
  Put(out, 16, r.message_bytes);
  Put(out, 20, r.members);
}
inline Reply DecodeReply(const char* in) {
  using internal::Get;
  return {Get<uint32_t>(in, 0), Get<uint32_t>(in, 4), Get<uint64_t>(in, 8),
          Get<uint32_t>(in, 16), Get<uint32_t>(in, 20)};
}

}  // namespace cserps::bulk

#endif  // CSERPS_COMMON_BULK_WIRE_H_
