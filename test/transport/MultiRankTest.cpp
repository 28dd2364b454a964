//===- MultiRankTest.cpp - Ranks as processes on loopback -----------------===//
//
// The parent never initializes libfabric (so FI_PROVIDER set in a child takes
// effect); every rank is a forked child that reports through the Board.
//
//===----------------------------------------------------------------------===//
#include "RankHarness.h"
#include "TestHooks.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using namespace moe::transport::testing;

namespace {

/// A rank that fails a transport call reports the status and the message.
#define RANK_CHECK(context, call)                                              \
  do {                                                                         \
    moe_transport_status_t status_ = (call);                                   \
    if (status_ != MOE_TRANSPORT_OK)                                           \
      return (context).fail(status_, "rank %d: %s: %s", (context).rank, #call, \
                            moe_transport_last_error());                       \
  } while (0)

struct AllToAllRun {
  int iterations;
  uint64_t maxBytes; // per peer
  uint32_t ringCapacity;
};

/// A rank's config: send and receive buffers of `bytes`, the wait timeout
/// and the peer timeout (0: the default).
moe_transport_config_t rankConfig(size_t bytes, int timeoutMs,
                                  int peerTimeoutMs = 0) {
  moe_transport_config_t config;
  moe_transport_config_init(&config);
  config.send_bytes = config.recv_bytes = bytes;
  config.timeout_ms = timeoutMs;
  config.peer_timeout_ms = peerTimeoutMs;
  return config;
}

/// This rank's transport and context, for hooks (each rank is a process).
moe_transport_t *rankTransport = nullptr;
RankContext *rankContext = nullptr;

/// Runs all-to-alls with per-peer random sizes and checks every byte.
int allToAllRank(RankContext &context, const Provider &provider,
                 const AllToAllRun &run) {
  int world = context.worldSize, me = context.rank;
  moe_transport_config_t config;
  moe_transport_config_init(&config);
  config.send_bytes = world * run.maxBytes + 1;
  config.recv_bytes = world * run.maxBytes + 1;
  config.ring_capacity = run.ringCapacity;
  config.timeout_ms = 20000;
  moe_transport_t *transport = nullptr;
  RANK_CHECK(context, context.open(provider, config, &transport));
  rankTransport = transport;
  rankContext = &context;
  auto *send = static_cast<uint8_t *>(moe_transport_send_buffer(transport));
  auto *recv = static_cast<uint8_t *>(moe_transport_recv_buffer(transport));
  std::vector<uint64_t> sendOffsets(world), sendBytes(world),
      recvOffsets(world), recvBytes(world);
  const uint64_t seed = 0x5eed;
  for (int iteration = 0; iteration < run.iterations; ++iteration) {
    for (int peer = 0; peer < world; ++peer) {
      sendOffsets[peer] = peer * run.maxBytes;
      sendBytes[peer] = payloadSize(seed, iteration, me, peer, run.maxBytes);
      for (uint64_t i = 0; i < sendBytes[peer]; ++i)
        send[sendOffsets[peer] + i] = payloadByte(me, peer, iteration, i);
    }
    RANK_CHECK(context, moe_transport_alltoallv(
                            transport, sendOffsets.data(), sendBytes.data(),
                            recvOffsets.data(), recvBytes.data(), -1));
    uint64_t packed = 0;
    for (int source = 0; source < world; ++source) {
      uint64_t expected =
          payloadSize(seed, iteration, source, me, run.maxBytes);
      if (recvBytes[source] != expected || recvOffsets[source] != packed)
        return context.fail(
            kCheckFailed,
            "rank %d iteration %d: from rank %d got %llu bytes "
            "at %llu, expected %llu at %llu",
            me, iteration, source, (unsigned long long)recvBytes[source],
            (unsigned long long)recvOffsets[source],
            (unsigned long long)expected, (unsigned long long)packed);
      for (uint64_t i = 0; i < expected; ++i)
        if (recv[packed + i] != payloadByte(source, me, iteration, i))
          return context.fail(kCheckFailed,
                              "rank %d iteration %d: byte %llu from rank %d "
                              "is wrong",
                              me, iteration, (unsigned long long)i, source);
      packed += expected;
    }
    context.board->progress[me].fetch_add(1);
  }
  RANK_CHECK(context, moe_transport_barrier(transport, -1));
  moe_transport_close(transport);
  return 0;
}

void expectAllSucceeded(const std::vector<RankOutcome> &outcomes) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    EXPECT_FALSE(outcomes[rank].timedOut) << "rank " << rank << " hung";
    EXPECT_EQ(outcomes[rank].exitCode, 0)
        << "rank " << rank << ": " << outcomes[rank].message;
  }
}

