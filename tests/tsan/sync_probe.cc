// Shows that the CSERPS_TSAN build sees what it is meant to see.
// `sync_probe race`: two threads write one int with nothing ordering them,
// which ThreadSanitizer must report. `sync_probe ordered`: the same writes
// ordered only by Debian's Abseil (Mutex, Await, CondVar, Notification),
// which it must not report once tests/tsan/library_sync_annotations.cc tells
// it about them.
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

int Race() {
  int value = 0;
  absl::Notification started;
  std::thread writer([&] {
    value = 1;
    started.Notify();
  });
  value = 2;  // not ordered with the writer's
  started.WaitForNotification();
  writer.join();
  return value > 0 ? 0 : 1;
}

int Ordered() {
  absl::Mutex mu;
  int locked = 0;       // under mu
  int awaited = 0;      // written before a Notify, read after the wait
  bool ready = false;   // under mu
  absl::CondVar changed;
  absl::Notification handed_over;
  std::thread other([&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++locked;
    }
    awaited = 7;
    handed_over.Notify();
    absl::MutexLock lock(&mu);
    ready = true;
    changed.Signal();
  });
  for (int i = 0; i < 1000; ++i) {
    absl::MutexLock lock(&mu);
    ++locked;
  }
  handed_over.WaitForNotification();
  const int seen = awaited;
  {
    absl::MutexLock lock(&mu);
    while (!ready) changed.Wait(&mu);
    mu.Await(absl::Condition(+[](int* n) { return *n == 2000; }, &locked));
  }
  other.join();
  return seen == 7 && locked == 2000 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "race") == 0) return Race();
  if (argc == 2 && std::strcmp(argv[1], "ordered") == 0) return Ordered();
  std::fprintf(stderr, "usage: sync_probe race|ordered\n");
  return 2;
}
