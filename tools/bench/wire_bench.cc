// cserps-bench-wire: how fast cserps' wire path is, against what this
// machine allows, measured in one run. For each case (S shards x M members,
// a payload of d floats, GRBS ratio R: 1 for a dense round) it starts S real
// cserps-server processes on 127.0.0.1, M member threads each with its own
// PsClient, and times PushPull rounds (PsClient::AverageBlocks on the MODEL
// stream, or with --grad the GRAD stream), over the servers' bulk transport
// or, with --transport=GRPC, over gRPC (with --certs, either with mutual TLS
// and the job's token). Taking turns with those rounds, with the same shape
// (M members each splitting the round's payload over S peers, in parallel),
// it times a raw TCP exchange and plain gRPC unary calls of the same bytes
// (tools/bench/wire_limits.h), and one thread's memcpy of a member's
// payload, and prints the ratios.
//
// Per case: p50/p99 round latency (every member's rounds), payload GB/s per
// member and in all (2 x selected payload / round: push and pull), server and
// client CPU seconds per GB moved (servers: /proc of their processes;
// client: this process), the bytes PsClient sent and received against the payload
// (selected floats x 4), the balance of the shards' bytes (max over mean),
// the limits' GB/s with cserps' share of them, how busy the machine's CPUs
// were over cserps' rounds and over the raw TCP exchange's, and the slowest
// of cserps' warm-up rounds (a fresh server's first). The gTop-k cases time
// gtopk-ssgd's sparse exchange (PsClient::ExchangeSparse: each member's k
// entries of index and value, the shard's k back). Built a second time as
// cserps-bench-scale, whose defaults are many members against 1 to 8 shards.
// With --async the dense cases time async-sgd's AsyncPushPull instead (each
// member pushes a gradient of the whole model and gets the updated model
// back, with no round to wait for).
//
// With --placement=split or shared the bench pins its threads: on a
// machine whose cross-CPU wake-ups are dear (a 2-vCPU VM: the raw TCP
// exchange of 16 KiB takes 40 us across its CPUs, 19 us on one), an
// unpinned case measures where the scheduler happened to put each pair of
// threads as much as the exchange, and the limits' pairs may land
// otherwise than cserps'.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/algorithm_catalog.h"
#include "common/config_load.h"
#include "common/lock_order_checks.h"
#include "common/status.h"
#include "tools/bench/wire_limits.h"
#include "tools/cluster/child_process.h"
#include "tools/cluster/server_processes.h"
#include "worker/ps/ps_client.h"

#ifdef CSERPS_BENCH_SCALE
// cserps-bench-scale: the same measurements for many members (threads with
// synthetic values, no model) against 1 to 8 shards.
ABSL_FLAG(std::string, sizes, "1048576", "Dense payloads per member, in bytes.");
ABSL_FLAG(std::string, layouts, "1x2,1x16,1x64,2x64,4x64,8x64", "Shards x members.");
ABSL_FLAG(std::string, grbs_ratios, "256",
          "GRBS ratios R of the sparse cases (1/R of the blocks per round).");
#else
ABSL_FLAG(std::string, sizes, "65536,1048576,4194304,16777216,67108864",
          "Dense payloads per member, in bytes.");
ABSL_FLAG(std::string, layouts, "1x1,2x2,4x4", "Shards x members.");
ABSL_FLAG(std::string, grbs_ratios, "32,256,1024",
          "GRBS ratios R of the sparse cases (1/R of the blocks per round).");
#endif
ABSL_FLAG(std::string, topk_ratios, "",
          "Densities 1/K of the gTop-k cases (gtopk-ssgd's sparse exchange); none by "
          "default.");
ABSL_FLAG(int64_t, grbs_bytes, 4 << 20, "Model size of the GRBS and gTop-k cases, in bytes.");
ABSL_FLAG(int, block_size, 1024, "algorithm.block_size (floats).");
ABSL_FLAG(double, seconds, 2.0, "Measured time per case, about (5 rounds at least).");
ABSL_FLAG(int, max_rounds, 200, "Measured rounds per case at most.");
ABSL_FLAG(int, slices, 4,
          "Slices per case: cserps' rounds and the limits' take turns this many times.");