class ProviderTest : public ::testing::TestWithParam<Provider> {};

std::string providerName(const ::testing::TestParamInfo<Provider> &info) {
  return info.param.label;
}

//===--- all-to-all with random per-peer sizes ----------------------------===//

class AllToAllTest
    : public ::testing::TestWithParam<std::tuple<Provider, int>> {};

TEST_P(AllToAllTest, RandomSizesArriveByteForByte) {
  Provider provider = std::get<0>(GetParam());
  int ranks = std::get<1>(GetParam());
  AllToAllRun run = {8, 48 * 1024, 64};
  expectAllSucceeded(runRanks(ranks, ranks, 60000, [&](RankContext &context) {
    return allToAllRank(context, provider, run);
  }));
}

INSTANTIATE_TEST_SUITE_P(
    Transport, AllToAllTest,
    ::testing::Combine(::testing::Values(kTcp, kShm),
                       ::testing::Values(2, 4, 8)),
    [](const ::testing::TestParamInfo<std::tuple<Provider, int>> &info) {
      return std::string(std::get<0>(info.param).label) + "_" +
             std::to_string(std::get<1>(info.param)) + "ranks";
    });

//===--- stress: many iterations through a small ring ---------------------===//

TEST_P(ProviderTest, ThousandsOfAllToAllsThroughASmallRing) {
  Provider provider = GetParam();
  // A ring of 4 commands is full most of the time; iterations overlap on the
  // wire, so next-iteration counts overtake this iteration's payload.
  AllToAllRun run = {2000, 192, 4};
  std::vector<RankOutcome> outcomes =
      runRanks(4, 4, 60000, [&](RankContext &context) {
        return allToAllRank(context, provider, run);
      });
  expectAllSucceeded(outcomes);
}

//===--- a slow rank while fast peers start the next call -----------------===//

constexpr int kSlowWorld = 4, kSlowIterations = 12;

/// On the last rank, before step 2 reaches its last peer (rank world - 2,
/// which still waits for our bytes): holds until every other peer has
/// finished this call and its next call's counts have landed here, i.e. has
/// overwritten its row of our count matrix. Every rank must by then work
/// from its own copy of this call's matrix.
void holdLastRankUntilPeersMoveOn(int rank, int step) {
  if (rank != kSlowWorld - 1 || step != kSlowWorld - 1)
    return;
  uint64_t iteration = rankContext->board->progress[rank].load();
  if (iteration + 1 >= kSlowIterations)
    return; // no next call to wait for
  auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int peer = 0; peer < kSlowWorld - 2; ++peer)
    while (moe_transport_arrivals(rankTransport, peer,
                                  MOE_TRANSPORT_COUNTER_ALLTOALL_COUNTS) <
               iteration + 2 &&
           std::chrono::steady_clock::now() < giveUp)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
}

TEST_P(ProviderTest, SlowRankUsesItsOwnCopyOfTheCounts) {
  Provider provider = GetParam();
  AllToAllRun run = {kSlowIterations, 256, 64};
  expectAllSucceeded(
      runRanks(kSlowWorld, kSlowWorld, 60000, [&](RankContext &context) {
        moe::transport::allToAllStepHookForTesting =
            holdLastRankUntilPeersMoveOn;
        return allToAllRank(context, provider, run);
      }));
}

//===--- raw writes through the ring: none lost, none duplicated ----------===//

