// cserps-launch end to end: real server and worker processes on 127.0.0.1
// training on the installed Fashion-MNIST files.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace {

using cserps::testing::JsonNumber;
using cserps::testing::ReadFile;

constexpr char kDataDir[] = "/usr/share/datasets/fashion-mnist";

struct Result {
  int exit_code = -1;
  std::string output;
};

// Runs the shell command `line` (bounded by the launcher's own --timeout_s).
Result Run(const std::string& line) {
  Result result;
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// cserps-launch on configs/tiny.textproto with `overrides`.
Result Launch(const std::string& overrides, const std::string& flags = "") {
  return Run(absl::StrCat(CSERPS_LAUNCH_BIN, " --config=", CSERPS_SOURCE_DIR,
                          "/configs/tiny.textproto --timeout_s=120 ", flags, " --set='",
                          overrides, "' 2>&1"));
}

// cserps-launch on configs/tiny.textproto (2 workers) with `flags`, the
// workers being `command` (after "--"), run by `env` ("env ...", or none).
Result LaunchCommand(const std::string& flags, const std::string& command,
                     const std::string& env = "") {
  return Run(absl::StrCat(env, env.empty() ? "" : " ", CSERPS_LAUNCH_BIN, " --config=",
                          CSERPS_SOURCE_DIR, "/configs/tiny.textproto --timeout_s=60 ", flags,
                          " -- ", command, " 2>&1"));
}

// Runs the shell command `line` (a launcher, bounded by its --timeout_s),
// reading its output as it comes: `on_line` sees each line with the pids
// the launcher named so far ("[launch] <process> is pid P"; the first of
// each name).
struct Launched {
  std::string output;
  int exit_code = -1;
};
Launched RunReacting(
    const std::string& line,
    const std::function<void(const std::string&, const std::map<std::string, pid_t>&)>&
        on_line) {
  Launched result;
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  std::map<std::string, pid_t> pids;
  char buffer[4096];
  while (fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    const std::string text(buffer);
    result.output += text;
    const size_t is_pid = text.find(" is pid ");
    if (text.rfind("[launch] ", 0) == 0 && is_pid != std::string::npos) {
      pids.emplace(text.substr(9, is_pid - 9), std::atoi(text.c_str() + is_pid + 8));
    }
    on_line(text, pids);
  }
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// RunReacting: at the first line `trigger` accepts once the launcher named
// `process`'s pid, that pid is killed with SIGKILL.
struct Killed {
  std::string output;
  bool killed = false;
  int exit_code = -1;
};
Killed RunKillingOnce(const std::string& line, const std::string& process,
                      const std::function<bool(const std::string&)>& trigger) {
  Killed result;
  const Launched run = RunReacting(
      line, [&](const std::string& text, const std::map<std::string, pid_t>& pids) {
        auto pid = pids.find(process);
        if (!result.killed && pid != pids.end() && trigger(text)) {
          result.killed = kill(pid->second, SIGKILL) == 0;
        }
      });
  result.output = run.output;
  result.exit_code = run.exit_code;
  return result;
}

class LaunchTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kDataDir)) {
      GTEST_SKIP() << kDataDir << " is missing (Debian package dataset-fashion-mnist)";
    }
    out_ = std::filesystem::path(testing::TempDir()) / "launch_test_out";
    std::filesystem::remove_all(out_);
  }
  std::filesystem::path out_;
};

