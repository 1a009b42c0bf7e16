#include "server/bulk_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/bulk_wire.h"
#include "common/status.h"
#include "server/buffer_pool.h"
#include "spdlog/spdlog.h"

namespace cserps {
namespace {

// A connection must finish its TLS handshake this soon after it opens (as
// PsServer::kHandshakeTimeout for gRPC's), and say who it is this soon.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
constexpr absl::Duration kHelloTimeout = absl::Seconds(30);
// At shutdown, how long writers may take to send what is queued.
constexpr absl::Duration kDrainTimeout = absl::Seconds(3);
// After a failed accept (out of descriptors), the wait before the next.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);
// A warning for the first connection closed unanswered, then every this many.
constexpr uint64_t kUnansweredPerWarning = 1000;
// Replies up to this size may skip the writer (Connection::Enqueue).
constexpr size_t kDirectReplyBytes = 256 << 10;

}  // namespace

// The connections each member holds, so that one member (a worker that
// reconnects without closing, say) cannot take the others' slots.
class BulkServer::MemberSlots {
 public:
  MemberSlots(uint32_t shard, uint32_t members) : shard_(shard), held_(members, 0) {}

  // `rank` is a member the shard admitted.
  absl::Status Claim(uint32_t rank) {
    absl::MutexLock lock(&mu_);
    if (held_[rank] >= kConnectionsPerMember) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", rank, " already holds ", held_[rank], " bulk connections to shard ", shard_,
          ", the limit per member"));
    }
    ++held_[rank];
    return absl::OkStatus();
  }
  void Release(uint32_t rank) {
    absl::MutexLock lock(&mu_);
    --held_[rank];
  }

 private:
  const uint32_t shard_;
  absl::Mutex mu_;
  std::vector<uint32_t> held_ ABSL_GUARDED_BY(mu_);  // by rank
};