TEST_P(ProviderTest, RingDeliversEveryWriteExactlyOnce) {
  Provider provider = GetParam();
  constexpr int kRanks = 3;
  constexpr uint64_t kWrites = 1500; // per peer
  constexpr uint32_t kCounter = 5;
  auto tag = [](int source, int target, uint64_t index) {
    return (uint64_t(source) << 48) | (uint64_t(target) << 32) | (index + 1);
  };
  expectAllSucceeded(runRanks(kRanks, kRanks, 60000, [&](RankContext &context) {
    int me = context.rank;
    moe_transport_config_t config;
    moe_transport_config_init(&config);
    config.send_bytes = kRanks * kWrites * sizeof(uint64_t);
    config.recv_bytes = kRanks * kWrites * sizeof(uint64_t);
    config.ring_capacity = 8;
    config.timeout_ms = 20000;
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, context.open(provider, config, &transport));
    auto *send = static_cast<uint64_t *>(moe_transport_send_buffer(transport));
    auto *recv = static_cast<uint64_t *>(moe_transport_recv_buffer(transport));
    for (int peer = 0; peer < kRanks; ++peer)
      for (uint64_t k = 0; k < kWrites; ++k)
        send[peer * kWrites + k] = tag(me, peer, k);
    // Interleave peers so the ring holds writes to all of them at once.
    for (uint64_t k = 0; k < kWrites; ++k)
      for (int step = 0; step < kRanks; ++step) {
        int peer = (me + step) % kRanks;
        RANK_CHECK(context,
                   moe_transport_write(
                       transport, peer, (peer * kWrites + k) * sizeof(uint64_t),
                       sizeof(uint64_t), (me * kWrites + k) * sizeof(uint64_t),
                       kCounter, -1));
      }
    for (int peer = 0; peer < kRanks; ++peer)
      RANK_CHECK(context, moe_transport_wait_arrivals(transport, peer, kCounter,
                                                      kWrites, -1));
    RANK_CHECK(context, moe_transport_flush(transport, -1));
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    for (int source = 0; source < kRanks; ++source) {
      uint64_t arrived = moe_transport_arrivals(transport, source, kCounter);
      if (arrived != kWrites)
        return context.fail(kCheckFailed,
                            "rank %d: %llu writes from rank %d, expected %llu",
                            me, (unsigned long long)arrived, source,
                            (unsigned long long)kWrites);
      for (uint64_t k = 0; k < kWrites; ++k)
        if (recv[source * kWrites + k] != tag(source, me, k))
          return context.fail(kCheckFailed,
                              "rank %d: write %llu from rank %d missing", me,
                              (unsigned long long)k, source);
    }
    moe_transport_close(transport);
    return 0;
  }));
}

//===--- liveness under load and at a clean close
//--------------------------===//

TEST_P(ProviderTest, FloodToOnePeerDoesNotSilenceTheOthers) {
  // Rank 0 keeps every write operation busy towards rank 1; rank 2 hears
  // from rank 0 only through heartbeats, which must still get through.
  Provider provider = GetParam();
  constexpr int kRanks = 3;
  constexpr uint64_t kBytes = 256 * 1024;
  expectAllSucceeded(runRanks(kRanks, kRanks, 60000, [&](RankContext &context) {
    moe_transport_config_t config = rankConfig(kBytes, 20000, 1500);
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, context.open(provider, config, &transport));
    if (context.rank == 0) {
      auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      while (std::chrono::steady_clock::now() < end)
        RANK_CHECK(context,
                   moe_transport_write(transport, 1, 0, kBytes, 0, 3, -1));
    }
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    moe_transport_close(transport);
    return 0;
  }));
}

TEST_P(ProviderTest, RankThatClosesIsNotReportedLost) {
  // Rank 0 leaves after the barrier; ranks 1 and 2 go on talking for longer
  // than the peer timeout. Its goodbye must keep them from failing.
  Provider provider = GetParam();
  constexpr int kRanks = 3;
  expectAllSucceeded(runRanks(kRanks, kRanks, 30000, [&](RankContext &context) {
    moe_transport_config_t config = rankConfig(4096, 10000);
    // Not much shorter: a peer starved of CPU on a loaded 2-core machine
    // must not be declared lost for real.
    config.peer_timeout_ms = 1000;
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, context.open(provider, config, &transport));
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    if (context.rank != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2200));
      int peer = 3 - context.rank;
      RANK_CHECK(context, moe_transport_write(transport, peer, 0, 8, 0, 4, -1));
      RANK_CHECK(context,
                 moe_transport_wait_arrivals(transport, peer, 4, 1, -1));
      RANK_CHECK(context, moe_transport_flush(transport, -1));
    }
    moe_transport_close(transport);
    return 0;
  }));
}

//===--- stalls, rejections, raw barriers, goodbyes mid-wait --------------===//

