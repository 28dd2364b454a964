//===- EpJoin.h - config checks and joining a group -------------*- C++ -*-===//
//
// Internal to libmoe_ep: the checks of an init's config and joining the
// group through lib/transport, the same for CPU layers (EpCpuExchange.cpp)
// and GPU layers (EpCudaGroup.cpp).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_EPJOIN_H
#define MOE_RUNTIME_EPJOIN_H

#include "moe_transport.h"
#include "runtime/moe_ep.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace moe::rt {

/// Checks `config` for a layer of `ranks` ranks whose buffers take at most
/// `maxTokens` tokens per rank; an empty string when it is fine, else why
/// not.
std::string checkEpConfig(const moe_ep_config_t *config, int64_t ranks,
                          int64_t maxTokens);

/// Rank 0's listening socket (`config->listen_fd`), which init takes: the
/// bootstrap closes it once it listened there, this when init returns
/// before handing it on, so no return of init leaves it open.
class ListenSocket {
public:
  explicit ListenSocket(const moe_ep_config_t *config)
      : fd(config ? config->listen_fd : -1) {}
  ~ListenSocket();
  ListenSocket(const ListenSocket &) = delete;
  ListenSocket &operator=(const ListenSocket &) = delete;
  /// The socket, for the bootstrap, which closes it from here on.
  int release() {
    int taken = fd;
    fd = -1;
    return taken;
  }

private:
  int fd;
};

/// Opens lib/transport for `config`'s rank on the given buffers (null: the
/// library allocates `sendBytes` and `recvBytes`) and bootstraps it through
/// rank 0 on `listenSocket`, which is closed whether it joins or not. Null
/// with `why` set when it cannot join.
moe_transport_t *joinEpGroup(const moe_ep_config_t *config,
                             ListenSocket &listenSocket, void *send,
                             size_t sendBytes, void *recv, size_t recvBytes,
                             std::string &why);

/// Test hooks, read from the environment at init (0 and false unless a
/// test sets them for `rank`):
/// MOE_EP_TEST_EXTRA_CHOICE=r:n: rank r's dispatch claims n more choices of
/// each peer's first expert than its records hold;
/// MOE_EP_TEST_RETURN_BASE=r:b: rank r gives its peers return base b.
int64_t testExtraChoices(int rank);
std::optional<uint32_t> testReturnBase(int rank);
/// The GPU state's test-hook words for `rank` (kTestExtraChoice, then
/// kTestReturnBase: the base + 1, 0 for none), which init writes.
std::array<uint32_t, 2> testHookWords(int rank);

} // namespace moe::rt

#endif // MOE_RUNTIME_EPJOIN_H
