//===- Proxy.cpp - The thread that drives the NIC -------------------------===//
//
// Consumes the command ring, posts RMA writes, reads the CQ and counts what
// lands per source rank. Writes may complete in any order (as on EFA), so
// nothing here relies on order: each arrival is counted from its immediate.
// A peer whose write fails, or that stays silent past the peer timeout
// (proxies heartbeat each other), is declared lost, which fails every wait.
// A peer that closes on purpose says goodbye first and is not.
//
//===----------------------------------------------------------------------===//
#include "CommandRing.h"
#include "Communicator.h"
#include "TestHooks.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

namespace moe::transport {

void (*proxyTurnHookForTesting)(int rank) = nullptr;

namespace {
constexpr size_t kCompletionBatch = 32;
/// How long close() lets in-flight writes finish before the endpoint goes,
/// and then again for the goodbyes.
constexpr auto kDrainTime = std::chrono::seconds(1);
/// How long close() then reads an idle completion queue (at most), and how
/// long it must stay empty.
constexpr auto kQuiesceTime = std::chrono::milliseconds(500);
constexpr auto kQuietEnough = std::chrono::milliseconds(20);
/// Commands issued per loop turn, so the CQ, heartbeats and peer checks are
/// not starved by a producer that keeps the ring full.
constexpr int kCommandsPerTurn = 64;
/// Batches read before a drain gives up (arrivals may never stop coming).
constexpr int kMaxDrainBatches = 256;
} // namespace

void Communicator::runProxy() {
  Clock::time_point idleSince = Clock::now();
  Clock::time_point lastPeerCheck = idleSince;
  auto checkInterval =
      std::chrono::milliseconds(std::max(peerTimeoutMs_ / 16, 1));
  // If this thread did not run for a long while (the process was stopped,
  // the host stalled), peers' heartbeats may sit unread in the provider: the
  // silence is ours. Every reading of the clock checks for such a gap, so
  // one in the middle of a turn is caught before silence is judged.
  auto gapAllowance = std::chrono::milliseconds(peerTimeoutMs_) / 2;
  Clock::time_point lastClock = idleSince;
  auto readClock = [&] {
    Clock::time_point now = Clock::now();
    if (now - lastClock > gapAllowance)
      std::fill(lastHeard_.begin(), lastHeard_.end(), now);
    lastClock = now;
    return now;
  };
  while (!stopProxy_.load(std::memory_order_acquire)) {
    if (proxyTurnHookForTesting)
      proxyTurnHookForTesting(rank_);
    Clock::time_point turn = readClock();
    proxyTickNs_.store(turn.time_since_epoch().count(),
                       std::memory_order_relaxed);
    bool busy = pollCompletions();
    // Heartbeats before commands: they may use the operations commands must
    // leave free, so a saturating producer cannot silence us.
    sendHeartbeats(turn);
    busy |= issueCommands();
    Clock::time_point now = readClock();
    // Judging silence a few times per timeout is enough; every turn would
    // add a CQ read (a round of provider progress) to the hot loop.
    if (now - lastPeerCheck >= checkInterval) {
      // Everything that arrived must be counted before silence is judged.
      bool drained = drainCompletions();
      busy |= !drained;
      if (drained) {
        checkPeers(now);
        lastPeerCheck = now;
      }
    }
    publishCompleted();
    if (busy)
      idleSince = now;
    else
      idlePause(now - idleSince);
  }
  drainAndSayGoodbye();
  proxyExited_.store(true, std::memory_order_release);
}

void Communicator::drainAndSayGoodbye() {
  // Let the last writes leave before the endpoint closes under them.
  Clock::time_point deadline = Clock::now() + kDrainTime;
  while (freeOperations_.size() != operations_.size() &&
         Clock::now() < deadline)
    if (!pollCompletions())
      idlePause(std::chrono::milliseconds(1));
  // Then tell every peer we leave on purpose: peers still waiting (say in a
  // final barrier) must not take our silence or closed endpoint for a death.
  // The goodbyes get their own time: writes to a dead peer may have used up
  // the drain's.
  deadline = Clock::now() + kDrainTime;
  std::vector<uint8_t> due(worldSize_, 0);
  for (int peer = 0; peer < worldSize_; ++peer)
    due[peer] = peer != rank_ && active(peer);
  for (;;) {
    bool pending = false;
    for (int peer = 0; peer < worldSize_; ++peer)
      if (due[peer] &&
          issueWrite(peer, controlRegion_, 0, 0, /*toControl=*/true, 0,
                     encodeImmediate(rank_, ImmediateKind::Goodbye, 0), 0))
        due[peer] = 0;
      else
        pending |= due[peer] != 0;
    pending |= freeOperations_.size() != operations_.size();
    if (!pending || Clock::now() >= deadline)
      break;
    if (!pollCompletions())
      idlePause(std::chrono::milliseconds(1));
  }
  // Quiesce: keep reading until the completion queue stays empty a while.
  // Progress is manual, so this is when the provider handles the events of
  // connections that broke (a dead peer's); closing the endpoint with them
  // still queued is what its teardown copes with worst.
  deadline = Clock::now() + kQuiesceTime;
  Clock::time_point quietSince = Clock::now();
  while (Clock::now() < deadline && Clock::now() - quietSince < kQuietEnough) {
    if (pollCompletions())
      quietSince = Clock::now();
    else
      idlePause(std::chrono::milliseconds(1));
  }
}

bool Communicator::drainCompletions() {
  for (int batch = 0; batch < kMaxDrainBatches; ++batch)
    if (!pollCompletions())
      return true;
  return false;
}

void Communicator::completeOperation(Operation *operation) {
  if (operation->sequence != 0) {
    auto entry = std::lower_bound(inFlight_.begin(), inFlight_.end(),
                                  operation->sequence,
                                  [](const InFlight &a, uint64_t sequence) {
                                    return a.sequence < sequence;
                                  });
    if (entry != inFlight_.end() && entry->sequence == operation->sequence &&
        entry->writes > 0)
      --entry->writes;
  }
  freeOperations_.push_back(operation);
}

void Communicator::publishCompleted() {
  // Completions arrive out of order: every command below the lowest one
  // still in flight (or still being issued) is done. This keeps flush()
  // progressing while the producer keeps the proxy busy.
  while (!inFlight_.empty() && inFlight_.front().writes == 0)
    inFlight_.pop_front();
  uint64_t lowest = commandsConsumed_ + 1;
  if (hasCurrent_)
    lowest = std::min(lowest, currentSequence_);
  if (!inFlight_.empty())
    lowest = std::min(lowest, inFlight_.front().sequence);
  commandsCompleted_.store(lowest - 1, std::memory_order_release);
}

bool Communicator::pollCompletions() {
  fi_cq_data_entry entries[kCompletionBatch];
  ssize_t count = fabric_.readCompletions(entries, kCompletionBatch);
  if (count == -FI_EAGAIN)
    return false;
  if (count == -FI_EAVAIL) {
    fi_cq_err_entry error;
    std::string text;
    if (!fabric_.readError(error, text))
      return false;
    auto *operation = static_cast<Operation *>(error.op_context);
    if (operation && !(error.flags & FI_REMOTE_WRITE)) {
      int peer = operation->peer;
      completeOperation(operation);
      // A peer that said goodbye may close before our last write lands.
      if (!departed_[peer].load(std::memory_order_relaxed))
        markLost(peer, "write failed: " + text);
    } else {
      fail(makeError(MOE_TRANSPORT_ERR_FABRIC, "rank %d: completion error: %s",
                     rank_, text.c_str()));
    }
    return true;
  }
  if (count < 0) {
    fail(makeError(MOE_TRANSPORT_ERR_FABRIC, "rank %d: fi_cq_read: %s", rank_,
                   fi_strerror(static_cast<int>(-count))));
    return false;
  }
  Clock::time_point now = Clock::now();
  for (ssize_t i = 0; i < count; ++i) {
    const fi_cq_data_entry &entry = entries[i];
    if (!(entry.flags & FI_REMOTE_WRITE)) {
      // Our own write completed. Only our operations carry a context; a
      // provider may report other local events without one.
      if (entry.op_context)
        completeOperation(static_cast<Operation *>(entry.op_context));
      continue;
    }
    // A peer's write landed here; every one of ours carries an immediate.
    uint32_t immediate = static_cast<uint32_t>(entry.data);
    uint32_t source = immediate >> 16;
    auto kind = static_cast<ImmediateKind>((immediate >> 12) & 0xf);
    uint32_t counter = immediate & 0xfff;
    if (!(entry.flags & FI_REMOTE_CQ_DATA) ||
        source >= static_cast<uint32_t>(worldSize_) ||
        (kind == ImmediateKind::Data &&
         counter >= MOE_TRANSPORT_NUM_COUNTERS)) {
      fail(makeError(MOE_TRANSPORT_ERR_FABRIC,
                     "rank %d: malformed immediate 0x%08x", rank_, immediate));
      continue;
    }
    lastHeard_[source] = now;
    if (kind == ImmediateKind::Data)
      arrivalCounter(source, counter).fetch_add(1, std::memory_order_release);
    else if (kind == ImmediateKind::Barrier)
      barriers_[source].fetch_add(1, std::memory_order_release);
    else if (kind == ImmediateKind::Goodbye)
      departed_[source].store(true, std::memory_order_relaxed);
  }
  return count > 0;
}

bool Communicator::issueCommands() {
  bool progressed = false;
  for (int issued = 0; issued < kCommandsPerTurn; ++issued) {
    if (!hasCurrent_) {
      if (!ringTryPop(ring_, current_))
        break;
      currentSequence_ = ++commandsConsumed_;
      progressed = true;
      // The producer may be a kernel writing slots directly: check again.
      if (Status status = validate(current_); status.failed()) {
        fail(status);
        continue;
      }
      hasCurrent_ = true;
      nextPart_ = 0;
    }
    if (!issueParts())
      break;
    hasCurrent_ = false;
  }
  return progressed;
}

bool Communicator::issueParts() {
  const moe_transport_command_t &command = current_;
  if (command.kind == MOE_TRANSPORT_CMD_BARRIER) {
    // A raw barrier: one empty write per peer, counted under its counter.
    for (; nextPart_ < worldSize_; ++nextPart_) {
      int peer = (rank_ + nextPart_) % worldSize_;
      if (peer == rank_) {
        arrivalCounter(peer, command.counter)
            .fetch_add(1, std::memory_order_release);
        continue;
      }
      if (!issueWrite(
              peer, controlRegion_, 0, 0, /*toControl=*/true, 0,
              encodeImmediate(rank_, ImmediateKind::Data, command.counter),
              currentSequence_))
        return false;
    }
    return true;
  }
  if (command.kind == kBarrierControl) {
    // One zero-length write per peer; our own arrival is counted here.
    for (; nextPart_ < worldSize_; ++nextPart_) {
      int peer = (rank_ + nextPart_) % worldSize_;
      if (peer == rank_) {
        barriers_[peer].fetch_add(1, std::memory_order_release);
        continue;
      }
      if (!issueWrite(peer, controlRegion_, 0, 0, /*toControl=*/true, 0,
                      encodeImmediate(rank_, ImmediateKind::Barrier, 0),
                      currentSequence_))
        return false;
    }
    return true;
  }
  int peer = static_cast<int>(command.peer);
  if (peer == rank_) {
    copyToSelf(command);
    return true;
  }
  bool control = command.kind == kWriteControl;
  return issueWrite(
      peer, control ? controlRegion_ : sendRegion_, command.src_offset,
      command.length, control, command.remote_offset,
      encodeImmediate(rank_, ImmediateKind::Data, command.counter),
      currentSequence_);
}

bool Communicator::issueWrite(int peer, const Region &source,
                              uint64_t srcOffset, uint64_t length,
                              bool toControl, uint64_t remoteOffset,
                              uint32_t immediate, uint64_t sequence) {
  // A lost peer has already failed the communicator, and one that said
  // goodbye no longer listens: drop their writes.
  if (!active(peer))
    return true;
  size_t keep = sequence != 0 ? reservedOperations_ : 0;
  if (freeOperations_.size() <= keep)
    return false;
  const moe_transport_peer_info_t &target = peers_[peer];
  uint64_t remoteAddress =
      (toControl ? target.control_base : target.recv_base) + remoteOffset;
  uint64_t key = toControl ? target.control_key : target.recv_key;
  Operation *operation = freeOperations_.back();
  operation->peer = peer;
  operation->sequence = sequence;
  // If the provider never returns (shm spins on a lock a dead peer held),
  // the producer's watchdog names this peer.
  proxyWritingTo_.store(peer, std::memory_order_relaxed);
  ssize_t result = fabric_.write(
      static_cast<uint8_t *>(source.base) + srcOffset, length, source.desc,
      peer, remoteAddress, key, immediate, &operation->context);
  proxyWritingTo_.store(-1, std::memory_order_relaxed);
  if (result == -FI_EAGAIN)
    return false;
  if (result != 0) {
    markLost(peer, format("posting a write failed: %s",
                          fi_strerror(static_cast<int>(-result))));
    return true;
  }
  freeOperations_.pop_back();
  if (sequence != 0) {
    if (inFlight_.empty() || inFlight_.back().sequence != sequence)
      inFlight_.push_back({sequence, 1});
    else
      ++inFlight_.back().writes;
  }
  return true;
}

void Communicator::copyToSelf(const moe_transport_command_t &command) {
  bool control = command.kind == kWriteControl;
  const Region &source = control ? controlRegion_ : sendRegion_;
  const Region &target = control ? controlRegion_ : recvRegion_;
  if (command.length != 0)
    memmove(static_cast<uint8_t *>(target.base) + command.remote_offset,
            static_cast<uint8_t *>(source.base) + command.src_offset,
            command.length);
  arrivalCounter(rank_, command.counter)
      .fetch_add(1, std::memory_order_release);
}

void Communicator::sendHeartbeats(Clock::time_point now) {
  auto interval = std::chrono::milliseconds(std::max(peerTimeoutMs_ / 8, 1));
  if (now - lastHeartbeat_ >= interval) {
    lastHeartbeat_ = now;
    for (int peer = 0; peer < worldSize_; ++peer)
      heartbeatDue_[peer] = peer != rank_;
  }
  // A beat the endpoint cannot take now stays due and is retried next turn.
  for (int peer = 0; peer < worldSize_; ++peer)
    if (heartbeatDue_[peer] &&
        issueWrite(peer, controlRegion_, 0, 0, /*toControl=*/true, 0,
                   encodeImmediate(rank_, ImmediateKind::Heartbeat, 0), 0))
      heartbeatDue_[peer] = 0;
}

void Communicator::checkPeers(Clock::time_point now) {
  auto timeout = std::chrono::milliseconds(peerTimeoutMs_);
  for (int peer = 0; peer < worldSize_; ++peer) {
    if (peer == rank_ || !active(peer) || now - lastHeard_[peer] <= timeout)
      continue;
    // A silent peer may be alive with its proxy stuck writing to one that
    // died (shm): when a process on this host is gone, that is the rank to
    // name.
    int dead = deadLocalPeer();
    if (dead >= 0 && dead != peer) {
      markLost(dead, format("its process (pid %u) is gone", peers_[dead].pid));
      return;
    }
    markLost(peer, format("nothing heard from it for %d ms (process died "
                          "or network down)",
                          peerTimeoutMs_));
  }
}

void Communicator::markLost(int peer, const std::string &why) {
  if (lost_[peer].exchange(true))
    return;
  fail(makeError(MOE_TRANSPORT_ERR_PEER_LOST, "rank %d lost peer rank %d: %s",
                 rank_, peer, why.c_str()));
}

} // namespace moe::transport