TEST_F(LaunchTest, TinyJobTrainsAndWritesSummaries) {
  const Result r = Launch(absl::StrCat("output_dir=", out_.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("== summary"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[server 0] cserps-server shard 0 listening on 127.0.0.1:"),
            std::string::npos) << r.output;
  double accuracy[2];
  for (int rank = 0; rank < 2; ++rank) {
    const std::string json = ReadFile(out_ / absl::StrCat("worker_", rank, ".json"));
    ASSERT_FALSE(json.empty()) << "no summary of rank " << rank;
    accuracy[rank] = JsonNumber(json, "test_accuracy");
    EXPECT_EQ(JsonNumber(json, "steps"), 15);  // floor(1000 / 64) per rank
    EXPECT_GT(JsonNumber(json, "bytes_pushed"), 0);
    const std::string csv = ReadFile(out_ / absl::StrCat("worker_", rank, ".csv"));
    EXPECT_EQ(csv.rfind("epoch,step,train_loss,test_loss,test_accuracy", 0), 0u) << csv;
  }
  // Softmax regression on 2000 examples for one epoch: far above chance
  // (10%), and the same model on both ranks.
  EXPECT_GT(accuracy[0], 0.6);
  EXPECT_EQ(accuracy[0], accuracy[1]);
}

// cluster.local_size 2 on the CPU: each of the 2 worker processes is a node
// running its 2 local ranks as threads; each local rank trains on its own
// quarter of the data and writes its own summary.
TEST_F(LaunchTest, NodesOfLocalRankThreadsWriteASummaryPerLocalRank) {
  const Result r = Launch(absl::StrCat("output_dir=", out_.string(),
                                       ";cluster.local_size=2"
                                       ";cluster.servers=127.0.0.1:0,127.0.0.1:0"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting 2 workers of 2 local-rank threads each"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 workers of 2 local ranks =="), std::string::npos) << r.output;
  double accuracy[2][2];
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_FALSE(std::filesystem::exists(out_ / absl::StrCat("worker_", rank, ".json")));
    for (int j = 0; j < 2; ++j) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " local rank ", j));
      const std::string json =
          ReadFile(out_ / absl::StrCat("worker_", rank, "_", j, ".json"));
      ASSERT_FALSE(json.empty());
      EXPECT_EQ(JsonNumber(json, "rank"), rank);
      EXPECT_EQ(JsonNumber(json, "local_rank"), j);
      EXPECT_EQ(JsonNumber(json, "steps"), 7);  // floor(2000 / 4 / 64)
      accuracy[rank][j] = JsonNumber(json, "test_accuracy");
      // The summary table has a row for every local rank.
      EXPECT_NE(r.output.find(absl::StrCat("\n", rank, ".", j, " ")), std::string::npos)
          << r.output;
    }
  }
  // S-SGD: one model everywhere, and it has learnt something.
  EXPECT_GT(accuracy[0][0], 0.5);
  EXPECT_EQ(accuracy[0][0], accuracy[0][1]);
  EXPECT_EQ(accuracy[0][0], accuracy[1][0]);
  EXPECT_EQ(accuracy[0][0], accuracy[1][1]);
}

TEST_F(LaunchTest, MetricsEndpointsAreListedForPrometheus) {
  const Result r = Launch(absl::StrCat("output_dir=", out_.string()), "--metrics");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string targets = ReadFile(out_ / "prometheus_targets.json");
  // One target group per process: the server and both workers, each with
  // the port its process printed.
  for (const char* process : {"server 0", "worker 0", "worker 1"}) {
    const std::string prefix = absl::StrCat("[", process, "] metrics on http://");
    const size_t at = r.output.find(prefix);
    ASSERT_NE(at, std::string::npos) << process << "\n" << r.output;
    const size_t begin = at + prefix.size();
    const std::string address = r.output.substr(begin, r.output.find('/', begin) - begin);
    EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
    const std::string role(process, std::string(process).find(' '));
    const std::string index(std::string(process).substr(role.size() + 1));
    EXPECT_NE(targets.find(absl::StrCat("{\"targets\": [\"", address,
                                        "\"], \"labels\": {\"role\": \"", role,
                                        "\", \"index\": \"", index, "\"}}")),
              std::string::npos)
        << targets;
  }
}

TEST_F(LaunchTest, FailingWorkerStopsTheClusterWithAnError) {
  const Result r = Launch(absl::StrCat("output_dir=", out_.string(), ";data.dir=",
                                       (out_ / "no-such-dir").string()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no-such-dir"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[launch] failed:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[server 0]"), std::string::npos) << r.output;
}

