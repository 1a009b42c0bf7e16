// The identity a worker process registers with (Register's worker_id), by
// which the servers recognise its retries, and where a node's local ranks
// meet.
#ifndef CSERPS_WORKER_PS_WORKER_ID_H_
#define CSERPS_WORKER_PS_WORKER_ID_H_

#include <string>

namespace cserps {

// host:pid:nonce. host:pid alone is not unique: containers on the host's
// network share its hostname and each runs its worker as pid 1.
std::string DefaultWorkerId();

// The id every local rank of a node computes alike (no pid, no nonce): the
// host name, plus ":rank<R>" when the node claims rank R (requested_rank
// >= 0), so that several nodes of one job can share a machine.
std::string DefaultNodeId(int requested_rank);

// The node-local directory where the local ranks of node `node_id` of job
// `job_name` meet (local rank 0's NCCL id, or its group's socket):
// /dev/shm/cserps-<job name>-<node id>, with every character that is not
// [A-Za-z0-9._-] replaced by '_'.
std::string DefaultNodeGroupDir(const std::string& job_name, const std::string& node_id);

}  // namespace cserps

#endif  // CSERPS_WORKER_PS_WORKER_ID_H_
