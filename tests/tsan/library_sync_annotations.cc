// ThreadSanitizer sees only instrumented code, and Debian's Abseil and gRPC
// are not instrumented: without help every field guarded by an absl::Mutex
// would be reported as raced, its lock and unlock being invisible, and so
// would gRPC's inline (header) code that one thread runs before handing a
// call's batch to gRPC and another runs when the batch completes (or when a
// call of a callback method arrives). The test
// binaries of a CSERPS_TSAN build define those entry points themselves (the
// executable's definitions win over the shared libraries', for gRPC's own
// calls to Abseil too), tell TSan the happens-before edge each one makes,
// and call the library's definition. That gives TSan the order that locks,
// condition waits, notifications and gRPC completions establish; it does
// not check lock order (deadlocks), which the thread-safety analysis covers.
#include <dlfcn.h>
#include <grpc/grpc.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

#define CSERPS_STR2(x) #x
#define CSERPS_STR(x) CSERPS_STR2(x)

namespace {

void* Lookup(void* handle, const std::string& name) {
  void* fn = dlsym(handle, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "library_sync_annotations: %s not found\n", name.c_str());
    std::abort();
  }
  return fn;
}

// The library's definition of absl::<Class>::<Rest> (a const member
// function's name starts _ZNK), looked up by its Itanium name below the
// executable's.
template <typename Fn>
Fn Real(const char* class_and_rest, bool is_const = false) {
  const std::string ns = CSERPS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") +
                           std::to_string(ns.size()) + ns + class_and_rest;
  return reinterpret_cast<Fn>(Lookup(RTLD_NEXT, name));
}

void Acquire(const void* addr) { __tsan_acquire(const_cast<void*>(addr)); }
void Release(const void* addr) { __tsan_release(const_cast<void*>(addr)); }

// A Condition is evaluated with the mutex held, but inside the library,
// by the waiting thread or by whichever thread unlocks: each evaluation is
// bracketed as if it took the lock itself. The wrapper is a Condition of a
// void* function, which the library stores and calls in its own
// (uninstrumented) code; an evaluating thread acquires the Guarded first,
// since it may have taken the lock before the waiter wrote and released it.
struct Guarded {
  const absl::Condition* cond;
  absl::Mutex* mu;
};

bool EvalGuarded(void* arg) {
  Acquire(arg);
  const Guarded* g = static_cast<const Guarded*>(arg);
  Acquire(g->mu);
  const bool holds = g->cond->Eval();
  Release(g->mu);
  return holds;
}

// Acquires `mu` when it goes out of scope: after the call it brackets has
// returned.
struct AcquireOnExit {
  const absl::Mutex* mu;
  ~AcquireOnExit() { Acquire(mu); }
};

// real(mu, cond, args...) for the Mutex functions that wait for a Condition
// (what this thread wrote is released to whoever evaluates it).
template <typename R, typename... Params, typename... Args>
R WithCondition(R (*real)(absl::Mutex*, const absl::Condition&, Params...), absl::Mutex* mu,
                const absl::Condition& cond, Args... args) {
  Guarded g{&cond, mu};
  Release(&g);
  Release(mu);
  AcquireOnExit acquire{mu};
  return real(mu, absl::Condition(&EvalGuarded, static_cast<void*>(&g)), args...);
}

// real(cv, mu, args...) for CondVar's waits, which unlock and relock `mu`.
template <typename R, typename... Params, typename... Args>
R Waiting(R (*real)(absl::CondVar*, absl::Mutex*, Params...), absl::CondVar* cv,
          absl::Mutex* mu, Args... args) {
  Release(mu);
  AcquireOnExit acquire{mu};
  return real(cv, mu, args...);
}

using Self = void (*)(absl::Mutex*);
using SelfBool = bool (*)(absl::Mutex*);
using SelfCond = void (*)(absl::Mutex*, const absl::Condition&);
using SelfCondDuration = bool (*)(absl::Mutex*, const absl::Condition&, absl::Duration);
using SelfCondTime = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using CvWait = void (*)(absl::CondVar*, absl::Mutex*);
using CvWaitDuration = bool (*)(absl::CondVar*, absl::Mutex*, absl::Duration);
using CvWaitTime = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);
using NoteSelf = void (*)(absl::Notification*);
using NoteWait = void (*)(const absl::Notification*);
using NoteWaitDuration = bool (*)(const absl::Notification*, absl::Duration);
using NoteWaitTime = bool (*)(const absl::Notification*, absl::Time);

