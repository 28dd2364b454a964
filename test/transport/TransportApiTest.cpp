//===- TransportApiTest.cpp - The C API in one process (world of one) -----===//
//
// A world of one still goes through fabric set-up, registration, the ring
// and the proxy; multi-rank behaviour is in MultiRankTest.cpp.
//
//===----------------------------------------------------------------------===//
#include "TestProviders.h"
#include "moe_transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

using moe::transport::testing::kShm;
using moe::transport::testing::kTcp;
using moe::transport::testing::Provider;

namespace {

bool contains(const std::string &text, const char *part) {
  return text.find(part) != std::string::npos;
}

class TransportApiTest : public ::testing::TestWithParam<Provider> {
protected:
  moe_transport_config_t config(size_t bytes, uint32_t ringCapacity = 0) {
    moe_transport_config_t config;
    moe_transport_config_init(&config);
    config.provider = GetParam().name;
    config.domain = GetParam().domain;
    config.send_bytes = config.recv_bytes = bytes;
    config.ring_capacity = ringCapacity;
    config.timeout_ms = 10000;
    return config;
  }

  /// A connected world of one.
  moe_transport_t *openSelf(const moe_transport_config_t &config) {
    moe_transport_t *transport = nullptr;
    EXPECT_EQ(moe_transport_open(&config, &transport), MOE_TRANSPORT_OK)
        << moe_transport_last_error();
    if (!transport)
      return nullptr;
    moe_transport_peer_info_t self;
    EXPECT_EQ(moe_transport_local_info(transport, &self), MOE_TRANSPORT_OK);
    EXPECT_EQ(moe_transport_connect(transport, &self), MOE_TRANSPORT_OK)
        << moe_transport_last_error();
    return transport;
  }
};

TEST_P(TransportApiTest, OpensTheRequestedProvider) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  EXPECT_STREQ(moe_transport_provider(transport), GetParam().name);
  EXPECT_EQ(moe_transport_rank(transport), 0);
  EXPECT_EQ(moe_transport_world_size(transport), 1);
  RecordProperty("hmem", moe_transport_hmem_supported(transport));
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, RejectsBadConfig) {
  moe_transport_t *transport = nullptr;
  moe_transport_config_t settings = config(4096);
  settings.rank = 1;
  EXPECT_EQ(moe_transport_open(&settings, &transport),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(moe_transport_last_error(), "rank 1 is outside"));
  EXPECT_EQ(transport, nullptr);

  settings = config(4096, /*ringCapacity=*/12);
  EXPECT_EQ(moe_transport_open(&settings, &transport),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(moe_transport_last_error(), "power of two"));

  settings = config(0);
  EXPECT_EQ(moe_transport_open(&settings, &transport),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);

  settings = config(4096);
  settings.provider = "no-such-provider";
  EXPECT_EQ(moe_transport_open(&settings, &transport),
            MOE_TRANSPORT_ERR_FABRIC);
  EXPECT_TRUE(contains(moe_transport_last_error(), "no-such-provider"))
      << moe_transport_last_error();
}

// A ring too large to allocate is an error status, not an exception escaping
// the C API (std::bad_alloc used to abort the process).
TEST_P(TransportApiTest, RejectsAHugeRingWithoutThrowing) {
  moe_transport_t *transport = nullptr;
  moe_transport_config_t settings = config(4096, /*ringCapacity=*/1u << 31);
  EXPECT_EQ(moe_transport_open(&settings, &transport),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(moe_transport_last_error(),
                       "ring_capacity 2147483648 is not a power of two up to"))
      << moe_transport_last_error();
  EXPECT_EQ(transport, nullptr);
}

// The configured domain is the one opened; one the provider lacks is an
// error naming it (tcp used to bind its first interface whatever was asked).
TEST_P(TransportApiTest, OpensTheConfiguredDomainOrSaysItIsMissing) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = nullptr;
  ASSERT_EQ(moe_transport_open(&settings, &transport), MOE_TRANSPORT_OK)
      << moe_transport_last_error();
  if (GetParam().domain)
    EXPECT_STREQ(moe_transport_domain(transport), GetParam().domain);
  else
    EXPECT_STRNE(moe_transport_domain(transport), "");
  moe_transport_close(transport);

  settings.domain = "no-such-domain";
  transport = nullptr;
  EXPECT_EQ(moe_transport_open(&settings, &transport),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(moe_transport_last_error(),
                       "domain 'no-such-domain' is not offered"))
      << moe_transport_last_error();
  EXPECT_EQ(transport, nullptr);
}