class BulkServer::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::unique_ptr<ByteStream> stream, ShardContext* shard, MemberSlots* slots,
             ParameterServerService* service, SparseExchangeService* sparse, AsyncService* async)
      : stream_(std::move(stream)),
        shard_(*shard),
        slots_(*slots),
        service_(*service),
        sparse_(*sparse),
        async_(*async),
        chunk_floats_(shard->chunk_floats()),
        max_queued_(MaxWaitingCallsPerRank(shard->store().size(), chunk_floats_)),
        reply_timeout_(absl::Seconds(shard->config().cluster().round_timeout_s())) {}

  // Starts both threads. An error when the process has no thread to give:
  // then none runs.
  absl::Status Start() {
    auto self = shared_from_this();
    try {
      writer_ = std::thread([self] { self->WriteLoop(); });
    } catch (const std::system_error& e) {
      return NoThread(e);
    }
    try {
      reader_ = std::thread([self] { self->ReadLoop(); });
    } catch (const std::system_error& e) {
      {
        absl::MutexLock lock(&mu_);
        reader_done_ = true;  // the writer, with nothing queued, ends
      }
      writer_.join();
      return NoThread(e);
    }
    return absl::OkStatus();
  }

  bool ended() const {
    absl::MutexLock lock(&mu_);
    return reader_done_ && writer_done_;
  }

  // A shutdown in three steps, each taken for every connection before the
  // next, so that the drains overlap: stop reading; let the writer send what
  // is queued until `drained_by`; then shut the socket both ways and join
  // both threads.
  void StopReading() {
    {
      absl::MutexLock lock(&mu_);
      reading_stopped_ = true;
    }
    // Wakes a reader blocked in its socket; what the socket still holds is
    // read no further (Linux goes on handing it out after SHUT_RD).
    shutdown(stream_->fd(), SHUT_RD);
  }
  void Drain(absl::Time drained_by) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&writer_done_), drained_by);
    stopped_ = true;  // replies still to come are not waited for
  }
  void StopAndJoin() {
    shutdown(stream_->fd(), SHUT_RDWR);
    Join();
  }

  void Join() {
    if (reader_.joinable()) reader_.join();
    if (writer_.joinable()) writer_.join();
  }

 private:
  struct Outgoing {
    bulk::Reply head;
    std::string message;
    RoundMean mean;           // code 0, a PushPull's or an AsyncPushPull's floats
    SparseRoundReply sparse;  // code 0, a SparsePushPull's
    bool push_pull = false;   // a PushPull's mean, counted by the PushPull service
    int stream = 0;
    size_t sent = 0;  // bytes of the frame already written
  };

  static absl::Status NoThread(const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no thread to serve a bulk connection: ", e.what()));
  }

  void ReadLoop() {
    absl::Status ended = Serve();
    // Before the writer may end the connection: a peer that sees it ended
    // may connect again at once.
    if (member_.has_value()) slots_.Release(*member_);
    if (!ended.ok() && !absl::IsUnavailable(ended)) {
      spdlog::warn("shard {} bulk connection: {}", shard_.shard(), std::string(ended.message()));
    }
    absl::MutexLock lock(&mu_);
    reader_done_ = true;
  }

  // Answers the hello, then every request, until the peer closes or a frame
  // cannot be read on from (then answered with the reason, request_id 0).
  absl::Status Serve() {
    if (stream_->tls()) RETURN_IF_ERROR(RefusePlaintextHello());
    // Nothing can be answered on a connection whose handshake failed.
    RETURN_IF_ERROR(stream_->Handshake(absl::Now() + kHandshakeTimeout, "bulk handshake"));
    char hello_bytes[bulk::Hello::kBytes];
    const absl::Time hello_deadline = absl::Now() + kHelloTimeout;
    RETURN_IF_ERROR(
        stream_->RecvAll(hello_bytes, sizeof(hello_bytes), hello_deadline, "bulk hello"));
    const bulk::Hello hello = bulk::DecodeHello(hello_bytes);
    if (hello.magic != bulk::kMagic || hello.version != bulk::kVersion) {
      return Fatal(absl::InvalidArgumentError(absl::StrCat(
          "not a cserps bulk connection: magic 0x", absl::Hex(hello.magic), " version ",
          hello.version, " (expected 0x", absl::Hex(bulk::kMagic), " version ",
          bulk::kVersion, ")")));
    }
    ASSIGN_OR_RETURN(const std::string token, ReadToken(hello, hello_deadline));
    absl::Status ok = shard_.AuthenticateHello(
        token.empty() ? std::nullopt : std::optional<absl::string_view>(token));
    if (!ok.ok()) return Fatal(ok);
    ok = shard_.Admit(hello.fingerprint, hello.rank, service_.Now());
    if (!ok.ok()) return Fatal(ok);
    ok = slots_.Claim(hello.rank);
    if (!ok.ok()) return Fatal(ok);
    member_ = hello.rank;
    Enqueue(Outgoing{});  // the hello's OK

    for (;;) {
      if (!AwaitRoomForReplies()) return absl::UnavailableError("the shard shuts down");
      char head_bytes[bulk::Request::kBytes];
      // A member may be idle between rounds for as long as it likes, but not
      // halfway through a request's head.
      RETURN_IF_ERROR(
          stream_->RecvNext(head_bytes, sizeof(head_bytes), reply_timeout_, "bulk request"));
      const bulk::Request request = bulk::DecodeRequest(head_bytes);
      if (request.request_id == 0) {
        // A reply to 0 is the connection's end: its refusal could not be told
        // from that.
        return Fatal(absl::InvalidArgumentError(
            "a bulk request with request_id 0, which replies keep for the connection's end "
            "(ids start at 1)"));
      }
      if (Awaiting(request.request_id)) {
        // Its reply could not be told from the other's.
        return Fatal(absl::InvalidArgumentError(
            absl::StrCat("bulk request_id ", request.request_id,
                         " is already waiting for its reply; ids are unique among a "
                         "connection's requests in flight")));
      }
      if (request.kind == bulk::kSparsePushPull) {
        RETURN_IF_ERROR(ServeSparse(hello, bulk::DecodeSparseRequest(head_bytes)));
        continue;
      }
      if (request.kind == bulk::kAsyncPushPull) {
        RETURN_IF_ERROR(ServeAsync(hello, bulk::DecodeAsyncRequest(head_bytes)));
        continue;
      }
      if (request.kind != bulk::kPushPull) {
        return Fatal(absl::InvalidArgumentError(absl::StrCat(
            "unknown bulk request kind ", request.kind,
            " (known: 1, PushPull; 2, SparsePushPull; 3, AsyncPushPull)")));
      }
      ASSIGN_OR_RETURN(std::shared_ptr<float[]> buffer,
                       ReadFloats(request.request_id, request.count, "bulk request values"));
      const absl::Time arrived = service_.Now();
      const uint64_t bytes = bulk::Request::kBytes + uint64_t{request.count} * sizeof(float);
      const ParameterServerService::PushPullHead head{
          hello.fingerprint, hello.rank,    request.step,   static_cast<int>(request.stream),
          request.ratio,     request.chunk, request.weight, request.lr};
      service_.CountRequest(bytes);
      absl::StatusOr<size_t> count = service_.AdmitPushPull(head, arrived);
      if (count.ok() && *count != request.count) {
        count = absl::InvalidArgumentError(absl::StrCat(
            ParameterServerService::CallName(head), ": values: expected ", *count,
            " float32 values, got ", request.count));
      }
      if (!count.ok()) {
        service_.CountRefused(bytes);
        Enqueue(Failure(request.request_id, shard_.Refusal(count.status())));
        continue;
      }
      JoinRound(head, request.request_id, absl::MakeConstSpan(buffer.get(), request.count),
                bytes, arrived, buffer);
    }
  }

  bool Awaiting(uint64_t request_id) const {
    absl::MutexLock lock(&mu_);
    return awaiting_.contains(request_id);
  }

  // A peer that does not read its replies is not read either, so that they
  // cannot pile up here without bound: its requests wait in the sockets
  // until the writer, stuck for a round's timeout, ends the connection. As
  // many as a member may keep waiting in rounds (MaxWaitingCallsPerRank)
  // may be queued, so a member that has sent a round's chunks before it
  // reads the first reply is read on.
  // False once the connection reads no more requests (its shutdown).
  bool AwaitRoomForReplies() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
          return c->queue_.size() < c->max_queued_ || c->writer_done_ || c->reading_stopped_;
        },
        this));
    return !reading_stopped_;
  }

  // A request's `count` floats, at most a chunk (more cannot be read past:
  // the connection ends), in a buffer of their own from the shard's pool,
  // since a round may keep it (RoundTable::Push).
  absl::StatusOr<std::shared_ptr<float[]>> ReadFloats(uint64_t request_id, uint32_t count,
                                                      const char* what) {
    if (count > chunk_floats_) {
      return Fatal(absl::InvalidArgumentError(absl::StrCat("bulk request ", request_id,
                                                           " carries ", count,
                                                           " floats; a chunk holds at most ",
                                                           chunk_floats_)));
    }
    std::shared_ptr<MeanValues> pooled = FloatPool::Shared().Get(count);
    std::shared_ptr<float[]> buffer(pooled, pooled->data());
    RETURN_IF_ERROR(stream_->RecvAll(buffer.get(), count * sizeof(float),
                                     absl::Now() + reply_timeout_, what));
    return buffer;
  }

  // Reads a SparsePushPull's entries and hands them to the sparse exchange,
  // whose reply (or refusal) is queued. An error ends the connection.
  absl::Status ServeSparse(const bulk::Hello& hello, const bulk::SparseRequest& request) {
    // As many entries as a gRPC message may carry (docs/protocol.md 14.3).
    if (request.count > chunk_floats_ / 2) {
      return Fatal(absl::InvalidArgumentError(absl::StrCat(
          "bulk request ", request.request_id, " carries ", request.count,
          " sparse entries; a request holds at most ", chunk_floats_ / 2)));
    }
    SparseVector entries;
    entries.indices.resize(request.count);
    entries.values.resize(request.count);
    iovec iov[2] = {{entries.indices.data(), request.count * sizeof(uint32_t)},
                    {entries.values.data(), request.count * sizeof(float)}};
    RETURN_IF_ERROR(stream_->RecvAll(absl::MakeSpan(iov), absl::Now() + reply_timeout_,
                                     "bulk request entries"));
    const uint64_t bytes =
        bulk::SparseRequest::kBytes + uint64_t{request.count} * (sizeof(uint32_t) + sizeof(float));
    sparse_.Push({hello.fingerprint, hello.rank, request.step, request.k}, std::move(entries),
                 bytes, bulk::Reply::kBytes,
                 ReplyTo<SparseRoundReply>(
                     request.request_id, [](Connection&, Outgoing& out, SparseRoundReply reply) {
                       out.head.count =
                           static_cast<uint32_t>(reply->indices.size() / sizeof(uint32_t));
                       out.sparse = std::move(reply);
                     }));
    return absl::OkStatus();
  }

  // Reads an AsyncPushPull's gradient and hands it to the asynchronous
  // service, whose reply (or refusal) is queued. An error ends the
  // connection.
  absl::Status ServeAsync(const bulk::Hello& hello, const bulk::AsyncRequest& request) {
    ASSIGN_OR_RETURN(std::shared_ptr<float[]> gradient,
                     ReadFloats(request.request_id, request.count, "bulk request gradient"));
    const uint64_t bytes = bulk::AsyncRequest::kBytes + uint64_t{request.count} * sizeof(float);
    async_.Push({hello.fingerprint, hello.rank, request.step, request.lr, request.offset,
                 request.count},
                std::move(gradient), bytes, bulk::Reply::kBytes,
                ReplyTo<RoundMean>(request.request_id,
                                   [](Connection&, Outgoing& out, RoundMean model) {
                                     out.head.count = static_cast<uint32_t>(model->size());
                                     out.mean = std::move(model);
                                   }));
    return absl::OkStatus();
  }

  // The token that follows `hello`, read within `deadline`; a token too long
  // to read is refused (answered, and the connection ended).
  absl::StatusOr<std::string> ReadToken(const bulk::Hello& hello, absl::Time deadline) {
    if (hello.token_bytes > bulk::kMaxTokenBytes) {
      return Fatal(absl::InvalidArgumentError(absl::StrCat("a bulk hello's token of ",
                                                           hello.token_bytes, " bytes (at most ",
                                                           bulk::kMaxTokenBytes, ")")));
    }
    std::string token(hello.token_bytes, '\0');
    RETURN_IF_ERROR(stream_->RecvAll(token.data(), token.size(), deadline, "bulk hello"));
    return token;
  }

  // A worker without TLS would wait for the handshake's answer until its
  // deadline: a connection that opens with a plaintext hello is told, in
  // plaintext (it learns nothing of the job), and ended.
  absl::Status RefusePlaintextHello() {
    char first[sizeof(bulk::kMagic)];
    RETURN_IF_ERROR(PeekAll(stream_->fd(), first, sizeof(first),
                            absl::Now() + kHandshakeTimeout, "bulk handshake"));
    uint32_t magic = 0;
    std::memcpy(&magic, first, sizeof(magic));
    if (magic != bulk::kMagic) return absl::OkStatus();
    // The hello and its token are read first (see Serve).
    const absl::Time deadline = absl::Now() + kHandshakeTimeout;
    char hello_bytes[bulk::Hello::kBytes];
    RETURN_IF_ERROR(
        cserps::RecvAll(stream_->fd(), hello_bytes, sizeof(hello_bytes), deadline, "bulk hello"));
    const bulk::Hello hello = bulk::DecodeHello(hello_bytes);
    std::string token(std::min(hello.token_bytes, bulk::kMaxTokenBytes), '\0');
    RETURN_IF_ERROR(
        cserps::RecvAll(stream_->fd(), token.data(), token.size(), deadline, "bulk hello"));
    const absl::Status refusal = absl::UnauthenticatedError(
        "this shard's bulk transport requires TLS: the worker's job config needs security "
        "{ ca_cert cert key } of the job");
    Outgoing out = Failure(0, refusal);
    char head[bulk::Reply::kBytes];
    iovec iov[4];
    SendAll(stream_->fd(), Unsent(out, head, iov), deadline, "bulk refusal")
        .IgnoreError();  // the connection ends either way
    return refusal;
  }

  void JoinRound(const ParameterServerService::PushPullHead& head, uint64_t request_id,
                 absl::Span<const float> values, uint64_t bytes, absl::Time arrived,
                 std::shared_ptr<const void> keep) {
    service_.JoinRound(head, values, bytes, arrived,
                       ReplyTo<RoundMean>(request_id, [stream = head.stream](
                                                          Connection& self, Outgoing& out,
                                                          RoundMean mean) {
                         out.head.count = static_cast<uint32_t>(mean->size());
                         out.head.members = self.service_.members();
                         out.mean = std::move(mean);
                         out.push_pull = true;
                         out.stream = stream;
                       }),
                       std::move(keep));
  }

  // The callback that queues request `request_id`'s reply once its result
  // comes: the refusal, or the frame `fill(connection, frame, result)` makes.
  // Nothing once the connection is gone.
  template <typename Result, typename Fill>
  std::function<void(absl::StatusOr<Result>)> ReplyTo(uint64_t request_id, Fill fill) {
    auto awaited = std::make_shared<Awaited>(this, request_id);
    return [weak = weak_from_this(), request_id, fill = std::move(fill),
            awaited = std::move(awaited)](absl::StatusOr<Result> result) {
      std::shared_ptr<Connection> self = weak.lock();
      if (self == nullptr) return;
      if (!result.ok()) {
        self->Enqueue(Failure(request_id, result.status()), awaited.get());
      } else {
        Outgoing out;
        out.head.request_id = request_id;
        fill(*self, out, *std::move(result));
        self->Enqueue(std::move(out), awaited.get());
      }
    };
  }

  // A request whose reply is still to come, counted in awaiting_ from its
  // admission until its reply is queued, or its callback dropped unrun: a
  // peer that stops sending still gets the replies of its rounds in flight.
  class Awaited {
   public:
    Awaited(Connection* c, uint64_t request_id)
        : connection_(c->weak_from_this()), request_id_(request_id) {
      absl::MutexLock lock(&c->mu_);
      c->awaiting_.insert(request_id);
    }
    Awaited(const Awaited&) = delete;
    Awaited& operator=(const Awaited&) = delete;
    ~Awaited() { Done(); }

    void Done() {
      if (done_.exchange(true)) return;
      std::shared_ptr<Connection> c = connection_.lock();
      if (c == nullptr) return;
      absl::MutexLock lock(&c->mu_);
      c->awaiting_.erase(request_id_);
    }
    // Done, by the connection `c` that holds its lock.
    void DoneLocked(Connection& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c.mu_) {
      if (!done_.exchange(true)) c.awaiting_.erase(request_id_);
    }

   private:
    const std::weak_ptr<Connection> connection_;
    const uint64_t request_id_;
    std::atomic<bool> done_{false};
  };

  static Outgoing Failure(uint64_t request_id, const absl::Status& status) {
    Outgoing out;
    out.head.request_id = request_id;
    out.head.code = static_cast<uint32_t>(status.code());
    out.message = std::string(status.message().substr(0, bulk::kMaxMessageBytes));
    out.head.message_bytes = static_cast<uint32_t>(out.message.size());
    return out;
  }

  // Answers `status` with request_id 0 and ends the connection.
  absl::Status Fatal(const absl::Status& status) {
    Enqueue(Failure(0, shard_.Refusal(status)));
    return status;
  }

  // The frame's bytes not yet sent, as iovecs into `iov`.
  static absl::Span<iovec> Unsent(Outgoing& out, char* head, iovec (&iov)[4]) {
    bulk::Encode(out.head, head);
    iov[0] = {head, bulk::Reply::kBytes};
    iov[1] = {out.message.data(), out.message.size()};
    iov[2] = {nullptr, 0};
    iov[3] = {nullptr, 0};
    if (out.mean != nullptr) {
      iov[2] = {const_cast<float*>(out.mean->data()), out.mean->size() * sizeof(float)};
    }
    if (out.sparse != nullptr) {
      iov[2] = {const_cast<char*>(out.sparse->indices.data()), out.sparse->indices.size()};
      iov[3] = {const_cast<char*>(out.sparse->values.data()), out.sparse->values.size()};
    }
    return SkipBytes(absl::MakeSpan(iov), out.sent);
  }

  static size_t FrameBytes(const Outgoing& out) {
    return bulk::Reply::kBytes + out.message.size() +
           (out.mean != nullptr ? out.mean->size() * sizeof(float) : 0) +
           (out.sparse != nullptr ? out.sparse->indices.size() + out.sparse->values.size() : 0);
  }

  // The connection's refusal, after which nothing more is sent.
  static bool IsLast(const Outgoing& out) {
    return out.head.code != 0 && out.head.request_id == 0;
  }

  // A small reply is written at once by the thread that produced it (the
  // one completing a round, usually another member's reader) when nothing
  // else is being written: most of a small round's time would otherwise be
  // the hand-over to the writer. What the socket does not take at once,
  // every larger reply and every reply over TLS (whose records cannot be
  // left half written for another thread), the writer sends.
  // `awaited`, the request `out` answers, is done with the reply queued (or
  // claimed for sending) under the same lock: the writer never finds
  // nothing awaited and nothing queued before it, and a peer that has the
  // reply may use its request_id again at once.
  void Enqueue(Outgoing out, Awaited* awaited = nullptr) {
    {
      absl::MutexLock lock(&mu_);
      if (awaited != nullptr) awaited->DoneLocked(*this);
      if (writer_done_) return;
      // Counted once committed to, before it leaves, as gRPC's replies are:
      // a member that has its mean sees it in the shard's counters.
      if (out.push_pull) service_.CountReply(out.stream, FrameBytes(out));
      if (writing_ || !queue_.empty() || IsLast(out) || FrameBytes(out) > kDirectReplyBytes ||
          stream_->tls()) {
        queue_.push_back(std::move(out));
        return;
      }
      writing_ = true;
    }
    char head[bulk::Reply::kBytes];
    iovec iov[4];
    absl::StatusOr<size_t> sent = stream_->SendSome(Unsent(out, head, iov), "bulk reply");
    if (sent.ok()) out.sent += *sent;
    const bool whole = sent.ok() && out.sent == FrameBytes(out);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    // The writer finishes it (or meets the socket's error on it).
    if (!whole) queue_.push_front(std::move(out));
  }

  void WriteLoop() {
    for (;;) {
      Outgoing out;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Connection* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
              return !c->writing_ &&
                     (!c->queue_.empty() ||
                      (c->reader_done_ && (c->awaiting_.empty() || c->stopped_)));
            },
            this));
        if (queue_.empty()) {
          // Decided under the lock, so Enqueue sends nothing after this.
          writer_done_ = true;
          break;
        }
        out = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      }
      char head[bulk::Reply::kBytes];
      iovec iov[4];
      // A member that reads nothing for a round's timeout is dropped.
      absl::Status sent = stream_->SendAll(Unsent(out, head, iov),
                                           absl::Now() + reply_timeout_, "bulk reply");
      {
        absl::MutexLock lock(&mu_);
        writing_ = false;
        if (!sent.ok() || IsLast(out)) {
          writer_done_ = true;
          break;
        }
      }
    }
    // Nothing more will be sent: the reader stops too, and the peer learns
    // it at once, not when the acceptor next reaps the connection.
    shutdown(stream_->fd(), SHUT_RDWR);
    absl::MutexLock lock(&mu_);
    writer_done_ = true;
    queue_.clear();
  }

  const std::unique_ptr<ByteStream> stream_;
  ShardContext& shard_;
  MemberSlots& slots_;
  // The rank whose slot this connection holds; the reader's alone.
  std::optional<uint32_t> member_;
  ParameterServerService& service_;
  SparseExchangeService& sparse_;
  AsyncService& async_;
  const uint64_t chunk_floats_;
  const size_t max_queued_;  // replies queued before the reader waits
  const absl::Duration reply_timeout_;
  mutable absl::Mutex mu_;
  std::deque<Outgoing> queue_ ABSL_GUARDED_BY(mu_);
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  // The ids of requests admitted whose replies are still to come (Awaited).
  absl::flat_hash_set<uint64_t> awaiting_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Drain waits no longer
  bool reading_stopped_ ABSL_GUARDED_BY(mu_) = false;  // StopReading
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;
  // A frame is being written (by the writer or by Enqueue).
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
  std::thread writer_;
};