// HasBeenNotified() is inline: it reads the flag that follows the mutex in
// absl::Notification with an (instrumented) acquire load, so Notify
// releases that address too.
const void* NotifiedFlag(const absl::Notification* n) {
  static_assert(sizeof(absl::Notification) > sizeof(absl::Mutex));
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

// A callback-API batch completes in a gRPC thread, which runs the batch's
// tag, a grpc_completion_queue_functor whose functor_run is one of two
// inline functions of gRPC's headers. A callback server's call arrives the
// same way: its tag's run is a function of libgrpc++ (CallbackRequest's
// CallbackCallTag::StaticRun, one per kind of server context), and the tag
// comes from the allocator the server set for the method, run by the gRPC
// thread that matched the call. Starting a batch or allocating a call
// releases the tag, and points functor_run at a function that acquires it
// first.
using FunctorRun = void (*)(grpc_completion_queue_functor*, int);

constexpr char kSuccessRun[] =
    "_ZN4grpc8internal22CallbackWithSuccessTag9StaticRunEP29grpc_completion_queue_functori";
constexpr char kStatusRun[] =
    "_ZN4grpc8internal21CallbackWithStatusTag9StaticRunEP29grpc_completion_queue_functori";
constexpr char kRequestRun[] =
    "_ZN4grpc6Server15CallbackRequestINS_21CallbackServerContextEE15CallbackCallTag9StaticRunEP29"
    "grpc_completion_queue_functori";
constexpr char kGenericRequestRun[] =
    "_ZN4grpc6Server15CallbackRequestINS_28GenericCallbackServerContextEE15CallbackCallTag9"
    "StaticRunEP29grpc_completion_queue_functori";

template <const char* kName>
FunctorRun LibraryRun() {
  static const FunctorRun run = reinterpret_cast<FunctorRun>(Lookup(RTLD_DEFAULT, kName));
  return run;
}

template <const char* kName>
void AcquiringRun(grpc_completion_queue_functor* tag, int ok) {
  Acquire(tag);
  LibraryRun<kName>()(tag, ok);
}

template <const char* kName>
bool Wrap(grpc_completion_queue_functor* functor) {
  if (functor->functor_run != LibraryRun<kName>()) return false;
  functor->functor_run = &AcquiringRun<kName>;
  return true;
}

// Tags of the synchronous and completion-queue APIs are not functors; their
// first word (a vtable) matches none of the runs.
void ReleaseTag(void* tag) {
  if (tag == nullptr) return;
  Release(tag);
  auto* functor = static_cast<grpc_completion_queue_functor*>(tag);
  Wrap<kSuccessRun>(functor) || Wrap<kStatusRun>(functor) || Wrap<kRequestRun>(functor) ||
      Wrap<kGenericRequestRun>(functor);
}

template <typename Fn>
Fn Grpc(const char* name) {
  return reinterpret_cast<Fn>(Lookup(RTLD_NEXT, name));
}

// `allocator`, run where the server matches a call, ordered after the thread
// that set it (the one that registered the service, having built its
// method handlers), and releasing the call's tag in turn.
template <typename Allocation>
std::function<Allocation()> Ordered(std::function<Allocation()> allocator) {
  auto shared = std::make_shared<std::function<Allocation()>>(std::move(allocator));
  Release(shared.get());
  return [shared] {
    Acquire(shared.get());
    Allocation allocation = (*shared)();
    ReleaseTag(allocation.tag);
    return allocation;
  };
}

}  // namespace

