//===- AllToAll.cpp - All-to-all with a size per peer (MoE dispatch) ------===//
//
// Step 1: every rank writes its row of byte counts (and a word saying whether
// it rejected its own arguments) into slot [rank] of every rank's count
// matrix. Step 2: with the whole matrix known, every rank derives
// where its bytes go in each receiver (packed by source rank) and writes
// them. Each step's arrivals are counted under their own counter: a write of
// the next call's step 1 may overtake this call's step 2 on the wire.
//
//===----------------------------------------------------------------------===//
#include "Communicator.h"
#include "TestHooks.h"

namespace moe::transport {

void (*allToAllStepHookForTesting)(int rank, int step) = nullptr;
void (*allToAllCountsHookForTesting)(int rank) = nullptr;

Status Communicator::allToAllV(const uint64_t *sendOffsets,
                               const uint64_t *sendBytes, uint64_t *recvOffsets,
                               uint64_t *recvBytes, int timeoutMs) {
  if (Status status = checkUsable(); status.failed())
    return status;
  // Arguments this rank cannot send from are not an early return: its peers
  // are entering the same collective. The rank still takes part, flags its
  // row, and every rank rejects the call alike.
  Status local = Status::ok();
  if (!sendOffsets || !sendBytes || !recvOffsets || !recvBytes)
    local = makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                      "all-to-all: offset and size arrays must not be null");
  for (int peer = 0; peer < worldSize_ && !local.failed(); ++peer)
    if (!inBounds(sendOffsets[peer], sendBytes[peer], sendRegion_.bytes))
      local = makeError(MOE_TRANSPORT_ERR_OUT_OF_BOUNDS,
                        "all-to-all: %llu bytes at offset %llu for rank %d run "
                        "past the send buffer (%zu bytes)",
                        (unsigned long long)sendBytes[peer],
                        (unsigned long long)sendOffsets[peer], peer,
                        sendRegion_.bytes);

  Clock::time_point deadline = deadlineAfter(timeoutMs);
  // Once step 1 has started, ranks disagree on what arrived if this rank
  // stops early: later calls must fail too rather than miscount.
  auto abandon = [&](Status status) {
    fail(status);
    // The caller's own arguments are the error to report, even where the
    // exchange that flags them to the peers failed too.
    if (local.failed())
      return Status::error(local.code(), local.message() +
                                             " (the exchange that tells the "
                                             "other ranks failed too: " +
                                             status.message() + ")");
    return status;
  };
  // Peers in a rotated order so that not every rank targets rank 0 first.
  auto peerAt = [&](int step) { return (rank_ + step) % worldSize_; };

  uint64_t *row = countsOut();
  for (int peer = 0; peer < worldSize_; ++peer)
    row[peer] = local.failed() ? 0 : sendBytes[peer];
  row[worldSize_] = local.failed() ? kRowRejected : 0;
  for (int step = 0; step < worldSize_; ++step) {
    moe_transport_command_t command = {};
    command.kind = kWriteControl;
    command.peer = static_cast<uint32_t>(peerAt(step));
    command.length = countsRowWords() * sizeof(uint64_t);
    command.remote_offset = countsInOffset(rank_);
    command.counter = MOE_TRANSPORT_COUNTER_ALLTOALL_COUNTS;
    if (Status status = enqueue(command, deadline, timeoutMs); status.failed())
      return abandon(status);
  }
  for (uint64_t &expected : expectedCounts_)
    ++expected;
  if (Status status =
          waitForAll(MOE_TRANSPORT_COUNTER_ALLTOALL_COUNTS, expectedCounts_,
                     deadline, timeoutMs, "all-to-all counts");
      status.failed())
    return abandon(status);
  if (allToAllCountsHookForTesting)
    allToAllCountsHookForTesting(rank_);