// A run of configs/tiny.textproto (2 shards) with --max_restarts=1 whose
// server 1 is killed at the first output line holding `trigger`, and the
// same job run without interruption; `job` adds to both.
struct CutAndWhole {
  Killed cut;
  std::string whole_output;
  int whole_exit_code = -1;
};
CutAndWhole KillAServer(const std::filesystem::path& out, const std::string& job,
                        const std::string& trigger) {
  // 90 steps, a checkpoint every 10; slowed down so that the job is far from
  // its end when the first checkpoint completes.
  const std::string common =
      absl::StrCat(";cluster.servers=127.0.0.1:0,127.0.0.1:0;epochs=6;checkpoint.every_steps=10"
                   ";data.rank_slowdown=20,20", job);
  CutAndWhole result;
  const Result whole = Launch(absl::StrCat("output_dir=", (out / "whole").string(),
                                           ";checkpoint.dir=", (out / "ckpt-whole").string(),
                                           common));
  result.whole_output = whole.output;
  result.whole_exit_code = whole.exit_code;
  const std::string line = absl::StrCat(
      CSERPS_LAUNCH_BIN, " --config=", CSERPS_SOURCE_DIR,
      "/configs/tiny.textproto --timeout_s=120 --max_restarts=1 --set='output_dir=",
      (out / "cut").string(), ";checkpoint.dir=", (out / "ckpt-cut").string(), common, "' 2>&1");
  result.cut = RunKillingOnce(line, "server 1", [&](const std::string& text) {
    return text.find(trigger) != std::string::npos;
  });
  return result;
}

// The interrupted run's summary of `rank` (out/cut) ends as the whole run's
// (out/whole): all 90 steps, the same losses and accuracies; neither a
// step applied twice nor one lost.
void ExpectTheUninterruptedEnd(const std::filesystem::path& out, int rank) {
  const std::string cut = ReadFile(out / "cut" / absl::StrCat("worker_", rank, ".json"));
  const std::string full = ReadFile(out / "whole" / absl::StrCat("worker_", rank, ".json"));
  ASSERT_FALSE(cut.empty());
  EXPECT_EQ(JsonNumber(cut, "steps"), 90);
  EXPECT_EQ(JsonNumber(full, "resumed_from_step"), 0);
  EXPECT_EQ(JsonNumber(full, "roll_backs"), 0);
  for (const char* key : {"train_loss", "test_loss", "test_accuracy", "test_accuracy_global"}) {
    EXPECT_EQ(JsonNumber(cut, key), JsonNumber(full, key)) << key;
  }
}

// S-SGD's workers follow a server restarted from the checkpoint in place:
// the launcher restarts server 1 alone, and the job ends as the
// uninterrupted one, every summary figure equal.
TEST_F(LaunchTest, KilledServerIsRestartedAloneAndTheWorkersRollBack) {
  const CutAndWhole run = KillAServer(out_, "", "(step complete)");
  ASSERT_EQ(run.whole_exit_code, 0) << run.whole_output;
  const std::string& output = run.cut.output;
  ASSERT_TRUE(run.cut.killed) << output;
  ASSERT_EQ(run.cut.exit_code, 0) << output;
  const std::string restart = "[launch] server 1 exited with code 137; restarting it alone at ";
  const size_t at = output.find(restart);
  ASSERT_NE(at, std::string::npos) << output;
  const std::string from = "from the checkpoint of step ";
  const int step = std::atoi(output.c_str() + output.find(from, at) + from.size());
  EXPECT_GT(step, 0);
  EXPECT_LT(step, 90);
  EXPECT_EQ(output.find("[launch] restart 1 of 1"), std::string::npos) << output;
  EXPECT_NE(output.find(absl::StrCat("rolled back to the checkpoint of step ", step)),
            std::string::npos)
      << output;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const std::string cut = ReadFile(out_ / "cut" / absl::StrCat("worker_", rank, ".json"));
    ASSERT_NO_FATAL_FAILURE(ExpectTheUninterruptedEnd(out_, rank));
    EXPECT_EQ(JsonNumber(cut, "roll_backs"), 1);
    // The same processes trained on: the steps trained again count once.
    const std::string whole = ReadFile(out_ / "whole" / absl::StrCat("worker_", rank, ".json"));
    for (const char* key : {"training_floats_pushed", "achieved_compression"}) {
      EXPECT_EQ(JsonNumber(cut, key), JsonNumber(whole, key)) << key;
    }
  }
}

