//===- EpJoin.cpp - config checks and joining a group over transport ------===//

#include "runtime/EpJoin.h"

#include <algorithm>
#include <cstdlib>
#include <unistd.h>

using namespace moe::rt;

std::string moe::rt::checkEpConfig(const moe_ep_config_t *config, int64_t ranks,
                                   int64_t maxTokens) {
  if (!config)
    return "init needs a config (got null)";
  if (config->world_size != ranks)
    return "world_size is " + std::to_string(config->world_size) +
           ", but the layer is compiled for ep_size " + std::to_string(ranks);
  if (config->rank < 0 || config->rank >= config->world_size)
    return "rank " + std::to_string(config->rank) +
           " is outside [0, world_size = " +
           std::to_string(config->world_size) + ")";
  if (config->max_tokens < 0 || config->max_tokens > maxTokens)
    return "max_tokens " + std::to_string(config->max_tokens) +
           " is outside [0, " + std::to_string(maxTokens) +
           "], what the layer's buffers can take";
  if (config->timeout_ms < 0)
    return "timeout_ms must be 0 (the default) or more, not " +
           std::to_string(config->timeout_ms);
  if (config->rank != 0 && config->listen_fd >= 0)
    return "only rank 0 takes a listening socket (listen_fd)";
  if (!config->bootstrap_host && config->listen_fd < 0)
    return "init needs a bootstrap host (rank 0's address)";
  return "";
}

ListenSocket::~ListenSocket() {
  if (fd >= 0)
    ::close(fd);
}

moe_transport_t *moe::rt::joinEpGroup(const moe_ep_config_t *config,
                                      ListenSocket &listenSocket, void *send,
                                      size_t sendBytes, void *recv,
                                      size_t recvBytes, std::string &why) {
  moe_transport_config_t tc;
  moe_transport_config_init(&tc);
  tc.rank = config->rank;
  tc.world_size = config->world_size;
  tc.provider = config->provider;
  tc.domain = config->domain;
  tc.send_buffer = send;
  tc.send_bytes = sendBytes;
  tc.recv_buffer = recv;
  tc.recv_bytes = recvBytes;
  tc.timeout_ms = config->timeout_ms;
  // A dead peer is declared lost (by rank) well before a wait on a live
  // one that waits on it runs out of time.
  if (config->timeout_ms > 0 && config->timeout_ms < 20000)
    tc.peer_timeout_ms = std::max(config->timeout_ms / 2, 200);
  moe_transport_t *transport = nullptr;
  moe_transport_status_t status = moe_transport_open(&tc, &transport);
  // The bootstrap closes the socket; without one, `listenSocket` does.
  if (status == MOE_TRANSPORT_OK)
    status = moe_transport_bootstrap(
        transport, config->bootstrap_host ? config->bootstrap_host : "",
        config->bootstrap_port, listenSocket.release());
  if (status == MOE_TRANSPORT_OK)
    return transport;
  why = "rank " + std::to_string(config->rank) +
        " could not join: " + moe_transport_status_name(status) + ": " +
        moe_transport_last_error();
  moe_transport_close(transport);
  return nullptr;
}

/// `name`'s value "r:n" when r is `rank`.
static bool testHook(const char *name, int rank, uint64_t &value) {
  const char *text = std::getenv(name);
  if (!text)
    return false;
  char *end = nullptr;
  long r = std::strtol(text, &end, 10);
  if (r != rank || *end != ':')
    return false;
  value = std::strtoull(end + 1, nullptr, 10);
  return true;
}

int64_t moe::rt::testExtraChoices(int rank) {
  uint64_t n = 0;
  return testHook("MOE_EP_TEST_EXTRA_CHOICE", rank, n) ? int64_t(n) : 0;
}

std::optional<uint32_t> moe::rt::testReturnBase(int rank) {
  uint64_t base = 0;
  if (!testHook("MOE_EP_TEST_RETURN_BASE", rank, base))
    return std::nullopt;
  return uint32_t(base);
}

std::array<uint32_t, 2> moe::rt::testHookWords(int rank) {
  std::optional<uint32_t> base = testReturnBase(rank);
  return {uint32_t(testExtraChoices(rank)), base ? *base + 1 : 0};
}