// gRPC 1.51's core server (src/core/lib/surface/server.h, which Debian does
// not install), as far as the allocators of callback methods go: libgrpc++
// sets one per method when a service is registered.
namespace grpc_core {
class Server {
 public:
  struct BatchCallAllocation {
    void* tag;
    grpc_call** call;
    grpc_metadata_array* initial_metadata;
    grpc_call_details* details;
    grpc_completion_queue* cq;
  };
  struct RegisteredCallAllocation {
    void* tag;
    grpc_call** call;
    grpc_metadata_array* initial_metadata;
    gpr_timespec* deadline;
    grpc_byte_buffer** optional_payload;
    grpc_completion_queue* cq;
  };
  void SetBatchMethodAllocator(grpc_completion_queue* cq,
                               std::function<BatchCallAllocation()> allocator);
  void SetRegisteredMethodAllocator(grpc_completion_queue* cq, void* method_tag,
                                    std::function<RegisteredCallAllocation()> allocator);
};

void Server::SetBatchMethodAllocator(grpc_completion_queue* cq,
                                     std::function<BatchCallAllocation()> allocator) {
  using Real = void (*)(Server*, grpc_completion_queue*, std::function<BatchCallAllocation()>);
  static const Real real = Grpc<Real>(
      "_ZN9grpc_core6Server23SetBatchMethodAllocatorEP21grpc_completion_queueSt8functionIFNS0_"
      "19BatchCallAllocationEvEE");
  real(this, cq, Ordered(std::move(allocator)));
}

void Server::SetRegisteredMethodAllocator(grpc_completion_queue* cq, void* method_tag,
                                          std::function<RegisteredCallAllocation()> allocator) {
  using Real = void (*)(Server*, grpc_completion_queue*, void*,
                        std::function<RegisteredCallAllocation()>);
  static const Real real = Grpc<Real>(
      "_ZN9grpc_core6Server28SetRegisteredMethodAllocatorEP21grpc_completion_queuePvSt8"
      "functionIFNS0_24RegisteredCallAllocationEvEE");
  real(this, cq, method_tag, Ordered(std::move(allocator)));
}
}  // namespace grpc_core

extern "C" grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops,
                                                 size_t nops, void* tag, void* reserved) {
  static const auto real = Grpc<decltype(&grpc_call_start_batch)>("grpc_call_start_batch");
  ReleaseTag(tag);
  return real(call, ops, nops, tag, reserved);
}

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const Self real = Real<Self>("5Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  static const Self real = Real<Self>("5Mutex6UnlockEv");
  Release(this);
  real(this);
}

bool Mutex::TryLock() {
  static const SelfBool real = Real<SelfBool>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::ReaderLock() {
  static const Self real = Real<Self>("5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  static const Self real = Real<Self>("5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

bool Mutex::ReaderTryLock() {
  static const SelfBool real = Real<SelfBool>("5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::LockWhen(const Condition& cond) {
  static const SelfCond real = Real<SelfCond>("5Mutex8LockWhenERKNS0_9ConditionE");
  WithCondition(real, this, cond);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const SelfCond real = Real<SelfCond>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  WithCondition(real, this, cond);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const SelfCondDuration real =
      Real<SelfCondDuration>("5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return WithCondition(real, this, cond, timeout);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const SelfCondTime real =
      Real<SelfCondTime>("5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return WithCondition(real, this, cond, deadline);
}

void Mutex::Await(const Condition& cond) {
  static const SelfCond real = Real<SelfCond>("5Mutex5AwaitERKNS0_9ConditionE");
  WithCondition(real, this, cond);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const SelfCondDuration real =
      Real<SelfCondDuration>("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return WithCondition(real, this, cond, timeout);
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const SelfCondTime real =
      Real<SelfCondTime>("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return WithCondition(real, this, cond, deadline);
}

void CondVar::Wait(Mutex* mu) {
  static const CvWait real = Real<CvWait>("7CondVar4WaitEPNS0_5MutexE");
  Waiting(real, this, mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const CvWaitDuration real =
      Real<CvWaitDuration>("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting(real, this, mu, timeout);
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const CvWaitTime real =
      Real<CvWaitTime>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting(real, this, mu, deadline);
}

void Notification::Notify() {
  static const NoteSelf real = Real<NoteSelf>("12Notification6NotifyEv");
  Release(this);
  Release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static const NoteWait real = Real<NoteWait>("12Notification19WaitForNotificationEv", true);
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const NoteWaitDuration real = Real<NoteWaitDuration>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const NoteWaitTime real = Real<NoteWaitTime>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