// Ports are 16 bits: 70000 used to reach a listener on 4464.
TEST_P(TransportApiTest, RejectsPortsOutsideSixteenBits) {
  int fd = -1, bound = 0;
  EXPECT_EQ(moe_transport_bootstrap_listen("127.0.0.1", 70000, &fd, &bound),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(
      contains(moe_transport_last_error(), "port 70000 is outside [0, 65535]"));
  EXPECT_EQ(moe_transport_bootstrap_listen("127.0.0.1", -1, &fd, &bound),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = nullptr;
  ASSERT_EQ(moe_transport_open(&settings, &transport), MOE_TRANSPORT_OK);
  EXPECT_EQ(moe_transport_bootstrap(transport, "127.0.0.1", 70000, -1),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(
      contains(moe_transport_last_error(), "port 70000 is outside [0, 65535]"));
  moe_transport_close(transport);
}

// Each null argument is named.
TEST_P(TransportApiTest, NamesTheNullArgument) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(moe_transport_connect(transport, nullptr),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(moe_transport_last_error(), "peers must not be null");
  EXPECT_EQ(moe_transport_post(transport, nullptr, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(moe_transport_last_error(), "command must not be null");
  EXPECT_EQ(moe_transport_local_info(transport, nullptr),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(moe_transport_last_error(), "out must not be null");
  EXPECT_EQ(moe_transport_post(nullptr, nullptr, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(moe_transport_last_error(), "transport handle is null");
  moe_transport_close(transport);
}

// Closing a handle twice does nothing the second time.
TEST_P(TransportApiTest, ClosingTwiceIsHarmless) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  moe_transport_close(transport);
  moe_transport_close(transport);
  // The library still works.
  transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(moe_transport_barrier(transport, 1000), MOE_TRANSPORT_OK)
      << moe_transport_last_error();
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, RejectsUseBeforeConnect) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = nullptr;
  ASSERT_EQ(moe_transport_open(&settings, &transport), MOE_TRANSPORT_OK);
  EXPECT_EQ(moe_transport_write(transport, 0, 0, 8, 0, 2, 0),
            MOE_TRANSPORT_ERR_STATE);
  EXPECT_TRUE(contains(moe_transport_last_error(), "not connected"));
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, RejectsBadCommandsBeforeTheRing) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  moe_transport_ring_t *ring = moe_transport_command_ring(transport);
  uint64_t headBefore = ring->head;

  EXPECT_EQ(moe_transport_write(transport, 1, 0, 8, 0, 2, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(moe_transport_last_error(), "peer 1 is out of range"))
      << moe_transport_last_error();
  EXPECT_EQ(moe_transport_write(transport, -1, 0, 8, 0, 2, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moe_transport_write(transport, 0, 4090, 8, 0, 2, 0),
            MOE_TRANSPORT_ERR_OUT_OF_BOUNDS);
  EXPECT_TRUE(contains(moe_transport_last_error(), "past the send buffer"));
  EXPECT_EQ(moe_transport_write(transport, 0, 0, 8, 4092, 2, 0),
            MOE_TRANSPORT_ERR_OUT_OF_BOUNDS);
  EXPECT_TRUE(contains(moe_transport_last_error(), "rank 0's receive buffer"));
  // Offsets that would wrap around 64 bits.
  EXPECT_EQ(moe_transport_write(transport, 0, ~0ull - 2, 8, 0, 2, 0),
            MOE_TRANSPORT_ERR_OUT_OF_BOUNDS);
  EXPECT_EQ(
      moe_transport_write(transport, 0, 0, 8, 0, MOE_TRANSPORT_NUM_COUNTERS, 0),
      MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(moe_transport_last_error(), "counter"));
  moe_transport_command_t unknown = {};
  unknown.kind = 77;
  EXPECT_EQ(moe_transport_post(transport, &unknown, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moe_transport_wait_arrivals(transport, 3, 0, 1, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(moe_transport_post(nullptr, &unknown, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  // The all-to-all's counters are not for raw commands.
  EXPECT_EQ(moe_transport_write(transport, 0, 0, 8, 0,
                                MOE_TRANSPORT_COUNTER_ALLTOALL_PAYLOAD, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(
      contains(moe_transport_last_error(), "belongs to the all-to-all"));

  // Nothing reached the ring, and the communicator is still healthy.
  EXPECT_EQ(ring->head, headBefore);
  EXPECT_EQ(moe_transport_barrier(transport, -1), MOE_TRANSPORT_OK)
      << moe_transport_last_error();

  // An all-to-all whose arguments this rank rejects still runs the exchange
  // (its peers are in it too), is rejected alike, and leaves the
  // communicator usable.
  std::vector<uint64_t> offsets = {4000}, bytes = {200}, out1(1), out2(1);
  EXPECT_EQ(moe_transport_alltoallv(transport, offsets.data(), bytes.data(),
                                    out1.data(), out2.data(), -1),
            MOE_TRANSPORT_ERR_OUT_OF_BOUNDS);
  EXPECT_TRUE(contains(moe_transport_last_error(), "run past the send buffer"));
  EXPECT_EQ(moe_transport_barrier(transport, -1), MOE_TRANSPORT_OK)
      << moe_transport_last_error();
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, AllToAllReportsItsArgumentErrorBeforeATimeout) {
  // A null array found before the exchange is the error reported, even when
  // the exchange that flags it (no time given for it here) runs out of time.
  for (int nullArray = 0; nullArray < 4; ++nullArray) {
    moe_transport_config_t settings = config(4096);
    moe_transport_t *transport = openSelf(settings);
    ASSERT_NE(transport, nullptr);
    uint64_t values[4] = {0, 8, 0, 0};
    uint64_t *arrays[4] = {&values[0], &values[1], &values[2], &values[3]};
    arrays[nullArray] = nullptr;
    EXPECT_EQ(moe_transport_alltoallv(transport, arrays[0], arrays[1],
                                      arrays[2], arrays[3], 0),
              MOE_TRANSPORT_ERR_INVALID_ARGUMENT)
        << "array " << nullArray << ": " << moe_transport_last_error();
    EXPECT_TRUE(contains(moe_transport_last_error(), "must not be null"))
        << moe_transport_last_error();
    moe_transport_close(transport);
  }
}

TEST_P(TransportApiTest, WaitTimesOutNamingThePeer) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(moe_transport_wait_arrivals(transport, 0, 4, 1, 50),
            MOE_TRANSPORT_ERR_TIMEOUT);
  EXPECT_TRUE(contains(moe_transport_last_error(), "rank 0"));
  EXPECT_TRUE(contains(moe_transport_last_error(), "0 of 1"));
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, FullRingRejectsAndLosesNothingAccepted) {
  // Two slots and 1 MiB copies: the producer outruns the proxy.
  constexpr size_t kBytes = 1 << 20;
  moe_transport_config_t settings = config(kBytes, /*ringCapacity=*/2);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  uint64_t accepted = 0, rejected = 0;
  for (int i = 0; i < 2000 && rejected < 50; ++i) {
    moe_transport_status_t status =
        moe_transport_write(transport, 0, 0, kBytes, 0, 3, 0);
    if (status == MOE_TRANSPORT_OK) {
      ++accepted;
    } else {
      ASSERT_EQ(status, MOE_TRANSPORT_ERR_RING_FULL);
      EXPECT_TRUE(contains(moe_transport_last_error(), "ring full"));
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0u);
  ASSERT_EQ(moe_transport_wait_arrivals(transport, 0, 3, accepted, -1),
            MOE_TRANSPORT_OK);
  ASSERT_EQ(moe_transport_flush(transport, -1), MOE_TRANSPORT_OK);
  EXPECT_EQ(moe_transport_arrivals(transport, 0, 3), accepted);
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, SelfAllToAllCopiesAndPacks) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  auto *send = static_cast<uint8_t *>(moe_transport_send_buffer(transport));
  auto *recv = static_cast<uint8_t *>(moe_transport_recv_buffer(transport));
  for (int iteration = 0; iteration < 3; ++iteration) {
    uint64_t offset = 100 + iteration, bytes = 1000 + 7 * iteration;
    for (uint64_t i = 0; i < bytes; ++i)
      send[offset + i] = static_cast<uint8_t>(i * 31 + iteration);
    uint64_t recvOffset = 99, recvBytes = 99;
    ASSERT_EQ(moe_transport_alltoallv(transport, &offset, &bytes, &recvOffset,
                                      &recvBytes, -1),
              MOE_TRANSPORT_OK)
        << moe_transport_last_error();
    EXPECT_EQ(recvOffset, 0u);
    EXPECT_EQ(recvBytes, bytes);
    EXPECT_EQ(memcmp(recv, send + offset, bytes), 0);
  }
  moe_transport_close(transport);
}

TEST_P(TransportApiTest, LastErrorIsPerThread) {
  moe_transport_config_t settings = config(4096);
  moe_transport_t *transport = openSelf(settings);
  ASSERT_NE(transport, nullptr);
  EXPECT_EQ(moe_transport_write(transport, 5, 0, 8, 0, 2, 0),
            MOE_TRANSPORT_ERR_INVALID_ARGUMENT);
  std::string otherThread = "unset";
  std::thread([&] { otherThread = moe_transport_last_error(); }).join();
  EXPECT_EQ(otherThread, "");
  EXPECT_TRUE(contains(moe_transport_last_error(), "peer 5"));
  EXPECT_EQ(moe_transport_barrier(transport, -1), MOE_TRANSPORT_OK);
  EXPECT_STREQ(moe_transport_last_error(), "");
  moe_transport_close(transport);
}

INSTANTIATE_TEST_SUITE_P(Transport, TransportApiTest,
                         ::testing::Values(kTcp, kShm),
                         [](const ::testing::TestParamInfo<Provider> &info) {
                           return std::string(info.param.label);
                         });

TEST(TransportStatusTest, NamesEveryStatus) {
  EXPECT_STREQ(moe_transport_status_name(MOE_TRANSPORT_OK), "ok");
  EXPECT_STREQ(moe_transport_status_name(MOE_TRANSPORT_ERR_PEER_LOST),
               "peer lost");
  EXPECT_STREQ(moe_transport_status_name(MOE_TRANSPORT_ERR_RING_FULL),
               "command ring full");
}

} // namespace