  // Copy the matrix out at once and use only the copy. The live region is
  // not ours for long: a peer that already has our step-2 bytes finishes this
  // call and its next call's step 1 overwrites its row here, while we may
  // still be computing offsets for peers we have not written to yet.
  size_t rowWords = countsRowWords();
  const std::vector<uint64_t> matrix(
      countsIn(), countsIn() + static_cast<size_t>(worldSize_) * rowWords);
  // bytesFrom(source, target): what source sends target.
  auto bytesFrom = [&](int source, int target) {
    return matrix[static_cast<size_t>(source) * rowWords + target];
  };
  // Every rank sees the same matrix, so every rank reaches the same verdict.
  Status rejected = local;
  for (int source = 0; source < worldSize_ && !rejected.failed(); ++source)
    if (matrix[static_cast<size_t>(source) * rowWords + worldSize_] &
        kRowRejected)
      rejected = makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                           "all-to-all: rank %d rejected its own arguments, so "
                           "every rank rejects the call",
                           source);
  // Checking the sum for wrap-around also bounds every partial sum below.
  for (int target = 0; target < worldSize_ && !rejected.failed(); ++target) {
    uint64_t total = 0;
    bool wrapped = false;
    for (int source = 0; source < worldSize_; ++source)
      wrapped |=
          __builtin_add_overflow(total, bytesFrom(source, target), &total);
    if (wrapped || total > peers_[target].recv_bytes)
      rejected = makeError(
          MOE_TRANSPORT_ERR_OUT_OF_BOUNDS,
          "all-to-all: rank %d would receive %s bytes but its "
          "receive buffer holds %llu",
          target, wrapped ? "more than 2^64" : std::to_string(total).c_str(),
          (unsigned long long)peers_[target].recv_bytes);
  }
  if (!rejected.failed()) {
    uint64_t offset = 0;
    for (int source = 0; source < worldSize_; ++source) {
      recvOffsets[source] = offset;
      recvBytes[source] = bytesFrom(source, rank_);
      offset += recvBytes[source];
    }
  }
  // A rejected call still completes step 2, with one empty write per peer:
  // no rank returns (and starts its next call, overwriting its row of the
  // matrix) before every peer has copied this call's matrix.
  auto bytesTo = [&](int source, int target) -> uint64_t {
    return rejected.failed() ? 0 : bytesFrom(source, target);
  };

  for (int step = 0; step < worldSize_; ++step) {
    if (allToAllStepHookForTesting)
      allToAllStepHookForTesting(rank_, step);
    int peer = peerAt(step);
    uint64_t remoteOffset = 0;
    for (int source = 0; source < rank_; ++source)
      remoteOffset += bytesTo(source, peer);
    // At least one write per peer, so a receiver of nothing still hears.
    uint64_t sent = 0, bytes = bytesTo(rank_, peer);
    size_t chunks = chunkCount(bytes);
    for (size_t chunk = 0; chunk < chunks; ++chunk) {
      moe_transport_command_t command = {};
      command.kind = MOE_TRANSPORT_CMD_WRITE;
      command.peer = static_cast<uint32_t>(peer);
      command.src_offset = bytes ? sendOffsets[peer] + sent : 0;
      command.length = std::min(chunkBytes_, bytes - sent);
      command.remote_offset = remoteOffset + sent;
      command.counter = MOE_TRANSPORT_COUNTER_ALLTOALL_PAYLOAD;
      if (Status status = enqueue(command, deadline, timeoutMs);
          status.failed())
        return abandon(status);
      sent += command.length;
    }
  }
  for (int source = 0; source < worldSize_; ++source)
    expectedPayload_[source] += chunkCount(bytesTo(source, rank_));
  if (Status status =
          waitForAll(MOE_TRANSPORT_COUNTER_ALLTOALL_PAYLOAD, expectedPayload_,
                     deadline, timeoutMs, "all-to-all payload");
      status.failed())
    return abandon(status);
  // The caller may refill the send buffer (and our count row) on return.
  if (Status status = flushUntil(deadline, timeoutMs); status.failed())
    return abandon(status);
  // Every rank agreed and the communicator stays usable.
  return rejected;
}

} // namespace moe::transport