TEST_P(ProviderTest, StoppedProcessIsNotALostPeer) {
  // A world of one is stopped for longer than the peer timeout. On resume
  // the proxy is held back a moment, so the producer's watchdog looks first
  // and sees a stale proxy tick: the stall was the process's, not the
  // proxy's, and must not fail the communicator.
  Provider provider = GetParam();
  std::vector<RankOutcome> outcomes = runRanks(
      1, 1, 30000,
      [&](RankContext &context) {
        rankContext = &context;
        moe::transport::proxyTurnHookForTesting = [](int) {
          int expected = 1;
          if (rankContext->board->release.compare_exchange_strong(expected,
                                                                  2)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            rankContext->board->release.store(3);
          }
        };
        moe_transport_config_t config = rankConfig(4096, 10000, 800);
        moe_transport_t *transport = nullptr;
        RANK_CHECK(context, context.open(provider, config, &transport));
        while (context.board->release.load() != 3) {
          RANK_CHECK(context, moe_transport_barrier(transport, -1));
          context.board->progress[0].fetch_add(1);
        }
        for (int i = 0; i < 5; ++i)
          RANK_CHECK(context, moe_transport_barrier(transport, -1));
        moe_transport_close(transport);
        return 0;
      },
      [&](const std::vector<pid_t> &pids, Board &board) {
        while (board.progress[0].load() < 10)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        kill(pids[0], SIGSTOP);
        board.release.store(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(1300));
        kill(pids[0], SIGCONT);
      });
  expectAllSucceeded(outcomes);
}

TEST_P(ProviderTest, StoppedJobLosesNoPeer) {
  // Every rank is stopped for longer than the peer timeout, then resumed:
  // each proxy finds its own silence and none names a live peer.
  Provider provider = GetParam();
  constexpr int kRanks = 3;
  expectAllSucceeded(runRanks(
      kRanks, kRanks, 40000,
      [&](RankContext &context) {
        moe_transport_config_t config = rankConfig(4096, 10000, 1000);
        moe_transport_t *transport = nullptr;
        RANK_CHECK(context, context.open(provider, config, &transport));
        // Barriers keep the ranks in step; the stop lands somewhere in
        // them, and as many follow as ran before it.
        for (int i = 0; i < 4000; ++i) {
          RANK_CHECK(context, moe_transport_barrier(transport, -1));
          context.board->progress[context.rank].fetch_add(1);
        }
        moe_transport_close(transport);
        return 0;
      },
      [&](const std::vector<pid_t> &pids, Board &board) {
        for (int rank = 0; rank < kRanks; ++rank)
          while (board.progress[rank].load() < 100)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (pid_t pid : pids)
          kill(pid, SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(1600));
        for (pid_t pid : pids)
          kill(pid, SIGCONT);
      }));
}

TEST_P(ProviderTest, OverflowIsRejectedByEveryRankAlike) {
  // Rank 0 asks to send rank 1 more than its receive buffer holds. Rank 1 is
  // slow to copy the counts (it waits for rank 0's next call to overwrite
  // them): rank 0 must not get that far. Both reject the call, and the next
  // call runs on the same communicator.
  Provider provider = GetParam();
  constexpr int kRanks = 2;
  expectAllSucceeded(runRanks(kRanks, kRanks, 30000, [&](RankContext &context) {
    rankContext = &context;
    moe::transport::allToAllCountsHookForTesting = [](int rank) {
      if (rank != 1 || rankContext->board->release.load() != 0)
        return;
      rankContext->board->release.store(1);
      auto end =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
      while (moe_transport_arrivals(
                 rankTransport, 0, MOE_TRANSPORT_COUNTER_ALLTOALL_COUNTS) < 2 &&
             std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
    moe_transport_config_t config;
    moe_transport_config_init(&config);
    config.send_bytes = 4096;
    config.recv_bytes = 1024;
    config.timeout_ms = 5000;
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, context.open(provider, config, &transport));
    rankTransport = transport;
    int me = context.rank, peer = 1 - me;
    std::vector<uint64_t> offsets = {0, 2048}, bytes(kRanks, 0),
                          recvOffsets(kRanks), recvBytes(kRanks);
    bytes[peer] = me == 0 ? 2048 : 16;
    moe_transport_status_t first =
        moe_transport_alltoallv(transport, offsets.data(), bytes.data(),
                                recvOffsets.data(), recvBytes.data(), -1);
    if (first != MOE_TRANSPORT_ERR_OUT_OF_BOUNDS)
      return context.fail(kCheckFailed, "rank %d: first call gave %s: %s", me,
                          moe_transport_status_name(first),
                          moe_transport_last_error());
    if (!strstr(moe_transport_last_error(), "rank 1 would receive 2048 bytes"))
      return context.fail(kCheckFailed, "rank %d: %s", me,
                          moe_transport_last_error());
    auto *send = static_cast<uint8_t *>(moe_transport_send_buffer(transport));
    auto *recv = static_cast<uint8_t *>(moe_transport_recv_buffer(transport));
    for (int i = 0; i < 100; ++i)
      send[offsets[peer] + i] = static_cast<uint8_t>(me * 100 + i);
    bytes[peer] = 100;
    RANK_CHECK(context, moe_transport_alltoallv(
                            transport, offsets.data(), bytes.data(),
                            recvOffsets.data(), recvBytes.data(), -1));
    for (int i = 0; i < 100; ++i)
      if (recv[recvOffsets[peer] + i] != static_cast<uint8_t>(peer * 100 + i))
        return context.fail(kCheckFailed, "rank %d: byte %d is wrong", me, i);
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    moe_transport_close(transport);
    return 0;
  }));
}

TEST_P(ProviderTest, RawBarrierCommandsDoNotReleaseTheBarrier) {
  // Both ranks post a raw barrier command, which counts under its counter.
  // Rank 0 then enters moe_transport_barrier long before rank 1: it must
  // wait for rank 1, not take the raw barrier for it.
  Provider provider = GetParam();
  constexpr int kRanks = 2;
  expectAllSucceeded(runRanks(kRanks, kRanks, 30000, [&](RankContext &context) {
    moe_transport_config_t config = rankConfig(4096, 10000);
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, context.open(provider, config, &transport));
    int me = context.rank, peer = 1 - me;
    moe_transport_command_t raw = {};
    raw.kind = MOE_TRANSPORT_CMD_BARRIER;
    raw.counter = 6;
    RANK_CHECK(context, moe_transport_post(transport, &raw, -1));
    RANK_CHECK(context, moe_transport_flush(transport, -1));
    RANK_CHECK(context, moe_transport_wait_arrivals(transport, peer, 6, 1, -1));
    RANK_CHECK(context, moe_transport_wait_arrivals(transport, me, 6, 1, -1));
    if (me == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      context.board->progress[1].store(1);
    }
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    if (me == 0 && context.board->progress[1].load() == 0)
      return context.fail(kCheckFailed,
                          "rank 0 left the barrier before rank 1 entered it");
    moe_transport_close(transport);
    return 0;
  }));
}

