// Turns SIGINT/SIGTERM into a callback on a dedicated thread, so that
// shutdown runs as ordinary code rather than in a signal handler.
#ifndef CSERPS_COMMON_SIGNALS_H_
#define CSERPS_COMMON_SIGNALS_H_

#include <functional>

namespace cserps {

// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it
// starts afterwards: call it first in main) and starts a detached thread that
// waits for either and then calls `on_signal(signo)` once.
void CallOnTerminationSignal(std::function<void(int)> on_signal);

}  // namespace cserps

#endif  // CSERPS_COMMON_SIGNALS_H_
