//===- EpProcesses.cpp - expert-parallel ranks as local processes ---------===//

#include "tools/moe-exec/EpProcesses.h"
#include "tools/moe-exec/CpuRun.h"
#include "tools/moe-exec/GpuRun.h"
#include "tools/moe-exec/HostTensors.h"
#include "tools/moe-exec/LayerLibrary.h"
#include "tools/moe-exec/Options.h"

#include "moe_transport.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace moe::exec;

namespace {

/// What a rank tells the parent, in memory they share.
struct RankReport {
  int status; // 0: ran; 1: failed (message says why)
  double microseconds;
  char message[1000];
};

/// An anonymous mapping the ranks inherit: what they write there, the
/// parent sees.
class SharedMemory {
public:
  explicit SharedMemory(size_t bytes) : bytes(bytes) {
    void *mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mapping != MAP_FAILED)
      base = static_cast<uint8_t *>(mapping);
  }
  SharedMemory(const SharedMemory &) = delete;
  SharedMemory &operator=(const SharedMemory &) = delete;
  ~SharedMemory() {
    if (base)
      munmap(base, bytes);
  }

  /// Null when it could not be mapped.
  uint8_t *data() const { return base; }

private:
  size_t bytes;
  uint8_t *base = nullptr;
};

/// Where each rank's tokens and the shared memory's contents lie.
struct RankPlan {
  int64_t ranks = 0, tokens = 0;
  std::vector<int64_t> first;       // rank r: tokens [first[r], first[r+1])
  std::vector<size_t> rowBytes;     // per argument: bytes per token
  std::vector<size_t> outputOffset; // outputs: where they lie, whole
  size_t sharedBytes = 0;           // the reports, then the outputs
};

/// Rank r takes the r-th of `ranks` near-equal contiguous slices of the
/// tokens, the first `tokens` mod `ranks` ranks one more.
RankPlan planRanks(const std::vector<LayerArg> &args, int64_t tokens,
                   int64_t ranks) {
  RankPlan plan;
  plan.ranks = ranks;
  plan.tokens = tokens;
  plan.first.assign(ranks + 1, 0);
  for (int64_t r = 0; r < ranks; ++r)
    plan.first[r + 1] = plan.first[r] + tokens / ranks + (r < tokens % ranks);
  plan.rowBytes.assign(args.size(), 0);
  plan.outputOffset.assign(args.size(), 0);
  plan.sharedBytes = sizeof(RankReport) * size_t(ranks);
  for (size_t i = 0; i < args.size(); ++i) {
    size_t row = moe::rt::dtypeSize(args[i].dtype);
    for (size_t d = 1; d < args[i].shape.size(); ++d)
      row *= size_t(args[i].shape[d]);
    plan.rowBytes[i] = row;
    if (!args[i].isOutput)
      continue;
    plan.outputOffset[i] = plan.sharedBytes;
    plan.sharedBytes += (row * size_t(tokens) + 63) / 64 * 64;
  }
  return plan;
}

/// The ranks of one run, started by fork from this process.
class LocalRanks {
public:
  LocalRanks(const LayerLibrary &layer, const EpOptions &options, long repeat,
             HostTensors &tensors, const RankPlan &plan, uint8_t *shared)
      : layer(layer), options(options), repeat(repeat), tensors(tensors),
        plan(plan), shared(shared),
        reports(reinterpret_cast<RankReport *>(shared)) {}

  /// Starts every rank, rank 0 bootstrapping the others through
  /// `listenFd`, bound to `port`. Returns why one could not start (those
  /// started are killed), or "".
  std::string start(int listenFd, int port);

  /// Waits for every rank; returns a line for each that failed, or "".
  std::string wait();

  /// The slowest rank's mean time per run.
  double slowest() const;

  /// Copies the outputs the ranks wrote into `tensors` (sized here).
  void gatherOutputs();

private:
  std::vector<HostSpan> argsOf(int64_t rank) const;
  moe_ep_config_t configOf(int64_t rank, int listenFd, int port) const;
  [[noreturn]] void run(int64_t rank, int listenFd, int port);

  const LayerLibrary &layer;
  const EpOptions &options;
  long repeat;
  HostTensors &tensors;
  const RankPlan &plan;
  uint8_t *shared;
  RankReport *reports;
  std::vector<pid_t> pids;
};

/// Rank `rank`'s part of each argument: its tokens, its experts' slice of
/// the expert weights, the rest whole. Outputs point into shared memory.
std::vector<HostSpan> LocalRanks::argsOf(int64_t rank) const {
  const std::vector<LayerArg> &args = layer.info.args;
  int64_t mine = plan.first[rank + 1] - plan.first[rank];
  std::vector<HostSpan> spans;
  for (size_t i = 0; i < args.size(); ++i) {
    const LayerArg &arg = args[i];
    std::vector<uint8_t> &whole = tensors.storage[i];
    size_t offset = 0, bytes = 0;
    if (!arg.shape.empty() && arg.shape[0] < 0) {
      offset = size_t(plan.first[rank]) * plan.rowBytes[i];
      bytes = size_t(mine) * plan.rowBytes[i];
    } else if (isExpertWeight(arg.name)) {
      bytes = whole.size() / size_t(plan.ranks);
      offset = bytes * size_t(rank);
    } else {
      bytes = arg.isOutput ? 0 : whole.size();
    }
    uint8_t *base = arg.isOutput ? shared + plan.outputOffset[i] : whole.data();
    spans.push_back({base + offset, bytes});
  }
  return spans;
}