ABSL_FLAG(std::string, server, "", "The cserps-server binary; default: beside this one.");
ABSL_FLAG(std::string, transport, "AUTO",
          "cluster.transport of the members: AUTO (the servers' bulk transport) or GRPC.");
ABSL_FLAG(std::string, certs, "",
          "A directory made by tools/make_certs.sh: servers and members then use mutual TLS "
          "and the job's token, on either transport; the limits stay plaintext.");
ABSL_FLAG(bool, grad, false,
          "Dense rounds of the GRAD stream, as S-SGD's (the shard applies x -= lr * mean), "
          "instead of MODEL (x = mean); the GRBS rounds stay on MODEL, the only stream the "
          "bench's job (cser-pl) takes them on.");
ABSL_FLAG(bool, async, false,
          "Dense cases of async-sgd's AsyncPushPull (push a gradient, pull the updated model, "
          "no round) instead of PushPull rounds.");
ABSL_FLAG(double, momentum, 0.0,
          "optimizer.momentum (Nesterov) of the job; 0: none. Only the shards of the gTop-k "
          "cases (on every float of the shard, each round) and of --async apply it.");
ABSL_FLAG(std::string, placement, "free",
          "Where the threads run: free (unpinned); split (the members' threads, cserps' and "
          "the limits', on the first CPU; the servers, the raw TCP peers and the gRPC "
          "limit's threads, which serve both its ends, on the last); shared (all on the "
          "first CPU).");
ABSL_FLAG(int64_t, chunk_bytes, 0, "cluster.chunk_bytes; 0: the default.");
ABSL_FLAG(int64_t, max_message_bytes, 0,
          "cluster.max_message_bytes (the chunk size follows it); 0: the default.");

