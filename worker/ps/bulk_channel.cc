#include "worker/ps/bulk_channel.h"

#include <sys/socket.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace cserps {
namespace {

absl::Status WithPrefix(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

// Reads the message of a reply with code != 0: the refusal it carries, or
// the error reading it.
absl::StatusOr<absl::Status> ReadRefusal(ByteStream& stream, const bulk::Reply& reply,
                                         absl::Time deadline, absl::string_view what) {
  if (reply.message_bytes > bulk::kMaxMessageBytes) {
    return absl::DataLossError(absl::StrCat("a reply's message of ", reply.message_bytes,
                                            " bytes (at most ", bulk::kMaxMessageBytes, ")"));
  }
  std::string message(reply.message_bytes, '\0');
  RETURN_IF_ERROR(stream.RecvAll(message.data(), message.size(), deadline, what));
  return absl::Status(static_cast<absl::StatusCode>(reply.code), message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<BulkChannel>> BulkChannel::Connect(
    const std::string& host, int port, uint64_t fingerprint, uint32_t rank,
    const Credentials& credentials, absl::Time deadline, std::string name) {
  const std::string what = absl::StrCat("bulk connection to ", name);
  ASSIGN_OR_RETURN(Socket socket, ConnectTcp(host, port, deadline, what));
  std::unique_ptr<ByteStream> stream;
  if (credentials.tls == nullptr) {
    stream = ByteStream::Plain(std::move(socket));
  } else {
    ASSIGN_OR_RETURN(stream, ByteStream::Tls(std::move(socket), *credentials.tls, host));
  }
  RETURN_IF_ERROR(stream->Handshake(deadline, what));
  char hello[bulk::Hello::kBytes];
  bulk::Encode(bulk::Hello{.fingerprint = fingerprint,
                           .rank = rank,
                           .token_bytes = static_cast<uint32_t>(credentials.token.size())},
               hello);
  iovec iov[2] = {{hello, sizeof(hello)},
                  {const_cast<char*>(credentials.token.data()), credentials.token.size()}};
  RETURN_IF_ERROR(stream->SendAll(absl::MakeSpan(iov), deadline, what));
  char head[bulk::Reply::kBytes];
  RETURN_IF_ERROR(stream->RecvAll(head, sizeof(head), deadline, what));
  const bulk::Reply reply = bulk::DecodeReply(head);
  if (reply.code != 0) {
    absl::StatusOr<absl::Status> refusal = ReadRefusal(*stream, reply, deadline, what);
    return WithPrefix(what, refusal.ok() ? *refusal : refusal.status());
  }
  if (reply.request_id != 0 || reply.count != 0) {
    return absl::DataLossError(absl::StrCat(what, ": the hello's answer is not a bulk reply"));
  }
  return std::unique_ptr<BulkChannel>(new BulkChannel(std::move(stream), std::move(name)));
}

bool BulkChannel::broken() const {
  absl::MutexLock lock(&mu_);
  return !broken_.ok();
}

absl::Status BulkChannel::BrokenFor(const char* call) const {
  return WithPrefix(absl::StrCat(call, " to ", name_), broken_);
}

void BulkChannel::Break(absl::Status status) {
  if (broken_.ok()) {
    broken_ = std::move(status);
    shutdown(stream_->fd(), SHUT_RDWR);
  }
  // The request being read into stays pending until its reader is back.
  for (auto& [id, pending] : pending_) {
    if (!pending.done && !(reading_ && id == reading_id_)) {
      pending.done = true;
      pending.status = BrokenFor(pending.call);
    }
  }
}

absl::StatusOr<uint64_t> BulkChannel::Send(bulk::Request request,
                                           absl::Span<const absl::Span<const float>> values,
                                           std::vector<absl::Span<float>> mean,
                                           absl::Time deadline) {
  uint64_t count = 0;
  for (const auto& v : values) count += v.size();
  uint64_t mean_count = 0;
  for (const auto& m : mean) mean_count += m.size();
  if (count != mean_count || count > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("PushPull to ", name_, ": ", count,
                                                   " floats pushed, ", mean_count,
                                                   " floats of mean"));
  }
  request.count = static_cast<uint32_t>(count);
  char head[bulk::Request::kBytes];
  std::vector<iovec> iov;
  iov.reserve(values.size() + 1);
  iov.push_back({head, sizeof(head)});
  for (const auto& v : values) {
    iov.push_back({const_cast<float*>(v.data()), v.size() * sizeof(float)});
  }
  Pending pending;
  pending.mean = std::move(mean);
  pending.count = count;
  return SendFrame(std::move(pending), absl::MakeSpan(iov),
                   [&](uint64_t id) {
                     request.request_id = id;
                     bulk::Encode(request, head);
                   },
                   deadline);
}

absl::StatusOr<uint64_t> BulkChannel::SendSparse(uint64_t step, uint32_t k,
                                                 absl::Span<const uint32_t> indices,
                                                 absl::Span<const float> values,
                                                 SparseVector* result, uint64_t max_entries,
                                                 absl::Time deadline) {
  if (indices.size() != values.size() || indices.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("SparsePushPull to ", name_, ": ",
                                                   indices.size(), " indices, ", values.size(),
                                                   " values"));
  }
  bulk::SparseRequest request{
      .count = static_cast<uint32_t>(indices.size()), .step = step, .k = k};
  char head[bulk::SparseRequest::kBytes];
  iovec iov[3] = {{head, sizeof(head)},
                  {const_cast<uint32_t*>(indices.data()), indices.size() * sizeof(uint32_t)},
                  {const_cast<float*>(values.data()), values.size() * sizeof(float)}};
  Pending pending;
  pending.call = "SparsePushPull";
  pending.sparse = result;
  pending.max_entries = max_entries;
  return SendFrame(std::move(pending), absl::MakeSpan(iov),
                   [&](uint64_t id) {
                     request.request_id = id;
                     bulk::Encode(request, head);
                   },
                   deadline);
}

absl::StatusOr<uint64_t> BulkChannel::SendAsync(uint64_t step, float lr, uint64_t offset,
                                                absl::Span<const float> gradient,
                                                absl::Span<float> model, absl::Time deadline) {
  if (gradient.size() != model.size() || gradient.size() > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("AsyncPushPull to ", name_, ": ",
                                                   gradient.size(), " floats pushed, ",
                                                   model.size(), " floats of model"));
  }
  bulk::AsyncRequest request{
      .count = static_cast<uint32_t>(gradient.size()), .step = step, .offset = offset, .lr = lr};
  char head[bulk::AsyncRequest::kBytes];
  iovec iov[2] = {{head, sizeof(head)},
                  {const_cast<float*>(gradient.data()), gradient.size() * sizeof(float)}};
  Pending pending;
  pending.call = "AsyncPushPull";
  pending.mean = {model};
  pending.count = gradient.size();
  return SendFrame(std::move(pending), absl::MakeSpan(iov),
                   [&](uint64_t id) {
                     request.request_id = id;
                     bulk::Encode(request, head);
                   },
                   deadline);
}

absl::StatusOr<uint64_t> BulkChannel::SendFrame(Pending pending, absl::Span<iovec> iov,
                                                const std::function<void(uint64_t)>& encode,
                                                absl::Time deadline) {
  const char* call = pending.call;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return BrokenFor(pending.call);
    id = next_id_++;
    pending_[id] = std::move(pending);
  }
  encode(id);
  absl::Status sent;
  {
    absl::MutexLock lock(&send_mu_);
    sent = stream_->SendAll(iov, deadline, "send");
  }
  if (!sent.ok()) {
    absl::MutexLock lock(&mu_);
    Break(sent);
    return BrokenFor(call);
  }
  return id;
}