TEST_P(ProviderTest, GoodbyeMidCollectiveFailsItNamingTheRank) {
  // Rank 2 closes while ranks 0 and 1 are in an all-to-all with it: they
  // fail at once with PEER_LOST naming it, not after the wait timeout.
  Provider provider = GetParam();
  constexpr int kRanks = 3;
  std::vector<RankOutcome> outcomes =
      runRanks(kRanks, kRanks, 30000, [&](RankContext &context) {
        moe_transport_config_t config = rankConfig(kRanks * 64, 6000);
        moe_transport_t *transport = nullptr;
        RANK_CHECK(context, context.open(provider, config, &transport));
        RANK_CHECK(context, moe_transport_barrier(transport, -1));
        int me = context.rank;
        if (me == 2) {
          while (context.board->progress[0].load() == 0 ||
                 context.board->progress[1].load() == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          moe_transport_close(transport);
          return 0;
        }
        std::vector<uint64_t> offsets = {0, 64, 128}, bytes(kRanks, 16),
                              recvOffsets(kRanks), recvBytes(kRanks);
        context.board->progress[me].store(1);
        auto start = std::chrono::steady_clock::now();
        moe_transport_status_t status =
            moe_transport_alltoallv(transport, offsets.data(), bytes.data(),
                                    recvOffsets.data(), recvBytes.data(), -1);
        auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
        context.fail(status, "after %lld ms: %s", (long long)took,
                     moe_transport_last_error());
        moe_transport_close(transport);
        return status == MOE_TRANSPORT_ERR_PEER_LOST && took < 3000
                   ? static_cast<int>(status)
                   : kCheckFailed;
      });
  EXPECT_EQ(outcomes[2].exitCode, 0) << outcomes[2].message;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(outcomes[rank].exitCode, MOE_TRANSPORT_ERR_PEER_LOST)
        << "rank " << rank << ": " << outcomes[rank].message;
    EXPECT_NE(outcomes[rank].message.find("lost peer rank 2: it closed"),
              std::string::npos)
        << "rank " << rank << ": " << outcomes[rank].message;
  }
}

//===--- addresses handed in by the caller --------------------------------===//