namespace cserps {
namespace {

// cserps' rounds before a case is measured: fresh servers' first rounds
// are slow while their pools fill (64 MiB rounds: 4 to 8 of them at
// 250-900 ms on the development VM, against 50-90 ms after), and the
// warm-up column reports them apart.
constexpr int kWarmupRounds = 10;
// The limits' rounds before each slice's: their connections stay open, and
// their buffers made, from slice to slice.
constexpr int kLimitWarmupRounds = 3;

// The CPUs of --placement; -1: any.
struct Placement {
  int members = -1;
  int peers = -1;  // the servers' and the limits' peers'
};

absl::StatusOr<Placement> ParsePlacement(absl::string_view name) {
  if (name == "free") return Placement{};
  if (name == "shared") return Placement{0, 0};
  if (name == "split") {
    const int cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    if (cpus < 2) {
      return absl::InvalidArgumentError("--placement=split needs two CPUs; this machine has one");
    }
    return Placement{0, cpus - 1};
  }
  return absl::InvalidArgumentError(absl::StrCat("--placement: \"", name,
                                                 "\" is not free, split or shared"));
}

// Binds the calling thread, and so the threads and processes it starts, to
// `cpu`; -1 leaves it as it is.
absl::Status PinTo(int cpu) {
  if (cpu < 0) return absl::OkStatus();
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("pinning to CPU ", cpu, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

struct Case {
  int shards = 1;
  int members = 1;
  uint64_t bytes = 0;  // the model's, d x 4
  uint32_t ratio = 1;  // 1: dense; with gtopk the density's 1/ratio
  v1::Stream stream = v1::MODEL;  // dense rounds: GRAD with --grad
  float lr = 0.0f;
  bool gtopk = false;  // gtopk-ssgd's sparse exchange
  bool async = false;  // async-sgd's AsyncPushPull (dense)
};

std::string Bytes(uint64_t b) {
  if (b >= (1 << 20)) return absl::StrCat(b >> 20, " MiB");
  return absl::StrCat(b >> 10, " KiB");
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

double Percentile(std::vector<absl::Duration> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return Seconds(v[i]);
}

double MeanSeconds(const std::vector<absl::Duration>& v) {
  absl::Duration total;
  for (absl::Duration d : v) total += d;
  return Seconds(total) / v.size();
}

// The machine's CPU time, all CPUs together, from /proc/stat (clock
// ticks): busy counts user, system and interrupt time, total adds idle,
// I/O wait and what the hypervisor took (steal).
struct MachineCpu {
  double busy = 0, total = 0;

  static MachineCpu Now() {
    std::ifstream in("/proc/stat");
    std::string cpu;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
           steal = 0;
    in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
    MachineCpu now;
    now.busy = user + nice + system + irq + softirq;
    now.total = now.busy + idle + iowait + steal;
    return now;
  }
  MachineCpu& operator+=(const MachineCpu& o) {
    busy += o.busy;
    total += o.total;
    return *this;
  }
  MachineCpu operator-(const MachineCpu& o) const { return {busy - o.busy, total - o.total}; }
  double BusyShare() const { return total > 0 ? busy / total : 0; }
};

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// The job's security files with `who`'s certificate ("server" or
// "client"); none without --certs.
v1::SecurityConfig SecurityFiles(const std::string& who) {
  v1::SecurityConfig security;
  const std::string dir = absl::GetFlag(FLAGS_certs);
  if (dir.empty()) return security;
  const std::filesystem::path d(dir);
  security.set_ca_cert((d / "ca.pem").string());
  security.set_cert((d / (who + ".pem")).string());
  security.set_key((d / (who + ".key")).string());
  security.set_token_file((d / "token").string());
  return security;
}

std::string JobText(const Case& c, int block_size) {
  std::string servers;
  for (int s = 0; s < c.shards; ++s) absl::StrAppend(&servers, " servers: \"127.0.0.1:0\"");
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  const double momentum = absl::GetFlag(FLAGS_momentum);
  return absl::StrCat("name: \"wire-bench\"\ncluster {", servers, " num_workers: ", c.members,
                      " round_timeout_s: 60 max_step_lag: 100000",
                      max_message > 0 ? absl::StrCat(" max_message_bytes: ", max_message) : "",
                      absl::GetFlag(FLAGS_chunk_bytes) > 0
                          ? absl::StrCat(" chunk_bytes: ", absl::GetFlag(FLAGS_chunk_bytes))
                          : "",
                      " transport: ", absl::GetFlag(FLAGS_transport), " }\n",
                      "model { kind: FLAT num_params: ", c.bytes / 4, " }\n",
                      "data { batch_size: 1 }\nepochs: 1\noptimizer { lr: 0.1",
                      momentum > 0 ? absl::StrCat(" momentum_kind: NESTEROV momentum: ", momentum)
                                   : "",
                      " }\n",
                      // An algorithm whose rounds are the case's: every one
                      // may average the whole model (its final average).
                      c.gtopk        ? absl::StrCat("algorithm { name: \"gtopk-ssgd\" "
                                                    "density: ", 1.0 / c.ratio)
                      : c.async      ? "algorithm { name: \"async-sgd\""
                      : c.ratio == 1 ? "algorithm { name: \"ssgd\""
                                     : absl::StrCat("algorithm { name: \"cser-pl\" period: 1 "
                                                    "ratio_c1: ", c.ratio),
                      " block_size: ", block_size, " }\n", "security {",
                      SecurityFiles("server").ShortDebugString(), "}\n");
}

struct Measured {
  std::vector<absl::Duration> rounds;  // every member's
  double selected_bytes = 0;           // per member per round, both ways together
  double wire_bytes = 0;               // serialised, per member per round
  double server_cpu = 0;               // seconds over the measured rounds
  double client_cpu = 0;
  MachineCpu machine;                  // over the measured rounds
  double slowest_warmup = 0;           // seconds
  int count = 0;                       // measured rounds
  double balance = 0;                  // max / mean of the shards' bytes
};

// A member's client, model and mean (gTop-k: its entries and the round's);
// the buffers live as long as the case, so that no slice's client CPU counts
// the page faults of making them.
struct Member {
  std::unique_ptr<PsClient> client;
  std::vector<float> values, mean;
  SparseVector local, global;
};

// Member `m`'s gTop-k entries: each shard's k_s indices, drawn at random
// from the shard's floats (members' draws overlap as chance has it), with
// values that make the shard's choice depend on every member.
SparseVector LocalEntries(const BlockLayout& layout, const v1::AlgorithmConfig& algorithm,
                          int m) {
  const uint64_t d = layout.num_params();
  const uint64_t k = SparseK(algorithm, d);
  std::mt19937_64 prng(1000 + m);
  SparseVector local;
  for (uint32_t s = 0; s < layout.num_shards(); ++s) {
    std::vector<uint32_t> all(layout.ShardSize(s));
    std::iota(all.begin(), all.end(), static_cast<uint32_t>(layout.ShardFirstFloat(s)));
    std::sample(all.begin(), all.end(), std::back_inserter(local.indices),
                ShardSparseK(k, layout.ShardSize(s), d), prng);
  }
  for (uint32_t index : local.indices) local.values.push_back(0.5f + (index * 7919u + m) % 1000);
  return local;
}

// Every member's rounds [first, first + count) on its own thread.
absl::Status RunRounds(std::vector<Member>& members, const Case& c, uint64_t first, int count,
                       std::vector<absl::Duration>* times) {
  std::vector<absl::Status> status(members.size());
  std::vector<std::vector<absl::Duration>> per(members.size());
  std::vector<std::thread> threads;
  for (size_t m = 0; m < members.size(); ++m) {
    threads.emplace_back([&, m] {
      Member& member = members[m];
      for (int r = 0; r < count && status[m].ok(); ++r) {
        const absl::Time start = absl::Now();
        status[m] = c.gtopk ? member.client->ExchangeSparse(first + r, member.local,
                                                            &member.global)
                    : c.async ? member.client->AsyncPushPull(first + r, c.lr, member.values,
                                                             absl::MakeSpan(member.mean))
                              : member.client->AverageBlocks(c.stream, first + r, c.ratio,
                                                             member.values, 1.0f, c.lr,
                                                             absl::MakeSpan(member.mean));
        per[m].push_back(absl::Now() - start);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t m = 0; m < members.size(); ++m) {
    RETURN_IF_ERROR(status[m]);
    if (times != nullptr) times->insert(times->end(), per[m].begin(), per[m].end());
  }
  return absl::OkStatus();
}

// The limits' round times, and their connections, open across a case.
struct Limits {
  std::unique_ptr<LimitExchange> tcp_exchange, grpc_exchange;
  std::vector<absl::Duration> tcp, grpc;
  // The raw TCP exchange's rounds, warm-up ones too, and the CPU seconds
  // both its ends took for them (they live in this process).
  int tcp_rounds = 0;
  double tcp_cpu = 0;
  MachineCpu tcp_machine;
};

// Times the case's rounds in --slices slices, and after each the limits'
// rounds, as many and of the slice's bytes: a drift of this machine's speed
// reaches cserps and its limits alike.
absl::StatusOr<Measured> MeasureCserps(const Case& c, const std::string& server,
                                       const Placement& placement, Limits* limits) {
  // What starts here (the limits' peers, gRPC's threads, the servers) runs
  // on the peers' CPU; the members' threads, started later, on theirs.
  RETURN_IF_ERROR(PinTo(placement.peers));
  ASSIGN_OR_RETURN(limits->tcp_exchange, OpenRawTcp(c.shards, c.members));
  ASSIGN_OR_RETURN(limits->grpc_exchange, OpenPlainGrpc(c.shards, c.members));
  const std::string path =
      (std::filesystem::temp_directory_path() / absl::StrCat("cserps-bench-wire-", getpid(),
                                                            ".textproto"))
          .string();
  {
    std::ofstream out(path);
    out << JobText(c, absl::GetFlag(FLAGS_block_size));
  }
  absl::Cleanup remove_job = [&path] { std::filesystem::remove(path); };
  ASSIGN_OR_RETURN(std::unique_ptr<ServerProcesses> servers,
                   ServerProcesses::Start(server, path, c.shards));
  ASSIGN_OR_RETURN(v1::JobConfig config,
                   LoadJobWithOverrides(path, {absl::StrCat(
                                                  "cluster.servers=",
                                                  absl::StrJoin(servers->addresses(), ","))}));
  std::move(remove_job).Invoke();
  RETURN_IF_ERROR(PinTo(placement.members));
  *config.mutable_security() = SecurityFiles("client");
  const uint64_t d = c.bytes / 4;
  std::vector<Member> members;
  for (int m = 0; m < c.members; ++m) {
    ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Connect(config, d));
    RETURN_IF_ERROR(client->Register(m, absl::StrCat("bench-", m)).status());
    Member member;
    member.client = std::move(client);
    if (c.gtopk) {
      member.local = LocalEntries(member.client->layout(), config.algorithm(), m);
    } else {
      member.values.assign(d, 1.0f + m);
      member.mean.assign(d, 0.0f);
    }
    members.push_back(std::move(member));
  }
  // Asynchronous pushes apply to a model rank 0 has set.
  if (c.async) RETURN_IF_ERROR(members[0].client->PushModel(members[0].mean));
  // What a round moved: gTop-k's entries are an index and a value each.
  auto traffic = [&c](const PsClient& client) {
    return c.gtopk   ? client.sparse_traffic()
           : c.async ? client.async_traffic()
                     : client.traffic(c.stream);
  };
  const int entry_bytes = c.gtopk ? 8 : 4;
  Measured result;
  std::vector<absl::Duration> warmup;
  RETURN_IF_ERROR(RunRounds(members, c, 0, kWarmupRounds, &warmup));
  const double per_round = Percentile(warmup, 0.5);
  result.slowest_warmup = Seconds(*std::max_element(warmup.begin(), warmup.end()));
  const int max_rounds = absl::GetFlag(FLAGS_max_rounds);
  result.count = std::clamp(static_cast<int>(absl::GetFlag(FLAGS_seconds) / per_round),
                            std::min(5, max_rounds), max_rounds);
  const int slices = std::clamp(absl::GetFlag(FLAGS_slices), 1, result.count);
  const TrafficCounts before = traffic(*members[0].client);
  uint64_t done = 0;
  for (int slice = 0; slice < slices; ++slice) {
    const int count = result.count / slices + (slice < result.count % slices ? 1 : 0);
    const TrafficCounts slice_before = traffic(*members[0].client);
    const double server_before = servers->CpuSeconds();
    const double client_before = SelfCpuSeconds();
    const MachineCpu machine_before = MachineCpu::Now();
    RETURN_IF_ERROR(RunRounds(members, c, kWarmupRounds + done, count, &result.rounds));
    result.machine += MachineCpu::Now() - machine_before;
    result.server_cpu += servers->CpuSeconds() - server_before;
    result.client_cpu += SelfCpuSeconds() - client_before;
    done += count;
    // A round's reply carries as many floats (entries) as its request.
    const size_t payload = entry_bytes *
                           (traffic(*members[0].client).request_floats -
                            slice_before.request_floats) /
                           count;
    // As many rounds as cserps': a small payload's limit over a few rounds
    // moves by 3x.
    const double tcp_before = SelfCpuSeconds();
    const MachineCpu tcp_machine_before = MachineCpu::Now();
    ASSIGN_OR_RETURN(std::vector<absl::Duration> tcp,
                     limits->tcp_exchange->Rounds(payload, kLimitWarmupRounds, count));
    limits->tcp_machine += MachineCpu::Now() - tcp_machine_before;
    limits->tcp_cpu += SelfCpuSeconds() - tcp_before;
    limits->tcp_rounds += kLimitWarmupRounds + count;
    ASSIGN_OR_RETURN(std::vector<absl::Duration> grpc,
                     limits->grpc_exchange->Rounds(payload, kLimitWarmupRounds, count));
    limits->tcp.insert(limits->tcp.end(), tcp.begin(), tcp.end());
    limits->grpc.insert(limits->grpc.end(), grpc.begin(), grpc.end());
  }
  const TrafficCounts after = traffic(*members[0].client);
  // Every byte each shard received and sent during the case (its servers'
  // cserps_server_bytes_in_total and _out_total).
  double most = 0, total = 0;
  for (int s = 0; s < c.shards; ++s) {
    ASSIGN_OR_RETURN(const v1::GetStatusResponse status, members[0].client->GetStatus(s));
    const double bytes = static_cast<double>(status.bytes_in() + status.bytes_out());
    most = std::max(most, bytes);
    total += bytes;
  }
  result.balance = total > 0 ? most / (total / c.shards) : 0;
  result.selected_bytes =
      2.0 * entry_bytes * (after.request_floats - before.request_floats) / result.count;
  result.wire_bytes = static_cast<double>(after.request_bytes - before.request_bytes +
                                          after.reply_bytes - before.reply_bytes) /
                      result.count;
  return result;
}

absl::Status RunCase(const Case& c, const std::string& server, const Placement& placement) {
  Limits limits;
  ASSIGN_OR_RETURN(const Measured m, MeasureCserps(c, server, placement, &limits));
  const double p50 = Percentile(m.rounds, 0.5);
  const double per_member = m.selected_bytes / p50 / 1e9;
  const double moved_gb = m.selected_bytes * c.members * m.count / 1e9;
  const double tcp_moved_gb = m.selected_bytes * c.members * limits.tcp_rounds / 1e9;
  const double tcp_rate = m.selected_bytes / Percentile(limits.tcp, 0.5) / 1e9;
  const double grpc_rate = m.selected_bytes / Percentile(limits.grpc, 0.5) / 1e9;
  // One member's payload copied once by one thread.
  const size_t payload = static_cast<size_t>(m.selected_bytes / 2);
  const double memcpy_rate = payload / Seconds(MemcpyTime(payload, 10)) / 1e9;
  std::printf(
      "%dx%d %8s %c=%-5u %8.3f %8.3f %8.3f %8.3f %7.3f %7.3f %7.3f %7.4f %7.3f %8.3f %8.3f %6.2f "
      "%6.2f %6.2f %8.3f %6.3f %5.0f%% %5.0f%% %8.3f\n",
      c.shards, c.members, Bytes(c.bytes).c_str(), c.gtopk ? 'K' : 'R', c.ratio, 1e3 * p50,
      1e3 * Percentile(m.rounds, 0.99), per_member, per_member * c.members,
      m.server_cpu / moved_gb, m.client_cpu / moved_gb, limits.tcp_cpu / tcp_moved_gb,
      m.wire_bytes / m.selected_bytes, m.balance, tcp_rate, grpc_rate, per_member / tcp_rate,
      MeanSeconds(limits.tcp) / MeanSeconds(m.rounds), per_member / grpc_rate, memcpy_rate,
      per_member / memcpy_rate, 100 * m.machine.BusyShare(),
      100 * limits.tcp_machine.BusyShare(), 1e3 * m.slowest_warmup);
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> Numbers(const std::string& flag, const std::string& text) {
  std::vector<uint64_t> out;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(piece, &v) || v == 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", piece,
                                                     "\" is not a positive integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::Status Run() {
  std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) {
    server = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "cserps-server")
                 .string();
  }
  ASSIGN_OR_RETURN(const std::vector<uint64_t> sizes, Numbers("sizes", absl::GetFlag(FLAGS_sizes)));
  ASSIGN_OR_RETURN(const std::vector<uint64_t> ratios,
                   Numbers("grbs_ratios", absl::GetFlag(FLAGS_grbs_ratios)));
  ASSIGN_OR_RETURN(const std::vector<uint64_t> topk_ratios,
                   Numbers("topk_ratios", absl::GetFlag(FLAGS_topk_ratios)));
  std::vector<std::pair<int, int>> layouts;
  for (absl::string_view piece :
       absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> sm = absl::StrSplit(piece, 'x');
    int s = 0, m = 0;
    if (!absl::SimpleAtoi(sm.first, &s) || !absl::SimpleAtoi(sm.second, &m) || s < 1 || m < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--layouts: \"", piece, "\" is not SHARDSxMEMBERS"));
    }
    layouts.emplace_back(s, m);
  }
  ASSIGN_OR_RETURN(const Placement placement, ParsePlacement(absl::GetFlag(FLAGS_placement)));
  if (absl::GetFlag(FLAGS_max_rounds) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_rounds=", absl::GetFlag(FLAGS_max_rounds), " measures no round"));
  }
  const absl::Duration copy = MemcpyTime(64 << 20, 10);
  std::printf("memcpy of 64 MiB: %.3f GB/s (one thread)\n", (64 << 20) / Seconds(copy) / 1e9);
  if (const std::string dir = absl::GetFlag(FLAGS_certs); !dir.empty()) {
    std::printf("cserps rounds: mutual TLS and the job's token (%s)\n", dir.c_str());
  }
  if (placement.members >= 0) {
    std::printf("placement: members on CPU %d; servers, raw TCP peers and gRPC's threads on CPU "
                "%d\n",
                placement.members, placement.peers);
  }
  std::printf("R: GRBS ratio (1: dense); K: gTop-k at density 1/K, 8 bytes an entry\n");
  if (absl::GetFlag(FLAGS_async)) {
    std::printf("dense cases: async-sgd's AsyncPushPull (gradient pushed, model pulled)\n");
  }
  std::printf(
      "GB/s: 2 x selected payload per round (push and pull); CPU in s per GB moved (all "
      "members; tcp: both ends of the raw TCP exchange); wire: serialised bytes / payload "
      "bytes; shards: max / mean of the shards' bytes; x tcp, x grpc, x mcpy: cserps' GB/s per "
      "member over the limit's; x tcp~: the same from mean rounds, not p50; mcpy: one thread "
      "copying one member's payload; busy, tcp b: the machine's CPUs busy (user, system, "
      "interrupts; /proc/stat) over cserps' rounds and the raw TCP exchange's; warm-up ms: "
      "the slowest of cserps' unmeasured first rounds\n");
  std::printf(
      "%-3s %8s %-7s %8s %8s %8s %8s %7s %7s %7s %7s %7s %8s %8s %6s %6s %6s %8s %6s %6s %6s "
      "%8s\n",
      "SxM", "model", "ratio", "p50 ms", "p99 ms", "GB/s/m", "GB/s", "srv s/G", "cli s/G",
      "tcp s/G", "wire", "shards", "tcp GB/s", "grpc", "x tcp", "x tcp~", "x grpc", "mcpy",
      "x mcpy", "busy", "tcp b", "warm-up");
  const bool grad = absl::GetFlag(FLAGS_grad);
  const bool async = absl::GetFlag(FLAGS_async);
  const v1::Stream stream = grad ? v1::GRAD : v1::MODEL;
  const float lr = grad || async ? 1e-3f : 0.0f;
  const uint64_t grbs_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_grbs_bytes));
  for (const auto& [s, m] : layouts) {
    for (uint64_t bytes : sizes) {
      RETURN_IF_ERROR(RunCase(
          {.shards = s, .members = m, .bytes = bytes, .stream = stream, .lr = lr, .async = async},
          server, placement));
    }
    for (uint64_t r : ratios) {
      RETURN_IF_ERROR(RunCase({s, m, grbs_bytes, static_cast<uint32_t>(r)}, server, placement));
    }
    for (uint64_t r : topk_ratios) {
      RETURN_IF_ERROR(RunCase(
          {.shards = s, .members = m, .bytes = grbs_bytes, .ratio = static_cast<uint32_t>(r),
           .gtopk = true},
          server, placement));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace cserps

int main(int argc, char** argv) {
  cserps::SkipLockOrderChecksWithNdebug();
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = cserps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "cserps-bench-wire: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