moe_ep_config_t LocalRanks::configOf(int64_t rank, int listenFd,
                                     int port) const {
  int64_t tokens = plan.tokens, ranks = plan.ranks;
  moe_ep_config_t config = {};
  config.rank = int32_t(rank);
  config.world_size = int32_t(ranks);
  config.bootstrap_host = "127.0.0.1";
  config.bootstrap_port = port;
  config.listen_fd = rank == 0 ? listenFd : -1;
  config.max_tokens = options.maxTokens >= 0
                          ? options.maxTokens
                          : tokens / ranks + (tokens % ranks != 0);
  // FI_PROVIDER, when set, is the user's choice; else shm between processes
  // of one host.
  config.provider = std::getenv("FI_PROVIDER") ? nullptr : "shm";
  config.domain = options.domain.empty() ? nullptr : options.domain.c_str();
  config.timeout_ms = int(options.timeoutMs);
  config.proxy = options.proxy ? 1 : 0;
  return config;
}

/// The rank's process: its part of the layer, then its report.
void LocalRanks::run(int64_t rank, int listenFd, int port) {
  if (rank != 0)
    close(listenFd);
  moe_ep_config_t config = configOf(rank, listenFd, port);
  int64_t mine = plan.first[rank + 1] - plan.first[rank];
  std::vector<HostSpan> args = argsOf(rank);
  double microseconds = 0;
  std::string why =
      layer.info.onGpu()
          ? runRankOnGpu(layer, args, mine, repeat, config, microseconds)
          : runOnCpu(layer, args, mine, repeat, &config, microseconds);
  RankReport &report = reports[rank];
  report.microseconds = microseconds;
  report.status = why.empty() ? 0 : 1;
  std::snprintf(report.message, sizeof report.message, "%s", why.c_str());
  _exit(report.status);
}

std::string LocalRanks::start(int listenFd, int port) {
  pids.assign(plan.ranks, -1);
  for (int64_t r = 0; r < plan.ranks; ++r) {
    reports[r].status = 1;
    std::snprintf(reports[r].message, sizeof reports[r].message,
                  "exited before it reported");
    pid_t pid = fork();
    if (pid < 0) {
      for (int64_t q = 0; q < r; ++q)
        kill(pids[q], SIGKILL);
      return "cannot start rank " + std::to_string(r);
    }
    if (pid == 0)
      run(r, listenFd, port);
    pids[r] = pid;
  }
  return "";
}

std::string LocalRanks::wait() {
  std::string failures;
  for (int64_t r = 0; r < plan.ranks; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    std::string line;
    if (WIFSIGNALED(status))
      line = "rank " + std::to_string(r) + " was killed by signal " +
             std::to_string(WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0 || reports[r].status != 0)
      line = "rank " + std::to_string(r) + ": " + reports[r].message;
    if (!line.empty())
      failures += (failures.empty() ? "" : "\n") + line;
  }
  return failures;
}

double LocalRanks::slowest() const {
  double slowest = 0;
  for (int64_t r = 0; r < plan.ranks; ++r)
    slowest = std::max(slowest, reports[r].microseconds);
  return slowest;
}

void LocalRanks::gatherOutputs() {
  const std::vector<LayerArg> &args = layer.info.args;
  allocateOutputs(args, tensors);
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].isOutput)
      std::memcpy(tensors.storage[i].data(), shared + plan.outputOffset[i],
                  std::min(tensors.storage[i].size(),
                           plan.rowBytes[i] * size_t(plan.tokens)));
}

} // namespace

std::string moe::exec::runExpertParallel(LayerLibrary &layer,
                                         const EpOptions &options, long repeat,
                                         HostTensors &tensors,
                                         double &microseconds) {
  std::string error;
  if (!findEpEntries(layer, error))
    return error;
  RankPlan plan =
      planRanks(layer.info.args, tensors.tokens, layer.info.ep.ranks);
  SharedMemory shared(plan.sharedBytes);
  if (!shared.data())
    return "cannot map " + std::to_string(plan.sharedBytes) +
           " bytes for the ranks' outputs";
  int listenFd = -1, port = 0;
  if (moe_transport_bootstrap_listen("127.0.0.1", 0, &listenFd, &port) !=
      MOE_TRANSPORT_OK)
    return std::string("cannot listen for the ranks' bootstrap: ") +
           moe_transport_last_error();
  LocalRanks ranks(layer, options, repeat, tensors, plan, shared.data());
  error = ranks.start(listenFd, port);
  if (!error.empty())
    return error;
  close(listenFd);
  error = ranks.wait();
  if (!error.empty())
    return error;
  microseconds = ranks.slowest();
  ranks.gatherOutputs();
  return "";
}