TEST_P(ProviderTest, ConnectsWithAddressesHandedIn) {
  Provider provider = GetParam();
  constexpr int kRanks = 2;
  expectAllSucceeded(runRanks(kRanks, kRanks, 30000, [&](RankContext &context) {
    if (context.listenFd >= 0)
      close(context.listenFd);
    moe_transport_config_t config;
    moe_transport_config_init(&config);
    config.rank = context.rank;
    config.world_size = kRanks;
    config.provider = provider.name;
    config.domain = provider.domain;
    config.send_bytes = config.recv_bytes = 4096;
    config.timeout_ms = 10000;
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, moe_transport_open(&config, &transport));
    RANK_CHECK(context, moe_transport_local_info(
                            transport, &context.board->infos[context.rank]));
    context.board->infoPublished[context.rank].store(1);
    for (int peer = 0; peer < kRanks; ++peer)
      while (!context.board->infoPublished[peer].load())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    RANK_CHECK(context, moe_transport_connect(transport, context.board->infos));
    int peer = 1 - context.rank;
    auto *send = static_cast<uint32_t *>(moe_transport_send_buffer(transport));
    auto *recv = static_cast<uint32_t *>(moe_transport_recv_buffer(transport));
    send[0] = 0xC0FFEE00u + context.rank;
    RANK_CHECK(context, moe_transport_write(transport, peer, 0, 4, 16, 2, -1));
    RANK_CHECK(context, moe_transport_wait_arrivals(transport, peer, 2, 1, -1));
    if (recv[4] != 0xC0FFEE00u + peer)
      return context.fail(kCheckFailed, "rank %d read 0x%x", context.rank,
                          recv[4]);
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    moe_transport_close(transport);
    return 0;
  }));
}

//===--- faults ----------------------------------------------------------===//

/// Kills one rank of kRanks in the middle of all-to-alls; every survivor
/// must name it, in time, and none may crash (a signal) while closing.
void expectKilledRankNamed(const Provider &provider, int kRanks) {
  constexpr int kVictim = 2;
  std::chrono::steady_clock::time_point killedAt;
  std::vector<RankOutcome> outcomes = runRanks(
      kRanks, kRanks, 30000,
      [&](RankContext &context) {
        moe_transport_config_t config = rankConfig(kRanks * 1024, 8000, 1000);
        moe_transport_t *transport = nullptr;
        RANK_CHECK(context, context.open(provider, config, &transport));
        std::vector<uint64_t> offsets(kRanks), bytes(kRanks, 512),
            recvOffsets(kRanks), recvBytes(kRanks);
        for (int peer = 0; peer < kRanks; ++peer)
          offsets[peer] = peer * 1024;
        // Run until the victim's death stops us; the error is the result.
        for (;;) {
          moe_transport_status_t status =
              moe_transport_alltoallv(transport, offsets.data(), bytes.data(),
                                      recvOffsets.data(), recvBytes.data(), -1);
          if (status != MOE_TRANSPORT_OK) {
            context.fail(status, "%s", moe_transport_last_error());
            // Stay until every survivor has its verdict: a rank closing
            // early must not become the peer another survivor names.
            context.finishAndWaitForRelease(20000);
            moe_transport_close(transport);
            return static_cast<int>(status);
          }
          context.board->progress[context.rank].fetch_add(1);
        }
      },
      [&](const std::vector<pid_t> &pids, Board &board) {
        // Kill the victim once every rank is well into the run.
        auto giveUp =
            std::chrono::steady_clock::now() + std::chrono::seconds(15);
        for (;;) {
          bool allRunning = true;
          for (int rank = 0; rank < kRanks; ++rank)
            allRunning &= board.progress[rank].load() >= 20;
          if (allRunning || std::chrono::steady_clock::now() > giveUp)
            break;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        kill(pids[kVictim], SIGKILL);
        killedAt = std::chrono::steady_clock::now();
        auto released =
            std::chrono::steady_clock::now() + std::chrono::seconds(20);
        for (;;) {
          bool allFinished = true;
          for (int rank = 0; rank < kRanks; ++rank)
            allFinished &= rank == kVictim || board.finished[rank].load();
          if (allFinished || std::chrono::steady_clock::now() > released)
            break;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        board.release.store(1);
      });
  auto elapsed = std::chrono::steady_clock::now() - killedAt;
  // Detection takes the peer timeout; a proxy stuck in shm adds the bounded
  // close (2 s).
  EXPECT_LT(elapsed, std::chrono::seconds(8));
  EXPECT_EQ(outcomes[kVictim].exitCode, -1) << "the victim was not killed";
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == kVictim)
      continue;
    EXPECT_EQ(outcomes[rank].signal, 0)
        << "rank " << rank << " died of signal " << outcomes[rank].signal;
    EXPECT_FALSE(outcomes[rank].timedOut) << "rank " << rank << " hung";
    EXPECT_EQ(outcomes[rank].exitCode, MOE_TRANSPORT_ERR_PEER_LOST)
        << "rank " << rank << ": " << outcomes[rank].message;
    EXPECT_NE(outcomes[rank].message.find("peer rank 2"), std::string::npos)
        << "rank " << rank << ": " << outcomes[rank].message;
  }
}

