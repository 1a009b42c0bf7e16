// The identity a worker process registers with (Register's worker_id), by
// which the servers recognise its retries.
#ifndef CSERPS_WORKER_PS_WORKER_ID_H_
#define CSERPS_WORKER_PS_WORKER_ID_H_

#include <string>

namespace cserps {

// host:pid:nonce. host:pid alone is not unique: containers on the host's
// network share its hostname and each runs its worker as pid 1.
std::string DefaultWorkerId();

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_WORKER_ID_H_