// Killed before the first checkpoint there is nothing to roll back to: the
// launcher restarts the whole job from step 0, which ends as the
// uninterrupted one.
TEST_F(LaunchTest, KilledServerBeforeACheckpointRestartsTheWholeJob) {
  // The first checkpoint is 45 steps after the kill's trigger, far more
  // than the kill takes to arrive on a busy machine.
  const CutAndWhole run =
      KillAServer(out_, ";log_every_steps=2;checkpoint.every_steps=45", "[worker 0] ");
  ASSERT_EQ(run.whole_exit_code, 0) << run.whole_output;
  const std::string& output = run.cut.output;
  ASSERT_TRUE(run.cut.killed) << output;
  ASSERT_EQ(run.cut.exit_code, 0) << output;
  EXPECT_NE(output.find("server 1 exited with code 137"), std::string::npos) << output;
  EXPECT_NE(output.find("[launch] restart 1 of 1: no complete checkpoint yet, starting from "
                        "step 0"),
            std::string::npos)
      << output;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const std::string cut = ReadFile(out_ / "cut" / absl::StrCat("worker_", rank, ".json"));
    ASSERT_NO_FATAL_FAILURE(ExpectTheUninterruptedEnd(out_, rank));
    EXPECT_EQ(JsonNumber(cut, "resumed_from_step"), 0);
    EXPECT_EQ(JsonNumber(cut, "roll_backs"), 0);
  }
}

// --resume continues a job from its newest complete checkpoint, and
// refuses to start without one.
TEST_F(LaunchTest, ResumeContinuesFromTheNewestCheckpoint) {
  const std::string job = absl::StrCat("output_dir=", out_.string(), ";checkpoint.dir=",
                                       (out_ / "ckpt").string(), ";checkpoint.every_steps=5");
  const Result none = Launch(job, "--resume");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("--resume: no complete checkpoint of this job"), std::string::npos)
      << none.output;
  EXPECT_EQ(none.output.find("[server 0]"), std::string::npos) << none.output;

  const Result first = Launch(job);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Result resumed = Launch(job, "--resume");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  // 15 steps: checkpoints after 5 and 10 (none after the last).
  EXPECT_NE(resumed.output.find("[launch] resuming from the checkpoint of step 10"),
            std::string::npos)
      << resumed.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string json = ReadFile(out_ / absl::StrCat("worker_", rank, ".json"));
    EXPECT_EQ(JsonNumber(json, "resumed_from_step"), 10);
    EXPECT_EQ(JsonNumber(json, "steps"), 15);
  }
  // A fresh run in the folder of those checkpoints is refused by the
  // servers, and a restart would not cure it: neither the whole job nor a
  // server alone is restarted from them.
  const Result fresh = Launch(job, "--max_restarts=1");
  EXPECT_EQ(fresh.exit_code, 1) << fresh.output;
  EXPECT_NE(fresh.output.find("already holds a checkpoint of this job"), std::string::npos)
      << fresh.output;
  EXPECT_NE(fresh.output.find("[launch] not restarted: the servers failed before the workers "
                              "started, and would again"),
            std::string::npos)
      << fresh.output;
  EXPECT_EQ(fresh.output.find("restarting it alone"), std::string::npos) << fresh.output;
  EXPECT_EQ(fresh.output.find("[launch] restart 1 of 1"), std::string::npos) << fresh.output;
}

