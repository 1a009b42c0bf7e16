// What every gRPC service of a server shard takes (ParameterServerService,
// SparseExchangeService, AsyncService): its clock and whether it runs its
// own expiry thread.
#ifndef CSERPS_SERVER_SERVICE_OPTIONS_H_
#define CSERPS_SERVER_SERVICE_OPTIONS_H_

#include <chrono>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace cserps {

struct ShardServiceOptions {
  // Injectable clock for timeouts and member activity (tests); the services
  // use RealNow when it is unset.
  std::function<absl::Time()> now;
  // Run the service's expiry thread: it fails overdue rounds, or for
  // AsyncService declares silent ranks dead. Tests that drive expiry by hand
  // (ExpireOverdueRounds, ExpireSilentRanks) turn it off.
  bool expiry_thread = true;
};

// The real clock, for options that leave `now` unset: a steady one, as the
// services only take differences of its times, so that a step of the wall
// clock (a resumed VM, NTP) neither fails every open round nor holds them.
inline absl::Time RealNow() {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

}  // namespace cserps

#endif  // CSERPS_SERVER_SERVICE_OPTIONS_H_
