//===- Communicator.h - One rank: buffers, fabric and proxy ----*- C++ -*-===//
//
// The producer side (the C API's caller; a kernel in production) posts
// commands and waits on counters. The proxy thread (Proxy.cpp) is the only
// user of the endpoint once it runs: it issues writes, reads the CQ, counts
// arrivals per source rank, sends heartbeats and declares silent peers lost.
// The two sides share only the ring and the atomics marked "shared".
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TRANSPORT_COMMUNICATOR_H
#define MOE_TRANSPORT_COMMUNICATOR_H

#include "Fabric.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace moe::transport {

using Clock = std::chrono::steady_clock;

/// Command kinds of the library's own; never accepted from callers: a write
/// to the control region, and the barrier of moe_transport_barrier (raw
/// MOE_TRANSPORT_CMD_BARRIER commands are counted apart, under their counter).
constexpr uint32_t kWriteControl = 0x100;
constexpr uint32_t kBarrierControl = 0x101;

/// How long a wait still expects writes from a peer that said goodbye: they
/// may arrive after its goodbye (nothing is ordered).
constexpr auto kGoodbyeGrace = std::chrono::milliseconds(500);

/// The 32-bit immediate: source rank, what the write means, and for data the
/// counter it is counted under. Goodbye: the source closes on purpose, so its
/// silence and its closed endpoint are not a failure.
enum class ImmediateKind : uint32_t {
  Data = 1,
  Barrier = 2,
  Heartbeat = 3,
  Goodbye = 4
};

inline uint32_t encodeImmediate(uint32_t source, ImmediateKind kind,
                                uint32_t counter) {
  return source << 16 | static_cast<uint32_t>(kind) << 12 | counter;
}