absl::Status BulkChannel::Wait(uint64_t id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto it = pending_.find(id);
    if (it == pending_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("bulk connection to ", name_, ": no request ", id, " is pending"));
    }
    if (it->second.done) {
      absl::Status status = std::move(it->second.status);
      pending_.erase(it);
      return status;
    }
    if (!broken_.ok() && !reading_) {
      Break(broken_);
      continue;
    }
    if (!reading_) {
      reading_ = true;
      mu_.Unlock();
      absl::Status read = ReadOne(deadline);
      mu_.Lock();
      reading_ = false;
      reading_id_ = 0;
      if (!read.ok()) Break(read);
      continue;
    }
    // Another waiter is reading, bounded by its own deadline; it may be
    // filling this request's mean, so this one waits for it, not for its
    // deadline: until it has read this request's reply, or reads no more.
    // (The reader keeps reading_ set from one reply to the next.)
    struct Waiter {
      BulkChannel* channel;
      uint64_t id;
    } waiter{this, id};
    mu_.Await(absl::Condition(
        +[](Waiter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->channel->mu_) {
          if (!w->channel->reading_) return true;
          auto it = w->channel->pending_.find(w->id);
          return it == w->channel->pending_.end() || it->second.done;
        },
        &waiter));
  }
}

absl::Status BulkChannel::ReadOne(absl::Time deadline) {
  char head[bulk::Reply::kBytes];
  RETURN_IF_ERROR(stream_->RecvAll(head, sizeof(head), deadline, "receive"));
  const bulk::Reply reply = bulk::DecodeReply(head);
  std::vector<absl::Span<float>> mean;
  SparseVector* sparse = nullptr;
  const char* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(reply.request_id);
    if (it == pending_.end() || it->second.done) {
      // Request 0: the shard ends the connection, saying why.
      if (reply.request_id == 0 && reply.code != 0) {
        absl::StatusOr<absl::Status> refusal =
            ReadRefusal(*stream_, reply, deadline, "receive");
        return refusal.ok() ? *refusal : refusal.status();
      }
      return absl::DataLossError(
          absl::StrCat("a reply to request ", reply.request_id, ", which is not pending"));
    }
    if (reply.code == 0 && it->second.sparse == nullptr && reply.count != it->second.count) {
      return absl::DataLossError(absl::StrCat("request ", reply.request_id, " answered with ",
                                              reply.count, " floats; it pushed ",
                                              it->second.count));
    }
    if (reply.code == 0 && it->second.sparse != nullptr &&
        reply.count > it->second.max_entries) {
      return absl::DataLossError(absl::StrCat("request ", reply.request_id, " answered with ",
                                              reply.count, " sparse entries; at most ",
                                              it->second.max_entries, " were expected"));
    }
    mean = it->second.mean;  // the owner keeps them alive until it is done
    sparse = it->second.sparse;
    call = it->second.call;
    reading_id_ = reply.request_id;
  }
  absl::Status status;
  if (reply.code != 0) {
    ASSIGN_OR_RETURN(absl::Status refusal,
                     ReadRefusal(*stream_, reply, deadline, "receive"));
    status = WithPrefix(absl::StrCat(call, " to ", name_), refusal);
  } else {
    std::vector<iovec> iov;
    if (sparse != nullptr) {
      sparse->indices.resize(reply.count);
      sparse->values.resize(reply.count);
      iov.push_back({sparse->indices.data(), reply.count * sizeof(uint32_t)});
      iov.push_back({sparse->values.data(), reply.count * sizeof(float)});
    }
    for (const auto& m : mean) iov.push_back({m.data(), m.size() * sizeof(float)});
    RETURN_IF_ERROR(stream_->RecvAll(absl::MakeSpan(iov), deadline, "receive"));
  }
  absl::MutexLock lock(&mu_);
  if (reply.code == 0 && reply.members != 0) members_ = reply.members;
  Pending& pending = pending_[reply.request_id];
  pending.done = true;
  pending.status = std::move(status);
  return absl::OkStatus();
}

}  // namespace cserps
