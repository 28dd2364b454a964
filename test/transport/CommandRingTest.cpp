//===- CommandRingTest.cpp - The single-producer command ring -------------===//
#include "CommandRing.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

using namespace moe::transport;

namespace {

moe_transport_command_t numbered(uint64_t sequence) {
  moe_transport_command_t command = {};
  command.kind = MOE_TRANSPORT_CMD_WRITE;
  command.src_offset = sequence;
  command.remote_offset = ~sequence;
  return command;
}

TEST(CommandRingTest, RejectsPushWhenFullAndRecovers) {
  std::vector<moe_transport_command_t> slots(4);
  moe_transport_ring_t ring = {};
  ring.capacity = slots.size();
  ring.slots = slots.data();
  for (uint64_t i = 0; i < 4; ++i)
    EXPECT_TRUE(ringTryPush(ring, numbered(i)));
  EXPECT_FALSE(ringTryPush(ring, numbered(4)));
  moe_transport_command_t out;
  ASSERT_TRUE(ringTryPop(ring, out));
  EXPECT_EQ(out.src_offset, 0u);
  EXPECT_TRUE(ringTryPush(ring, numbered(4)));
  for (uint64_t i = 1; i <= 4; ++i) {
    ASSERT_TRUE(ringTryPop(ring, out));
    EXPECT_EQ(out.src_offset, i);
  }
  EXPECT_FALSE(ringTryPop(ring, out));
}

TEST(CommandRingTest, ConcurrentProducerAndConsumerLoseAndRepeatNothing) {
  constexpr uint64_t kCommands = 300000;
  std::vector<moe_transport_command_t> slots(16);
  moe_transport_ring_t ring = {};
  ring.capacity = slots.size();
  ring.slots = slots.data();
  std::thread producer([&] {
    for (uint64_t i = 0; i < kCommands; ++i)
      while (!ringTryPush(ring, numbered(i)))
        std::this_thread::yield();
  });
  // Consume everything before checking: an ASSERT returning early would
  // leave the producer blocked on a full ring and its thread joinable.
  uint64_t next = 0, torn = 0, outOfSequence = 0;
  moe_transport_command_t out;
  while (next < kCommands) {
    if (!ringTryPop(ring, out)) {
      std::this_thread::yield();
      continue;
    }
    // Any loss or repeat breaks the sequence; a torn slot breaks the pair.
    outOfSequence += out.src_offset != next;
    torn += out.remote_offset != ~out.src_offset;
    ++next;
  }
  producer.join();
  EXPECT_EQ(outOfSequence, 0u);
  EXPECT_EQ(torn, 0u);
  EXPECT_FALSE(ringTryPop(ring, out));
  EXPECT_EQ(ring.head, kCommands);
  EXPECT_EQ(ring.tail, kCommands);
}

TEST(CommandRingTest, PowerOfTwo) {
  EXPECT_TRUE(isPowerOfTwo(1));
  EXPECT_TRUE(isPowerOfTwo(1024));
  EXPECT_FALSE(isPowerOfTwo(0));
  EXPECT_FALSE(isPowerOfTwo(12));
}

} // namespace