TEST_P(ProviderTest, KilledRankIsNamedByEverySurvivor) {
  expectKilledRankNamed(GetParam(), 4);
}

TEST_P(ProviderTest, KilledRankAmongEightIsNamedByEverySurvivor) {
  expectKilledRankNamed(GetParam(), 8);
}

/// The shm regions in /dev/shm made by process `pid`.
std::vector<std::string> shmRegionsOf(pid_t pid) {
  std::vector<std::string> names;
  std::string middle = "-" + std::to_string(pid) + "-";
  if (DIR *dir = opendir("/dev/shm")) {
    while (dirent *entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.rfind("moe-", 0) == 0 && name.find(middle) != std::string::npos)
        names.push_back(name);
    }
    closedir(dir);
  }
  return names;
}

TEST(ShmTest, RegionOfAKilledRankIsRemovedByTheNextOpen) {
  // A shm rank killed before it closes leaves its region in /dev/shm; the
  // next shm endpoint opened on the host removes it.
  auto openAlone = [](RankContext &context, bool die) {
    moe_transport_config_t config;
    moe_transport_config_init(&config);
    config.send_bytes = config.recv_bytes = 4096;
    moe_transport_t *transport = nullptr;
    RANK_CHECK(context, context.open(kShm, config, &transport));
    RANK_CHECK(context, moe_transport_barrier(transport, -1));
    if (die)
      raise(SIGKILL);
    moe_transport_close(transport);
    return 0;
  };
  pid_t victim = -1;
  std::vector<RankOutcome> killed = runRanks(
      1, 1, 20000,
      [&](RankContext &context) { return openAlone(context, true); },
      [&](const std::vector<pid_t> &pids, Board &) { victim = pids[0]; });
  ASSERT_EQ(killed[0].signal, SIGKILL) << killed[0].message;
  ASSERT_FALSE(shmRegionsOf(victim).empty())
      << "the killed rank left no region behind: nothing to test";
  expectAllSucceeded(runRanks(1, 1, 20000, [&](RankContext &context) {
    return openAlone(context, false);
  }));
  EXPECT_TRUE(shmRegionsOf(victim).empty())
      << shmRegionsOf(victim).front() << " is still there";
}

TEST(BootstrapTest, RankThatNeverConnectsIsNamed) {
  // A world of 3 where rank 2 never starts.
  auto start = std::chrono::steady_clock::now();
  std::vector<RankOutcome> outcomes =
      runRanks(3, 2, 20000, [&](RankContext &context) {
        moe_transport_config_t config = rankConfig(4096, 1500);
        moe_transport_t *transport = nullptr;
        moe_transport_status_t status = context.open(kTcp, config, &transport);
        context.fail(status, "%s", moe_transport_last_error());
        moe_transport_close(transport);
        return static_cast<int>(status);
      });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(outcomes[rank].exitCode, MOE_TRANSPORT_ERR_BOOTSTRAP)
        << outcomes[rank].message;
    EXPECT_NE(outcomes[rank].message.find("rank 2 never connected"),
              std::string::npos)
        << outcomes[rank].message;
  }
}