/// True if [offset, offset + length) lies inside [0, size), without overflow.
inline bool inBounds(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

/// Yields first, then sleeps longer the longer a poll loop has been idle,
/// so many ranks can share a few cores without a busy loop starving them.
void idlePause(Clock::duration idleFor);

class Communicator {
public:
  static Status open(const moe_transport_config_t &config,
                     std::unique_ptr<Communicator> &out);
  ~Communicator();
  /// Stops the proxy (it says goodbye to its peers first); false if it is
  /// stuck in a provider call that never returns (a peer died holding a
  /// lock). Then the thread is detached and still uses this object: the
  /// caller must leak it (moe_transport_close does).
  bool stopProxy();

  moe_transport_peer_info_t localInfo() const;
  Status connect(const moe_transport_peer_info_t *peers);
  Status bootstrap(const char *host, int port, int listenFd);

  // Producer side.
  Status post(const moe_transport_command_t &command, int timeoutMs);
  uint64_t arrivals(int peer, uint32_t counter) const;
  Status waitArrivals(int peer, uint32_t counter, uint64_t target,
                      int timeoutMs);
  Status flush(int timeoutMs);
  Status flushUntil(Clock::time_point deadline, int timeoutMs);
  Status barrier(int timeoutMs);
  Status allToAllV(const uint64_t *sendOffsets, const uint64_t *sendBytes,
                   uint64_t *recvOffsets, uint64_t *recvBytes, int timeoutMs);

  int rank() const { return rank_; }
  int worldSize() const { return worldSize_; }
  const Fabric &fabric() const { return fabric_; }
  void *sendBuffer() const { return sendRegion_.base; }
  void *recvBuffer() const { return recvRegion_.base; }
  moe_transport_ring_t *ring() { return &ring_; }

private:
  Communicator() = default;

  Status checkUsable() const;
  Status validate(const moe_transport_command_t &command) const;
  /// Validates and enqueues, waiting for ring space until deadline.
  Status enqueue(const moe_transport_command_t &command,
                 Clock::time_point deadline, int timeoutMs);
  Clock::time_point deadlineAfter(int timeoutMs) const;
  int effectiveTimeout(int timeoutMs) const {
    return timeoutMs < 0 ? timeoutMs_ : timeoutMs;
  }
  /// Polls ready() until it holds, the communicator fails, or the deadline;
  /// or until goneAwaited() has named, for kGoodbyeGrace, a peer that said
  /// goodbye while this wait still needs writes from it (-1: none).
  template <typename Ready, typename DescribeTimeout, typename GoneAwaited>
  Status waitFor(Clock::time_point deadline, Ready ready,
                 DescribeTimeout describeTimeout, GoneAwaited goneAwaited);
  template <typename Ready, typename DescribeTimeout>
  Status waitFor(Clock::time_point deadline, Ready ready,
                 DescribeTimeout describeTimeout) {
    return waitFor(deadline, ready, describeTimeout, [] { return -1; });
  }
  bool departed(int peer) const {
    return departed_[peer].load(std::memory_order_acquire);
  }
  /// Waits until every peer's arrivals under counter reach expected[peer].
  Status waitForAll(uint32_t counter, const std::vector<uint64_t> &expected,
                    Clock::time_point deadline, int timeoutMs,
                    const char *what);
  /// Records the first failure; later waits report it.
  void fail(const Status &status);
  /// Fails the communicator if the proxy has made no progress for the peer
  /// timeout, naming the peer it is stuck on or a local peer that is gone.
  void checkProxyAlive(Clock::time_point now);
  /// A peer on this host whose process no longer exists, or -1.
  int deadLocalPeer() const;
  Status failure() const;
  std::atomic<uint64_t> &arrivalCounter(int peer, uint32_t counter) const {
    return arrivals_[static_cast<size_t>(peer) * MOE_TRANSPORT_NUM_COUNTERS +
                     counter];
  }
  uint64_t *countsOut() const {
    return static_cast<uint64_t *>(controlRegion_.base);
  }
  /// A rank's row of the all-to-all count matrix: the bytes it sends each
  /// rank, then a word of flags (kRowRejected).
  size_t countsRowWords() const { return static_cast<size_t>(worldSize_) + 1; }
  static constexpr uint64_t kRowRejected = 1;
  uint64_t *countsIn() const { return countsOut() + countsRowWords(); }
  uint64_t countsInOffset(int source) const {
    return (countsRowWords() +
            static_cast<uint64_t>(source) * countsRowWords()) *
           sizeof(uint64_t);
  }
  size_t chunkCount(uint64_t bytes) const {
    return bytes == 0 ? 1 : (bytes + chunkBytes_ - 1) / chunkBytes_;
  }

  // Proxy thread (Proxy.cpp).
  struct Operation {
    fi_context2 context; // first: the provider hands back its address
    int peer;
    uint64_t sequence; // the command's (1-based), 0 for heartbeat or goodbye
  };
  /// Commands whose writes are in flight, in issue order.
  struct InFlight {
    uint64_t sequence;
    uint32_t writes;
  };
  void runProxy();
  /// Reads one batch of completions; false if the CQ was empty.
  bool pollCompletions();
  /// Reads completions until the CQ is empty; false if it never was.
  bool drainCompletions();
  void completeOperation(Operation *operation);
  /// Publishes to flush() every command below the lowest one in flight.
  void publishCompleted();
  bool issueCommands();
  bool issueParts();
  /// Posts one write; false if the endpoint is busy and it must be retried.
  /// sequence 0 (heartbeats, goodbyes) may use the operations kept back.
  bool issueWrite(int peer, const Region &source, uint64_t srcOffset,
                  uint64_t length, bool toControl, uint64_t remoteOffset,
                  uint32_t immediate, uint64_t sequence);
  void copyToSelf(const moe_transport_command_t &command);
  void sendHeartbeats(Clock::time_point now);
  void checkPeers(Clock::time_point now);
  /// After stopProxy(): lets in-flight writes finish and says goodbye.
  void drainAndSayGoodbye();
  void markLost(int peer, const std::string &why);
  /// Neither lost nor gone on purpose.
  bool active(int peer) const {
    return !lost_[peer].load(std::memory_order_relaxed) &&
           !departed_[peer].load(std::memory_order_relaxed);
  }

  // Configuration and resources.
  int rank_ = 0;
  int worldSize_ = 0;
  int timeoutMs_ = 0;
  int peerTimeoutMs_ = 0;
  uint64_t chunkBytes_ = 0;
  Fabric fabric_;
  Region sendRegion_, recvRegion_, controlRegion_;
  std::vector<void *> ownedBuffers_;
  std::vector<moe_transport_peer_info_t> peers_;
  std::vector<moe_transport_command_t> slots_;
  bool connected_ = false;

  // Shared between producer and proxy ("host-mapped").
  moe_transport_ring_t ring_ = {};
  std::atomic<uint64_t> commandsCompleted_{0};
  std::unique_ptr<std::atomic<uint64_t>[]> arrivals_;
  std::unique_ptr<std::atomic<uint64_t>[]> barriers_;
  std::unique_ptr<std::atomic<bool>[]> lost_;
  std::unique_ptr<std::atomic<bool>[]> departed_; // said goodbye
  std::atomic<int> failedCode_{MOE_TRANSPORT_OK};
  mutable std::mutex failureMutex_;
  Status failure_;
  std::atomic<bool> stopProxy_{false};
  std::atomic<bool> proxyExited_{false};
  bool proxyDetached_ = false;
  std::thread proxy_;
  // When the proxy last went round its loop, and whom it is calling into.
  std::atomic<int64_t> proxyTickNs_{0};
  std::atomic<int> proxyWritingTo_{-1};

  // Producer only.
  // The proxy tick the producer last saw change, when it saw that, and when
  // the producer last looked: the watchdog judges only what it watched.
  int64_t watchedTick_ = 0;
  Clock::time_point tickSeenAt_{}, lastWatch_{};
  uint64_t commandsPosted_ = 0;
  uint64_t barrierGeneration_ = 0;
  std::vector<uint64_t> expectedCounts_, expectedPayload_;

  // Proxy only.
  moe_transport_command_t current_ = {};
  bool hasCurrent_ = false;
  uint64_t currentSequence_ = 0;
  int nextPart_ = 0;
  uint64_t commandsConsumed_ = 0;
  std::vector<Operation> operations_;
  std::vector<Operation *> freeOperations_;
  /// Operations commands may not take, so heartbeats always find one.
  size_t reservedOperations_ = 0;
  std::deque<InFlight> inFlight_;
  std::vector<Clock::time_point> lastHeard_;
  std::vector<uint8_t> heartbeatDue_;
  Clock::time_point lastHeartbeat_;
};

template <typename Ready, typename DescribeTimeout, typename GoneAwaited>
Status Communicator::waitFor(Clock::time_point deadline, Ready ready,
                             DescribeTimeout describeTimeout,
                             GoneAwaited goneAwaited) {
  Clock::time_point start = Clock::now();
  int gone = -1;
  Clock::time_point goneSince{};
  for (;;) {
    // Success first: data that landed before a failure still counts.
    if (ready())
      return Status::ok();
    if (failedCode_.load(std::memory_order_acquire) != MOE_TRANSPORT_OK)
      return failure();
    Clock::time_point now = Clock::now();
    checkProxyAlive(now);
    int awaited = goneAwaited();
    if (awaited != gone) {
      gone = awaited;
      goneSince = now;
    } else if (gone >= 0 && now - goneSince >= kGoodbyeGrace) {
      return makeError(MOE_TRANSPORT_ERR_PEER_LOST,
                       "rank %d lost peer rank %d: it closed its communicator "
                       "while this rank still waited for it (%s)",
                       rank_, gone, describeTimeout().c_str());
    }
    if (now >= deadline)
      return Status::error(MOE_TRANSPORT_ERR_TIMEOUT, describeTimeout());
    idlePause(now - start);
  }
}

} // namespace moe::transport

#endif // MOE_TRANSPORT_COMMUNICATOR_H
