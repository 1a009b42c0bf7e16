#include "tools/cluster/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace cserps {

absl::StatusOr<ChildProcess> ChildProcess::Start(
    const std::string& name, const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // No child reads the launcher's input: in a group of its own, a read from
  // the terminal would stop it (SIGTTIN) for good, and processes sharing one
  // pipe would split its lines between them. They read an end of input.
  const int no_input = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (no_input < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("/dev/null: ", std::strerror(errno)));
  }
  // Build argv and envp before fork: the child only calls async-signal-safe
  // functions.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // An inherited variable that extra_env sets again is left out: getenv
  // would find the first of the two.
  auto overridden = [&extra_env](const char* entry) {
    for (const std::string& e : extra_env) {
      const size_t name = e.find('=') + 1;
      if (std::strncmp(entry, e.c_str(), name) == 0) return true;
    }
    return false;
  };
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!overridden(*e)) env.push_back(*e);
  }
  for (const std::string& e : extra_env) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  const pid_t parent = getpid();
  const std::string exec_failed = absl::StrCat("cannot execute ", argv[0], ": errno ");

  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    close(no_input);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // The launcher ignores SIGPIPE, and may have been started with SIGTERM
    // ignored (`trap '' TERM`); exec keeps an ignored signal ignored, and
    // SIGTERM is how the child is stopped, also when the launcher dies.
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &default_action, nullptr);
    sigaction(SIGTERM, &default_action, nullptr);
    dup2(no_input, STDIN_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execve(args[0], args.data(), env.data());
    // Only async-signal-safe calls here: the errno's digits by hand.
    const int failed = errno;
    char digits[16];
    int n = 0;
    for (int e = failed; n == 0 || e > 0; e /= 10) digits[n++] = static_cast<char>('0' + e % 10);
    (void)!write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    while (n > 0) (void)!write(STDERR_FILENO, &digits[--n], 1);
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  // Also here, so that the group exists before Signal can be called.
  setpgid(pid, pid);
  close(fds[1]);
  close(no_input);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  ChildProcess child;
  child.name_ = name;
  child.pid_ = pid;
  child.fd_ = fds[0];
  return child;
}

std::vector<std::string> ChildProcess::ReadLines() {
  std::vector<std::string> lines;
  if (fd_ < 0) return lines;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd_, buffer, sizeof(buffer));
    if (n > 0) {
      partial_.append(buffer, n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close(fd_);  // end of output (or a read error)
    fd_ = -1;
    break;
  }
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(partial_.substr(start, nl - start));
  }
  partial_.erase(0, start);
  if (fd_ < 0 && !partial_.empty()) {
    lines.push_back(partial_);
    partial_.clear();
  }
  return lines;
}

void ChildProcess::SetExited(int wait_status) {
  if (WIFEXITED(wait_status)) {
    exit_code_ = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    exit_code_ = 128 + WTERMSIG(wait_status);
  }
  // Its group may have emptied with it; if so, its id may be reused.
  if (kill(-pid_, 0) != 0 && errno == ESRCH) group_gone_ = true;
}

std::vector<std::string> ChildProcess::CloseOutput() {
  std::vector<std::string> lines;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (!partial_.empty()) lines.push_back(std::move(partial_));
  partial_.clear();
  return lines;
}

bool ChildProcess::GroupLives() {
  if (running()) return true;
  if (pid_ <= 0 || group_gone_) return false;
  if (kill(-pid_, 0) != 0 && errno == ESRCH) group_gone_ = true;
  return !group_gone_;
}

void ChildProcess::Signal(int signo) {
  if (pid_ <= 0 || group_gone_) return;
  // An exited child's pid stays allocated while a process of its group
  // lives; once none does, it may be reused, so the group is not signalled
  // again.
  if (kill(-pid_, signo) != 0 && errno == ESRCH && !running()) group_gone_ = true;
}

}  // namespace cserps
