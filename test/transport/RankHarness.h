//===- RankHarness.h - Run test ranks as forked processes -------*- C++ -*-===//
//
// Each rank is a child process on loopback; rank 0 inherits a listening
// socket bound to port 0, so concurrent tests never collide on ports. Ranks
// report through a shared anonymous mapping: an exit code, a message and a
// progress counter the parent can watch (e.g. to kill a rank mid-run).
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TEST_TRANSPORT_RANKHARNESS_H
#define MOE_TEST_TRANSPORT_RANKHARNESS_H

#include "TestProviders.h"
#include "moe_transport.h"

#include <atomic>
#include <functional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace moe::transport::testing {

constexpr int kMaxTestRanks = 16;

/// Written by the ranks, read by the parent.
struct Board {
  std::atomic<uint64_t> progress[kMaxTestRanks];
  std::atomic<int> infoPublished[kMaxTestRanks];
  moe_transport_peer_info_t infos[kMaxTestRanks];
  // For tests that order the ends of ranks: a rank sets finished[rank] and
  // waits for the parent to set release.
  std::atomic<int> finished[kMaxTestRanks];
  std::atomic<int> release;
  char messages[kMaxTestRanks][1024];
};

struct RankContext {
  int rank;
  int worldSize;
  int port;
  int listenFd; // rank 0 only, else -1
  Board *board;

  /// Records a message for the parent; returns code for `return fail(...)`.
  int fail(int code, const char *fmt, ...)
      __attribute__((format(printf, 3, 4)));
  /// Sets finished[rank] and waits (at most limitMs) for the parent's release.
  void finishAndWaitForRelease(int limitMs);
  /// Opens a transport for this rank and bootstraps it through rank 0.
  moe_transport_status_t open(const Provider &provider,
                              moe_transport_config_t config,
                              moe_transport_t **out);
};

struct RankOutcome {
  int exitCode = -1; // -1: killed by a signal or by the time limit
  int signal = 0;    // the signal that ended the rank, if one did
  bool timedOut = false;
  std::string message;
};

/// Exit code a rank uses for a failed data check (not a transport status).
constexpr int kCheckFailed = 100;

/// Forks `spawn` ranks of a world of `worldSize` running body, waits at most
/// limitMs (then kills what is left), and returns each rank's outcome.
/// whileRunning, if given, runs in the parent with the child pids.
std::vector<RankOutcome>
runRanks(int worldSize, int spawn, int limitMs,
         const std::function<int(RankContext &)> &body,
         const std::function<void(const std::vector<pid_t> &, Board &)>
             &whileRunning = {});

/// Bytes rank `source` sends rank `target` in iteration `iteration`.
uint8_t payloadByte(int source, int target, uint64_t iteration, uint64_t index);
/// Deterministic per-(iteration, source, target) size in [0, maxBytes]; about
/// one in eight is zero.
uint64_t payloadSize(uint64_t seed, uint64_t iteration, int source, int target,
                     uint64_t maxBytes);

} // namespace moe::transport::testing

#endif // MOE_TEST_TRANSPORT_RANKHARNESS_H
