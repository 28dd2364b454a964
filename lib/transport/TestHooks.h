//===- TestHooks.h - Hooks that only tests set ------------------*- C++ -*-===//
//
// Races between ranks are hard to provoke from outside: these let a test hold
// one rank at a precise point while its proxy and its peers run on. They are
// null in production, where the only cost is a load and a branch per call.
// Set them before opening a communicator, from the thread that will use it.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TRANSPORT_TESTHOOKS_H
#define MOE_TRANSPORT_TESTHOOKS_H

namespace moe::transport {

/// Called by allToAllV on the producer thread before it posts step 2's writes
/// to the peer at position step (0 .. world - 1) of its rotated peer order,
/// after the count matrix of this call is known.
extern void (*allToAllStepHookForTesting)(int rank, int step);

/// Called by the proxy thread at the start of each loop turn, before it
/// records the turn (the producer's watchdog reads that record).
extern void (*proxyTurnHookForTesting)(int rank);

/// Called by allToAllV on the producer thread once every rank's row of
/// counts has arrived, before the matrix is copied.
extern void (*allToAllCountsHookForTesting)(int rank);

} // namespace moe::transport

#endif // MOE_TRANSPORT_TESTHOOKS_H
