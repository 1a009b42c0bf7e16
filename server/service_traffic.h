// The traffic of a shard service's calls, as its metrics report it: the
// calls it handled (their requests and replies), and the requests it refused
// before handling them (bad input, an unknown member, shutdown).
#ifndef CSERPS_SERVER_SERVICE_TRAFFIC_H_
#define CSERPS_SERVER_SERVICE_TRAFFIC_H_

#include "common/traffic_counter.h"

namespace cserps {

struct ServiceTraffic {
  TrafficCounter handled;
  TrafficCounter refused;  // requests only: a refusal carries no payload
};

}  // namespace cserps

#endif  // CSERPS_SERVER_SERVICE_TRAFFIC_H_
