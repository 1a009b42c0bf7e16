// Whether two processes run the same job: the fingerprint of a job config
// (cserps.v1.JobConfig) that tags every request, and the field-by-field
// comparison that explains a fingerprint mismatch (Register uses it to name
// the first differing field).
//
// Both cover the same fields, after the same normalisation: defaults applied
// (ApplyDefaults) and the local fields ignored, i.e. cluster.servers
// addresses (their count is covered), data.dir, log_every_steps and
// output_dir.
//
// Thread-compatible: each function only reads its arguments.
#ifndef CSERPS_COMMON_CONFIG_FINGERPRINT_H_
#define CSERPS_COMMON_CONFIG_FINGERPRINT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cserps/v1/config.pb.h"

namespace cserps {

// A 64-bit fingerprint of every non-local field. Computed over the
// deterministic serialization of a normalised copy with FNV-1a 64, so it is
// stable across processes, builds and machines, and a config equals its
// defaulted self. Two configs have equal fingerprints exactly when
// CompareJobConfigs finds them equal (up to hash collisions).
uint64_t JobFingerprint(const v1::JobConfig& config);

// OK when the non-local fields agree (after normalisation); otherwise
// FAILED_PRECONDITION naming the first differing field path (field-number
// order, depth first) and both values, e.g.
// "config mismatch at optimizer.lr: server has 0.1, worker has 0.05".
// `mine_label` / `theirs_label` name the two sides in the message. Repeated
// fields are shown as lists; for cluster.servers only the counts.
absl::Status CompareJobConfigs(const v1::JobConfig& mine,
                               const v1::JobConfig& theirs,
                               absl::string_view mine_label,
                               absl::string_view theirs_label);

}  // namespace cserps

#endif  // CSERPS_COMMON_CONFIG_FINGERPRINT_H_