absl::StatusOr<std::unique_ptr<BulkServer>> BulkServer::Start(ShardContext* shard,
                                                              ParameterServerService* service,
                                                              SparseExchangeService* sparse,
                                                              AsyncService* async,
                                                              const std::string& host,
                                                              int port) {
  std::shared_ptr<TlsContext> tls;
  if (shard->security().tls.has_value()) {
    ASSIGN_OR_RETURN(tls, TlsContext::ForServer(*shard->security().tls,
                                                shard->bad_certificate_counter()));
  }
  int bound = 0;
  absl::StatusOr<Socket> listener = ListenTcp(host, port, &bound);
  if (!listener.ok()) {
    return absl::UnavailableError(
        absl::StrCat("bulk transport: ", listener.status().message()));
  }
  std::unique_ptr<BulkServer> server(
      new BulkServer(shard, service, sparse, async, std::move(tls), *std::move(listener), bound));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

BulkServer::BulkServer(ShardContext* shard, ParameterServerService* service,
                       SparseExchangeService* sparse, AsyncService* async,
                       std::shared_ptr<TlsContext> tls, Socket listener, int port)
    : shard_(*shard),
      service_(*service),
      sparse_(*sparse),
      async_(*async),
      tls_(std::move(tls)),
      listener_(std::move(listener)),
      port_(port),
      max_connections_(size_t{kConnectionsPerMember} * shard->config().cluster().num_workers() +
                       kSpareConnections),
      slots_(std::make_unique<MemberSlots>(shard->shard(),
                                           shard->config().cluster().num_workers())) {}

BulkServer::~BulkServer() { Shutdown(); }

size_t BulkServer::open_connections() const {
  absl::MutexLock lock(&mu_);
  size_t open = 0;
  for (const auto& c : connections_) open += c->ended() ? 0 : 1;
  return open;
}

void BulkServer::AcceptLoop() {
  for (;;) {
    absl::StatusOr<Socket> socket = AcceptTcp(listener_);
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    Reap();
    if (!socket.ok()) {
      spdlog::warn("shard {}: {}", shard_.shard(), std::string(socket.status().message()));
      // Out of descriptors the next accept fails at once: give the
      // connections that end meanwhile a moment, rather than spin.
      mu_.AwaitWithTimeout(absl::Condition(&shut_down_), kAcceptBackoff);
      continue;
    }
    if (connections_.size() >= max_connections_) {
      // A flood of connections gets no threads: closed unanswered.
      if (++unanswered_ % kUnansweredPerWarning == 1) {
        spdlog::warn("shard {}: {} bulk connections closed unanswered: {} are open, the "
                     "limit ({} per member and {} more)", shard_.shard(), unanswered_,
                     connections_.size(), kConnectionsPerMember, kSpareConnections);
      }
      continue;
    }
    std::unique_ptr<ByteStream> stream;
    if (tls_ == nullptr) {
      stream = ByteStream::Plain(*std::move(socket));
    } else {
      absl::StatusOr<std::unique_ptr<ByteStream>> secured =
          ByteStream::Tls(*std::move(socket), *tls_, "");
      if (!secured.ok()) {
        spdlog::warn("shard {} bulk connection: {}", shard_.shard(),
                     std::string(secured.status().message()));
        continue;
      }
      stream = *std::move(secured);
    }
    auto connection = std::make_shared<Connection>(std::move(stream), &shard_, slots_.get(),
                                                   &service_, &sparse_, &async_);
    if (absl::Status started = connection->Start(); !started.ok()) {
      spdlog::warn("shard {}: {}", shard_.shard(), std::string(started.message()));
      continue;
    }
    connections_.push_back(std::move(connection));
  }
}

void BulkServer::Reap() {
  auto ended = std::partition(connections_.begin(), connections_.end(),
                              [](const auto& c) { return !c->ended(); });
  for (auto it = ended; it != connections_.end(); ++it) (*it)->Join();
  connections_.erase(ended, connections_.end());
}

void BulkServer::Shutdown() {
  std::vector<std::shared_ptr<Connection>> connections;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    connections.swap(connections_);
  }
  // Wakes the acceptor, which sees shut_down_.
  shutdown(listener_.fd(), SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  for (const auto& c : connections) c->StopReading();
  const absl::Time drained_by = absl::Now() + kDrainTimeout;
  for (const auto& c : connections) c->Drain(drained_by);
  for (const auto& c : connections) c->StopAndJoin();
}

}  // namespace cserps
