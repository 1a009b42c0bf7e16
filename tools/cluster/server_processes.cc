#include "tools/cluster/server_processes.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status.h"

namespace cserps {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kStopTimeout = absl::Seconds(10);

}  // namespace

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis: state is field 3, utime 14.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

uint64_t ProcessRssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t kib = 0;
    return words.size() >= 2 && absl::SimpleAtoi(words[1], &kib) ? kib * 1024 : 0;
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<ServerProcesses>> ServerProcesses::Start(
    const std::string& program, const std::string& config, int count,
    const std::vector<std::string>& extra_args) {
  std::unique_ptr<ServerProcesses> servers(new ServerProcesses);
  for (int s = 0; s < count; ++s) {
    std::vector<std::string> argv = {program, absl::StrCat("--config=", config),
                                     absl::StrCat("--shard=", s), "--listen=127.0.0.1:0"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    ASSIGN_OR_RETURN(ChildProcess child,
                     ChildProcess::Start(absl::StrCat("server ", s), argv, {}));
    servers->children_.push_back(std::move(child));
    ASSIGN_OR_RETURN(std::string address, servers->AwaitAddress(s));
    servers->addresses_.push_back(std::move(address));
  }
  for (ChildProcess& child : servers->children_) {
    servers->drains_.emplace_back([&child] {
      while (child.output_fd() >= 0) {
        pollfd p{child.output_fd(), POLLIN, 0};
        poll(&p, 1, 1000);
        child.ReadLines();
      }
    });
  }
  return servers;
}

ServerProcesses::~ServerProcesses() {
  // Those AwaitExit saw exit are reaped already.
  for (ChildProcess& child : children_) {
    if (child.running()) child.Signal(SIGTERM);
  }
  for (ChildProcess& child : children_) {
    if (!child.running()) continue;
    const absl::Time deadline = absl::Now() + kStopTimeout;
    int status = 0;
    while (waitpid(child.pid(), &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        child.Signal(SIGKILL);
        waitpid(child.pid(), &status, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  for (std::thread& t : drains_) t.join();
}

std::optional<int> ServerProcesses::AwaitExit(int shard, absl::Duration timeout) {
  ChildProcess& child = children_[shard];
  const absl::Time deadline = absl::Now() + timeout;
  while (child.running()) {
    int status = 0;
    const pid_t pid = waitpid(child.pid(), &status, WNOHANG);
    if (pid == child.pid()) {
      child.SetExited(status);
      break;
    }
    if (pid < 0 || absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return child.exit_code();
}

double ServerProcesses::CpuSeconds() const {
  double total = 0;
  for (const ChildProcess& child : children_) total += ProcessCpuSeconds(child.pid());
  return total;
}

absl::StatusOr<std::string> ServerProcesses::AwaitAddress(int shard) {
  ChildProcess& child = children_[shard];
  const absl::Time deadline = absl::Now() + kStartTimeout;
  const std::string marker = "listening on ";
  std::string log;
  while (absl::Now() < deadline && child.output_fd() >= 0) {
    pollfd p{child.output_fd(), POLLIN, 0};
    poll(&p, 1, 100);
    for (const std::string& line : child.ReadLines()) {
      log += line + "\n";
      const size_t at = line.find(marker);
      if (line.rfind("cserps-server shard ", 0) == 0 && at != std::string::npos) {
        return line.substr(at + marker.size());
      }
    }
  }
  return absl::UnavailableError(absl::StrCat("server ", shard, " did not listen: ", log));
}

}  // namespace cserps