TEST(BootstrapTest, NoRootTimesOut) {
  // Rank 1 of 2 alone: rank 0 never listens on the (closed) port.
  std::vector<RankOutcome> outcomes =
      runRanks(2, 2, 20000, [&](RankContext &context) {
        if (context.rank == 0) {
          close(context.listenFd);
          return 0;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        moe_transport_config_t config = rankConfig(4096, 500);
        moe_transport_t *transport = nullptr;
        moe_transport_status_t status = context.open(kTcp, config, &transport);
        context.fail(status, "%s", moe_transport_last_error());
        moe_transport_close(transport);
        return static_cast<int>(status);
      });
  EXPECT_EQ(outcomes[1].exitCode, MOE_TRANSPORT_ERR_BOOTSTRAP);
  EXPECT_NE(outcomes[1].message.find("rank 0 not reachable"), std::string::npos)
      << outcomes[1].message;
}

TEST(BootstrapTest, SilentConnectionDoesNotStallTheExchange) {
  // Before rank 0 starts, a stranger connects to its port and says nothing:
  // the ranks behind it must still join at once, not after the timeout.
  std::vector<RankOutcome> outcomes =
      runRanks(2, 2, 20000, [&](RankContext &context) {
        int silent = -1;
        if (context.rank == 1) {
          silent = socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in address = {};
          address.sin_family = AF_INET;
          address.sin_port = htons(static_cast<uint16_t>(context.port));
          address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (connect(silent, reinterpret_cast<sockaddr *>(&address),
                      sizeof(address)) != 0)
            return context.fail(kCheckFailed, "connect: %s", strerror(errno));
          context.board->progress[1].store(1);
        } else {
          while (context.board->progress[1].load() == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        moe_transport_config_t config = rankConfig(4096, 3000);
        auto start = std::chrono::steady_clock::now();
        moe_transport_t *transport = nullptr;
        RANK_CHECK(context, context.open(kTcp, config, &transport));
        auto took = std::chrono::steady_clock::now() - start;
        moe_transport_close(transport);
        if (silent >= 0)
          close(silent);
        if (took > std::chrono::milliseconds(1500))
          return context.fail(
              kCheckFailed, "rank %d joined after %lld ms", context.rank,
              (long long)std::chrono::duration_cast<std::chrono::milliseconds>(
                  took)
                  .count());
        return 0;
      });
  expectAllSucceeded(outcomes);
}

TEST(BootstrapTest, GarbageReplyIsNamedAsSuch) {
  // Something else answers on rank 0's port: rank 1 says so at once, rather
  // than waiting out its timeout and calling it no answer.
  std::vector<RankOutcome> outcomes =
      runRanks(2, 2, 20000, [&](RankContext &context) {
        if (context.rank == 0) {
          int client = accept(context.listenFd, nullptr, nullptr);
          std::vector<char> garbage(4096, 'X');
          if (client < 0 || write(client, garbage.data(), garbage.size()) !=
                                static_cast<ssize_t>(garbage.size()))
            return context.fail(kCheckFailed, "accept/write failed");
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          close(client);
          close(context.listenFd);
          return 0;
        }
        moe_transport_config_t config = rankConfig(4096, 2000);
        auto start = std::chrono::steady_clock::now();
        moe_transport_t *transport = nullptr;
        moe_transport_status_t status = context.open(kTcp, config, &transport);
        auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
        context.fail(status, "after %lld ms: %s", (long long)took,
                     moe_transport_last_error());
        moe_transport_close(transport);
        return took < 1000 ? static_cast<int>(status) : kCheckFailed;
      });
  EXPECT_EQ(outcomes[0].exitCode, 0) << outcomes[0].message;
  EXPECT_EQ(outcomes[1].exitCode, MOE_TRANSPORT_ERR_BOOTSTRAP)
      << outcomes[1].message;
  EXPECT_NE(outcomes[1].message.find("unexpected reply"), std::string::npos)
      << outcomes[1].message;
}

//===--- provider selection ----------------------------------------------===//

/// Opens a world of one with provider and FI_PROVIDER as given and reports
/// the provider libfabric picked as the message.
std::string pickedProvider(const char *provider, const char *environment) {
  std::vector<RankOutcome> outcomes =
      runRanks(1, 1, 20000, [&](RankContext &context) {
        close(context.listenFd);
        if (environment)
          setenv("FI_PROVIDER", environment, 1);
        else
          unsetenv("FI_PROVIDER");
        moe_transport_config_t config;
        moe_transport_config_init(&config);
        config.provider = provider;
        config.send_bytes = config.recv_bytes = 4096;
        moe_transport_t *transport = nullptr;
        RANK_CHECK(context, moe_transport_open(&config, &transport));
        context.fail(0, "%s", moe_transport_provider(transport));
        moe_transport_close(transport);
        return 0;
      });
  EXPECT_EQ(outcomes[0].exitCode, 0) << outcomes[0].message;
  return outcomes[0].message;
}

TEST(ProviderSelectionTest, HonoursFiProvider) {
  EXPECT_EQ(pickedProvider(nullptr, "shm"), "shm");
  EXPECT_EQ(pickedProvider(nullptr, "tcp;ofi_rxm"), "tcp;ofi_rxm");
}

TEST(ProviderSelectionTest, DefaultPrefersProductionThenTcp) {
  std::string picked = pickedProvider(nullptr, nullptr);
  EXPECT_TRUE(picked == "efa" || picked == "verbs;ofi_rxm" ||
              picked == "tcp;ofi_rxm")
      << picked;
}

TEST(ProviderSelectionTest, ConfigOverridesDefault) {
  EXPECT_EQ(pickedProvider("shm", nullptr), "shm");
}

INSTANTIATE_TEST_SUITE_P(Transport, ProviderTest, ::testing::Values(kTcp, kShm),
                         providerName);

} // namespace