// cluster.elastic: kill -9 of one of 4 CSER workers mid-job; the servers
// drop it at its round's timeout, the launcher lets the others go on, and
// they finish the job with 3 members.
TEST_F(LaunchTest, ElasticJobFinishesWithoutAKilledWorker) {
  const std::string line = absl::StrCat(
      CSERPS_LAUNCH_BIN, " --config=", CSERPS_SOURCE_DIR,
      "/configs/tiny.textproto --timeout_s=120 --set='output_dir=", out_.string(),
      ";cluster.num_workers=4;cluster.elastic=true;cluster.round_timeout_s=3;epochs=8"
      ";log_every_steps=5;data.rank_slowdown=10,10,10,10;algorithm.name=cser"
      ";algorithm.period=4;algorithm.ratio_c1=2;algorithm.ratio_c2=8' 2>&1");
  // Worker 3 is killed when worker 0 reports step 10.
  const Killed run = RunKillingOnce(line, "worker 3", [](const std::string& text) {
    return text.rfind("[worker 0]", 0) == 0 && text.find("] step 10 ") != std::string::npos;
  });
  const std::string& output = run.output;
  ASSERT_TRUE(run.killed) << output;
  ASSERT_EQ(run.exit_code, 0) << output;
  EXPECT_NE(output.find("worker 3 exited with code 137; the elastic job goes on without it"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("dropped rank(s) 3"), std::string::npos) << output;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const std::string json = ReadFile(out_ / absl::StrCat("worker_", rank, ".json"));
    ASSERT_FALSE(json.empty());
    EXPECT_EQ(JsonNumber(json, "steps"), 56);  // 8 epochs of floor(500 / 64)
    EXPECT_NE(json.find("\"members\": 3}"), std::string::npos) << json;
  }
  EXPECT_FALSE(std::filesystem::exists(out_ / "worker_3.json"));
}

// cluster.admit_every_steps with --max_restarts: kill -9 of one of 4 CSER
// workers mid-job; the launcher starts a replacement, which takes rank 3
// once the servers drop it, rejoins at the next admission step and
// finishes the job with the others.
TEST_F(LaunchTest, ElasticJobReplacesAKilledWorker) {
  const std::string line = absl::StrCat(
      CSERPS_LAUNCH_BIN, " --config=", CSERPS_SOURCE_DIR,
      "/configs/tiny.textproto --timeout_s=120 --max_restarts=1 --set='output_dir=",
      out_.string(),
      ";cluster.num_workers=4;cluster.elastic=true;cluster.round_timeout_s=10"
      ";cluster.admit_every_steps=8;epochs=60;log_every_steps=5;algorithm.name=cser"
      ";algorithm.period=4;algorithm.ratio_c1=2;algorithm.ratio_c2=8' 2>&1");
  // Worker 3 is killed when worker 0 reports step 10. Once the server has
  // dropped it the others are stopped (SIGSTOP) until the replacement is
  // admitted, so that they cannot finish the job before it arrives; they
  // must stop for less than a round's timeout, which leaves the replacement
  // 10 s to start and register on a busy machine. (No data.rank_slowdown:
  // it would stretch a step by the time it was stopped.)
  bool killed = false, stopped = false, resumed = false;
  auto signal_others = [](const std::map<std::string, pid_t>& pids, int signal) {
    for (int r = 0; r < 3; ++r) kill(pids.at(absl::StrCat("worker ", r)), signal);
  };
  const Launched run = RunReacting(
      line, [&](const std::string& text, const std::map<std::string, pid_t>& pids) {
        if (!killed && pids.size() >= 5 && text.rfind("[worker 0]", 0) == 0 &&
            text.find("] step 10 ") != std::string::npos) {
          killed = kill(pids.at("worker 3"), SIGKILL) == 0;
        }
        if (killed && !stopped && text.find("dropped rank(s) 3") != std::string::npos) {
          stopped = true;
          signal_others(pids, SIGSTOP);
        }
        if (stopped && !resumed &&
            text.find("admitted back from the full average") != std::string::npos) {
          resumed = true;
          signal_others(pids, SIGCONT);
        }
      });
  const std::string& output = run.output;
  ASSERT_TRUE(killed) << output;
  EXPECT_TRUE(stopped && resumed) << output;
  ASSERT_EQ(run.exit_code, 0) << output;
  EXPECT_NE(output.find("worker 3 exited with code 137; starting a replacement"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("rank 3 admitted back from the full average of step"), std::string::npos)
      << output;
  const std::string replacement = ReadFile(out_ / "worker_3.json");
  ASSERT_FALSE(replacement.empty()) << output;
  EXPECT_EQ(JsonNumber(replacement, "steps"), 420);  // 60 epochs of floor(500 / 64)
  const double joined = JsonNumber(replacement, "joined_at_step");
  EXPECT_GT(joined, 10);
  EXPECT_EQ(static_cast<int>(joined) % 8, 0);
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const std::string json = ReadFile(out_ / absl::StrCat("worker_", rank, ".json"));
    EXPECT_EQ(JsonNumber(json, "steps"), 420);
    EXPECT_EQ(JsonNumber(json, "joined_at_step"), 0);
    EXPECT_NE(json.find("\"members\": 3}, {"), std::string::npos) << json;
    EXPECT_NE(json.find("\"members\": 4}"), std::string::npos) << json;
  }
}

