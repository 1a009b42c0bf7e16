#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace cserps {

void CallOnTerminationSignal(std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, on_signal = std::move(on_signal)] {
    int signo = 0;
    if (sigwait(&set, &signo) == 0) on_signal(signo);
  }).detach();
}

}  // namespace cserps
