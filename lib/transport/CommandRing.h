//===- CommandRing.h - Single-producer command ring -------------*- C++ -*-===//
//
// The ring lives in host-mapped memory: the producer (a kernel in production)
// fills a slot and then publishes it by advancing head with release order; the
// proxy reads head with acquire order, copies the slot out and hands the slot
// back by advancing tail. Free-running 64-bit counters never wrap in practice,
// so head - tail is the fill level and no slot is lost or read twice.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TRANSPORT_COMMANDRING_H
#define MOE_TRANSPORT_COMMANDRING_H

#include "moe_transport.h"

namespace moe::transport {

inline bool isPowerOfTwo(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

/// Producer side. False if the ring is full.
inline bool ringTryPush(moe_transport_ring_t &ring,
                        const moe_transport_command_t &command) {
  uint64_t head = __atomic_load_n(&ring.head, __ATOMIC_RELAXED);
  uint64_t tail = __atomic_load_n(&ring.tail, __ATOMIC_ACQUIRE);
  if (head - tail >= ring.capacity)
    return false;
  ring.slots[head & (ring.capacity - 1)] = command;
  __atomic_store_n(&ring.head, head + 1, __ATOMIC_RELEASE);
  return true;
}

/// Consumer (proxy) side. False if the ring is empty.
inline bool ringTryPop(moe_transport_ring_t &ring,
                       moe_transport_command_t &command) {
  uint64_t tail = __atomic_load_n(&ring.tail, __ATOMIC_RELAXED);
  uint64_t head = __atomic_load_n(&ring.head, __ATOMIC_ACQUIRE);
  if (head == tail)
    return false;
  command = ring.slots[tail & (ring.capacity - 1)];
  __atomic_store_n(&ring.tail, tail + 1, __ATOMIC_RELEASE);
  return true;
}

} // namespace moe::transport

#endif // MOE_TRANSPORT_COMMANDRING_H