// --nproc: the command's processes are the workers, each told its place as
// torchrun tells it, and the job's servers.
TEST(LaunchCommandTest, ProcessesGetTorchrunsAndTheJobsVariables) {
  const Result r = LaunchCommand(
      "--nproc=2 --max_restarts=3",
      "sh -c 'echo place $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE "
      "master $MASTER_ADDR servers $CSERPS_SERVERS job $CSERPS_JOB; "
      "echo role $ROLE_NAME $ROLE_RANK/$ROLE_WORLD_SIZE group $GROUP_RANK/$GROUP_WORLD_SIZE "
      "elastic $TORCHELASTIC_RESTART_COUNT/$TORCHELASTIC_MAX_RESTARTS $TORCHELASTIC_RUN_ID'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[worker 0] place 0/2 local 0/2 master 127.0.0.1 servers 127.0.0.1:"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[worker 1] place 1/2 local 1/2 master 127.0.0.1 servers 127.0.0.1:"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("job ", CSERPS_SOURCE_DIR, "/configs/tiny.textproto")),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[worker 1] role default 1/2 group 0/1 elastic 0/3 tiny"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[launch] 2 processes of /"), std::string::npos) << r.output;
}

// With nodes the processes are local ranks, numbered as torchrun --nnodes
// numbers them: node by node.
TEST(LaunchCommandTest, NodesProcessesAreTheirLocalRanks) {
  const Result r = LaunchCommand(
      "--nproc=4 --set=cluster.local_size=2",
      "sh -c 'echo place $RANK/$WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE node $GROUP_RANK'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* expected : {"[worker 0] place 0/4 local 0/2 node 0",
                               "[worker 1] place 1/4 local 1/2 node 0",
                               "[worker 2] place 2/4 local 0/2 node 1",
                               "[worker 3] place 3/4 local 1/2 node 1"}) {
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("[launch] 4 processes of /"), std::string::npos) << r.output;
}

TEST(LaunchCommandTest, AFailingProcessFailsTheJob) {
  const Result r = LaunchCommand("--nproc=2", "sh -c 'exit $((3 * RANK))'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("worker 1 exited with code 3"), std::string::npos) << r.output;
}

// What a worker started in its process group (a DataLoader's workers, say)
// is stopped with it, also once the worker itself has exited: here each
// leaves a process behind that says when it is stopped.
TEST(LaunchCommandTest, WhatAWorkerLeftBehindIsStoppedWithTheJob) {
  const std::filesystem::path script =
      std::filesystem::path(testing::TempDir()) / "leaves_a_process_behind.sh";
  {
    std::ofstream out(script);
    out << "ready=$(mktemp -u) && mkfifo \"$ready\" || exit 1\n"
           "( trap 'echo left behind, stopped; exit 0' TERM; echo > \"$ready\"; "
           "sleep 90 & wait ) &\n"
           "read _ < \"$ready\"\n"
           "rm -f \"$ready\"\n";
  }
  const Result r = LaunchCommand("--nproc=2", absl::StrCat("sh ", script.string()));
  std::filesystem::remove(script);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* expected : {"[worker 0] left behind, stopped",
                               "[worker 1] left behind, stopped"}) {
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  }
}

