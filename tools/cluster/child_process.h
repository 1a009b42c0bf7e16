// A child process reading no input (/dev/null) whose stdout and stderr
// arrive on one pipe, split into lines. Linux only (prctl(PR_SET_PDEATHSIG)):
// a child dies with the launcher, so no process outlives a killed launcher.
#ifndef CSERPS_TOOLS_CLUSTER_CHILD_PROCESS_H_
#define CSERPS_TOOLS_CLUSTER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cserps {

class ChildProcess {
 public:
  // Starts `argv` (argv[0] is the program's path) in its own process group
  // with `extra_env` ("NAME=value") added to the environment (replacing
  // the variables of those names it inherits). A program that cannot be
  // executed writes "cannot execute <path>: errno N" to its output and
  // exits with code 127.
  static absl::StatusOr<ChildProcess> Start(const std::string& name,
                                            const std::vector<std::string>& argv,
                                            const std::vector<std::string>& extra_env);

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  int output_fd() const { return fd_; }
  bool running() const { return !exit_code_.has_value(); }
  // The exit code, or 128 + signal number when it was killed.
  std::optional<int> exit_code() const { return exit_code_; }

  // Reads what is available on the pipe; returns complete lines. At end of
  // output (pipe closed) the partial last line is returned too and the fd is
  // closed (output_fd() becomes -1).
  std::vector<std::string> ReadLines();
  // Records the exit status from waitpid.
  void SetExited(int wait_status);
  // Stops reading the output, which a process the child started outside
  // its process group may hold open for ever; returns its partial last line.
  std::vector<std::string> CloseOutput();
  // Whether the child runs, or has exited and left a process in its group
  // (one it started there, which may not hold its output).
  bool GroupLives();
  // Sends `signo` to the child's process group (what it started there
  // too), while the child runs or, once it has exited, while its group
  // still has a process.
  void Signal(int signo);

 private:
  std::string name_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string partial_;
  std::optional<int> exit_code_;
  // Its group had no process left after it exited: the group's id (its
  // pid) may name another's group now.
  bool group_gone_ = false;
};

}  // namespace cserps

#endif  // CSERPS_TOOLS_CLUSTER_CHILD_PROCESS_H_
