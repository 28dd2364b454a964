//===- Proxy.cpp - The thread that drives the NIC -------------------------===//
//
// Consumes the command ring, posts RMA writes, reads the CQ and counts what
// lands per source rank. Writes may complete in any order (as on EFA), so
// nothing here relies on order: each arrival is counted from its immediate.
// A peer whose write fails, or that stays silent past the peer timeout
// (proxies heartbeat each other), is declared lost, which fails every wait.
//
//===----------------------------------------------------------------------===//
#include "CommandRing.h"
#include "Communicator.h"

#include <rdma/fi_errno.h>

#include <cstring>

namespace moe::transport {

namespace {
constexpr size_t kCompletionBatch = 32;
/// How long close() lets in-flight writes finish before the endpoint goes.
constexpr auto kDrainTime = std::chrono::seconds(1);
} // namespace

void Communicator::runProxy() {
  Clock::time_point idleSince = Clock::now();
  while (!stopProxy_.load(std::memory_order_acquire)) {
    proxyTickNs_.store(Clock::now().time_since_epoch().count(),
                       std::memory_order_relaxed);
    bool busy = pollCompletions();
    busy |= issueCommands();
    Clock::time_point now = Clock::now();
    sendHeartbeats(now);
    checkPeers(now);
    // Completions arrive out of order, so publish the prefix only when
    // nothing is in flight; the producer waits on this only at sync points.
    if (!hasCurrent_ && freeOperations_.size() == operations_.size())
      commandsCompleted_.store(commandsConsumed_, std::memory_order_release);
    if (busy)
      idleSince = now;
    else
      idlePause(now - idleSince);
  }
  // Let the last writes leave before the endpoint closes under them.
  Clock::time_point deadline = Clock::now() + kDrainTime;
  while (freeOperations_.size() != operations_.size() &&
         Clock::now() < deadline)
    if (!pollCompletions())
      idlePause(std::chrono::milliseconds(1));
  proxyExited_.store(true, std::memory_order_release);
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
      freeOperations_.push_back(operation);
      markLost(operation->peer, "write failed: " + text);
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
    if (!(entry.flags & FI_REMOTE_CQ_DATA)) {
      freeOperations_.push_back(static_cast<Operation *>(entry.op_context));
      continue;
    }
    uint32_t immediate = static_cast<uint32_t>(entry.data);
    uint32_t source = immediate >> 16;
    auto kind = static_cast<ImmediateKind>((immediate >> 12) & 0xf);
    uint32_t counter = immediate & 0xfff;
    if (source >= static_cast<uint32_t>(worldSize_) ||
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
  }
  return count > 0;
}

bool Communicator::issueCommands() {
  bool progressed = false;
  for (;;) {
    if (!hasCurrent_) {
      if (!ringTryPop(ring_, current_))
        break;
      ++commandsConsumed_;
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
    // One zero-length write per peer; our own arrival is counted here.
    for (; nextPart_ < worldSize_; ++nextPart_) {
      int peer = (rank_ + nextPart_) % worldSize_;
      if (peer == rank_) {
        barriers_[peer].fetch_add(1, std::memory_order_release);
        continue;
      }
      if (!issueWrite(peer, controlRegion_, 0, 0, /*toControl=*/true, 0,
                      encodeImmediate(rank_, ImmediateKind::Barrier, 0)))
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
      encodeImmediate(rank_, ImmediateKind::Data, command.counter));
}

bool Communicator::issueWrite(int peer, const Region &source,
                              uint64_t srcOffset, uint64_t length,
                              bool toControl, uint64_t remoteOffset,
                              uint32_t immediate) {
  // A lost peer has already failed the communicator; drop its writes.
  if (lost_[peer].load(std::memory_order_relaxed))
    return true;
  if (freeOperations_.empty())
    return false;
  const moe_transport_peer_info_t &target = peers_[peer];
  uint64_t remoteAddress =
      (toControl ? target.control_base : target.recv_base) + remoteOffset;
  uint64_t key = toControl ? target.control_key : target.recv_key;
  Operation *operation = freeOperations_.back();
  operation->peer = peer;
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
  if (now - lastHeartbeat_ < interval)
    return;
  lastHeartbeat_ = now;
  for (int peer = 0; peer < worldSize_; ++peer)
    if (peer != rank_)
      // Best effort: a busy endpoint skips a beat, the next one comes soon.
      issueWrite(peer, controlRegion_, 0, 0, /*toControl=*/true, 0,
                 encodeImmediate(rank_, ImmediateKind::Heartbeat, 0));
}

void Communicator::checkPeers(Clock::time_point now) {
  auto timeout = std::chrono::milliseconds(peerTimeoutMs_);
  for (int peer = 0; peer < worldSize_; ++peer)
    if (peer != rank_ && !lost_[peer].load(std::memory_order_relaxed) &&
        now - lastHeard_[peer] > timeout)
      markLost(peer, format("nothing heard from it for %d ms (process died "
                            "or network down)",
                            peerTimeoutMs_));
}

void Communicator::markLost(int peer, const std::string &why) {
  if (lost_[peer].exchange(true))
    return;
  fail(makeError(MOE_TRANSPORT_ERR_PEER_LOST, "rank %d lost peer rank %d: %s",
                 rank_, peer, why.c_str()));
}

} // namespace moe::transport