// ... also one that holds none of the worker's output, once the worker has
// exited: the launcher ends only after it.
TEST(LaunchCommandTest, WhatAWorkerLeftBehindSilentlyIsStoppedWithTheJob) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / absl::StrCat("left_behind.", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path script = dir / "leaves_a_silent_process_behind.sh";
  {
    std::ofstream out(script);
    out << "ready=$(mktemp -u) && mkfifo \"$ready\" || exit 1\n"
           "( trap 'echo > " << dir.string() << "/stopped.$RANK; exit 0' TERM; "
           "echo > \"$ready\"; sleep 90 & wait ) > /dev/null 2>&1 &\n"
           "echo $! > " << dir.string() << "/pid.$RANK\n"
           "read _ < \"$ready\"\n"
           "rm -f \"$ready\"\n";
  }
  const Result r = LaunchCommand("--nproc=2", absl::StrCat("sh ", script.string()));
  bool stopped[2];
  for (int rank = 0; rank < 2; ++rank) {
    stopped[rank] = std::filesystem::exists(dir / absl::StrCat("stopped.", rank));
    std::ifstream in(dir / absl::StrCat("pid.", rank));
    pid_t pid = 0;
    // Left running by a launcher that did not stop it: its group (the
    // worker's) is stopped here.
    if (in >> pid && !stopped[rank]) {
      const pid_t group = getpgid(pid);
      if (group > 0) kill(-group, SIGKILL);
    }
  }
  std::filesystem::remove_all(dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(stopped[0]) << r.output;
  EXPECT_TRUE(stopped[1]) << r.output;
}

// SIGTERM, which stops the processes (also when the launcher dies), is not
// passed on as ignored when the launcher was started with it ignored.
TEST(LaunchCommandTest, ATermInheritedAsIgnoredIsNotPassedOn) {
  const Result r = LaunchCommand(
      "--nproc=2",
      "python3 -c 'import signal; print(\"SIGTERM\", signal.getsignal(signal.SIGTERM).name)'",
      "python3 -c 'import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
      "os.execvp(sys.argv[1], sys.argv[1:])'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* expected : {"[worker 0] SIGTERM SIG_DFL", "[worker 1] SIGTERM SIG_DFL"}) {
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  }
}

// A hang-up (a closed terminal or ssh session) stops the cluster as Ctrl-C
// does, and the launcher exits as a shell reports a process ended by it.
TEST(LaunchCommandTest, AHangUpStopsTheCluster) {
  const Result r =
      LaunchCommand("--nproc=2", "sh -c '[ $RANK = 0 ] && kill -HUP $PPID; exec sleep 90'");
  EXPECT_EQ(r.exit_code, 128 + SIGHUP) << r.output;
  EXPECT_NE(r.output.find("[launch] signal 1 (Hangup): stopping the cluster"), std::string::npos)
      << r.output;
}

// ... unless it inherited the hang-up as ignored, as under nohup: the job
// goes on to its end. The hang-up is sent before the process exits, so a
// launcher that took it would read it before it learns of the exit.
TEST(LaunchCommandTest, AHangUpInheritedAsIgnoredIsIgnored) {
  const Result r = LaunchCommand("--nproc=2", "sh -c '[ $RANK = 0 ] && kill -HUP $PPID; exit 0'",
                                 "nohup");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("Hangup"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[launch] 2 processes of /"), std::string::npos) << r.output;
}

// SIGCHLD inherited as ignored would have the kernel reap the processes
// before the launcher learns how they ended.
TEST(LaunchCommandTest, ASigchldInheritedAsIgnoredStillReportsTheProcesses) {
  const Result r = LaunchCommand(
      "--nproc=2", "sh -c 'exit $((3 * RANK))'",
      "python3 -c 'import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
      "os.execvp(sys.argv[1], sys.argv[1:])'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("worker 1 exited with code 3"), std::string::npos) << r.output;
}

// The processes read no input, so one that reads finds its end rather than
// waiting on the launcher's: here a pipe whose writing end the launcher
// itself holds, which would never end.
TEST(LaunchCommandTest, ProcessesReadNoInput) {
  const Result r = LaunchCommand(
      "--nproc=2 --timeout_s=20", "sh -c 'cat; echo input ended'",
      "python3 -c 'import os, sys; r, w = os.pipe(); os.set_inheritable(w, True); "
      "os.dup2(r, 0); os.execvp(sys.argv[1], sys.argv[1:])'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* expected : {"[worker 0] input ended", "[worker 1] input ended"}) {
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  }
}

// A process started outside the worker's group (setsid) that keeps the
// worker's output open does not hold the launcher once the job has ended.
TEST(LaunchCommandTest, OutputHeldOutsideTheProcessGroupIsLeftAfterTheStop) {
  const std::filesystem::path pids =
      std::filesystem::path(testing::TempDir()) / absl::StrCat("setsid_pids.", getpid());
  const std::filesystem::path script =
      std::filesystem::path(testing::TempDir()) / absl::StrCat("leaves_its_group.", getpid());
  std::filesystem::remove(pids);
  {
    // The worker exits once the process is in its own session.
    std::ofstream out(script);
    out << "ready=$(mktemp -u) && mkfifo \"$ready\" || exit 1\n"
           "setsid sh -c 'echo $$ >> \"$1\"; echo > \"$2\"; exec sleep 120' sh "
        << pids.string() << " \"$ready\" &\n"
           "read _ < \"$ready\"\n"
           "rm -f \"$ready\"\n";
  }
  const Result r = LaunchCommand("--nproc=2", absl::StrCat("sh ", script.string()));
  std::filesystem::remove(script);
  std::ifstream in(pids);
  for (pid_t pid; in >> pid;) kill(pid, SIGKILL);
  std::filesystem::remove(pids);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[launch] worker 1 exited, but a process outside its process group "
                          "still holds its output: no longer reading it"),
            std::string::npos)
      << r.output;
}

// One thread per process and Python's output line by line, unless given.
TEST(LaunchCommandTest, ThreadsAndBufferingAreSetUnlessGiven) {
  const std::string print =
      "sh -c 'echo threads $OPENBLAS_NUM_THREADS $OMP_NUM_THREADS python $PYTHONUNBUFFERED'";
  const Result unset = LaunchCommand(
      "--nproc=2", print, "env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS -u PYTHONUNBUFFERED");
  ASSERT_EQ(unset.exit_code, 0) << unset.output;
  EXPECT_NE(unset.output.find("[worker 1] threads 1 1 python 1"), std::string::npos)
      << unset.output;
  const Result given = LaunchCommand("--nproc=2", print,
                                     "env -u OPENBLAS_NUM_THREADS OMP_NUM_THREADS=8 "
                                     "PYTHONUNBUFFERED=0");
  ASSERT_EQ(given.exit_code, 0) << given.output;
  EXPECT_NE(given.output.find("[worker 1] threads 1 8 python 0"), std::string::npos)
      << given.output;
}

TEST(LaunchCommandTest, MismatchesAreRefusedBeforeAnythingStarts) {
  const struct {
    const char* flags;
    const char* command;
    const char* message;
  } cases[] = {
      {"--nproc=3", "true",
       "--nproc=3 but the job has cluster.num_workers 2 x cluster.local_size 1 = 2 processes"},
      {"", "true", "a command after \"--\" needs --nproc >= 1 (got 0)"},
      {"--nproc=2", "no-such-program-here", "\"no-such-program-here\" is not a program on PATH"},
      {"--nproc=2", "/no/such/train.py",
       "\"/no/such/train.py\" cannot be executed: No such file or directory"},
      {"--nproc=2 --set=cluster.local_size=2", "true",
       "--nproc=2 but the job has cluster.num_workers 2 x cluster.local_size 2 = 4"},
  };
  for (const auto& c : cases) {
    const Result r = LaunchCommand(c.flags, c.command);
    EXPECT_EQ(r.exit_code, 2) << c.flags << " " << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("[server 0]"), std::string::npos) << r.output;
  }
}

}  // namespace
