//===- CApi.cpp - The C API over Communicator -----------------------------===//
#include "moe_transport.h"

#include "Bootstrap.h"
#include "Communicator.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_set>

using namespace moe::transport;

struct moe_transport {
  std::unique_ptr<Communicator> comm;
};

namespace {
// Reporting never allocates, so it works when memory has run out.
thread_local char lastError[1024];

moe_transport_status_t reportRaw(moe_transport_status_t code,
                                 const char *message) noexcept {
  std::snprintf(lastError, sizeof(lastError), "%s", message);
  return code;
}

moe_transport_status_t report(const Status &status) noexcept {
  return reportRaw(status.code(),
                   status.failed() ? status.message().c_str() : "");
}

moe_transport_status_t invalid(const char *message) noexcept {
  return reportRaw(MOE_TRANSPORT_ERR_INVALID_ARGUMENT, message);
}

moe_transport_status_t nullHandle() noexcept {
  return invalid("transport handle is null");
}

/// Runs one C entry point's body: no C++ exception leaves the library.
template <typename Body> moe_transport_status_t guarded(Body &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return reportRaw(MOE_TRANSPORT_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    return reportRaw(MOE_TRANSPORT_ERR_FABRIC, e.what());
  } catch (...) {
    return reportRaw(MOE_TRANSPORT_ERR_FABRIC, "unknown C++ exception");
  }
}

/// The handles open now, so that closing one twice is harmless. Never
/// destroyed: a close may run during static destruction.
std::mutex &handlesMutex() {
  static std::mutex *mutex = new std::mutex();
  return *mutex;
}
std::unordered_set<const moe_transport *> &liveHandles() {
  static auto *handles = new std::unordered_set<const moe_transport *>();
  return *handles;
}

} // namespace

extern "C" {

void moe_transport_config_init(moe_transport_config_t *config) {
  if (!config)
    return;
  memset(config, 0, sizeof(*config));
  config->world_size = 1;
}

moe_transport_status_t moe_transport_open(const moe_transport_config_t *config,
                                          moe_transport_t **out) {
  if (!config || !out)
    return invalid(!config ? "config must not be null"
                           : "out must not be null");
  *out = nullptr;
  return guarded([&] {
    std::unique_ptr<Communicator> comm;
    if (Status status = Communicator::open(*config, comm); status.failed())
      return report(status);
    auto handle = std::make_unique<moe_transport>();
    handle->comm = std::move(comm);
    {
      std::lock_guard<std::mutex> lock(handlesMutex());
      liveHandles().insert(handle.get());
    }
    *out = handle.release();
    return report(Status::ok());
  });
}

void moe_transport_close(moe_transport_t *transport) {
  if (!transport)
    return;
  {
    std::lock_guard<std::mutex> lock(handlesMutex());
    if (!liveHandles().erase(transport))
      return; // Closed already.
  }
  (void)guarded([&] {
    // A proxy stuck inside the provider still uses everything: leak it
    // rather than free memory under it or hang the caller.
    if (!transport->comm->stopProxy())
      (void)transport->comm.release();
    delete transport;
    return MOE_TRANSPORT_OK;
  });
}

moe_transport_status_t moe_transport_bootstrap(moe_transport_t *transport,
                                               const char *host, int port,
                                               int listen_fd) {
  // The listening socket is ours from here on, whatever happens.
  auto reject = [&](const char *message) {
    if (listen_fd >= 0)
      ::close(listen_fd);
    return invalid(message);
  };
  if (!transport)
    return reject("transport handle is null");
  if (!host)
    return reject("bootstrap host must not be null");
  return guarded([&] {
    return report(transport->comm->bootstrap(host, port, listen_fd));
  });
}

moe_transport_status_t
moe_transport_local_info(moe_transport_t *transport,
                         moe_transport_peer_info_t *out) {
  if (!transport)
    return nullHandle();
  if (!out)
    return invalid("out must not be null");
  *out = transport->comm->localInfo();
  return report(Status::ok());
}

moe_transport_status_t
moe_transport_connect(moe_transport_t *transport,
                      const moe_transport_peer_info_t *peers) {
  if (!transport)
    return nullHandle();
  if (!peers)
    return invalid("peers must not be null");
  return guarded([&] { return report(transport->comm->connect(peers)); });
}

moe_transport_status_t moe_transport_bootstrap_listen(const char *host,
                                                      int port, int *listen_fd,
                                                      int *bound_port) {
  if (!host || !listen_fd || !bound_port)
    return invalid(!host        ? "host must not be null"
                   : !listen_fd ? "listen_fd must not be null"
                                : "bound_port must not be null");
  return guarded([&] {
    return report(bootstrapListen(host, port, *listen_fd, *bound_port));
  });
}

int moe_transport_rank(const moe_transport_t *transport) {
  return transport ? transport->comm->rank() : -1;
}

int moe_transport_world_size(const moe_transport_t *transport) {
  return transport ? transport->comm->worldSize() : 0;
}

const char *moe_transport_provider(const moe_transport_t *transport) {
  return transport ? transport->comm->fabric().providerName().c_str() : "";
}

const char *moe_transport_domain(const moe_transport_t *transport) {
  return transport ? transport->comm->fabric().domainName().c_str() : "";
}

int moe_transport_hmem_supported(const moe_transport_t *transport) {
  return transport && transport->comm->fabric().hmemSupported();
}

void *moe_transport_send_buffer(moe_transport_t *transport) {
  return transport ? transport->comm->sendBuffer() : nullptr;
}

void *moe_transport_recv_buffer(moe_transport_t *transport) {
  return transport ? transport->comm->recvBuffer() : nullptr;
}

moe_transport_ring_t *moe_transport_command_ring(moe_transport_t *transport) {
  return transport ? transport->comm->ring() : nullptr;
}

moe_transport_status_t
moe_transport_post(moe_transport_t *transport,
                   const moe_transport_command_t *command, int timeout_ms) {
  if (!transport)
    return nullHandle();
  if (!command)
    return invalid("command must not be null");
  return guarded(
      [&] { return report(transport->comm->post(*command, timeout_ms)); });
}

moe_transport_status_t moe_transport_write(moe_transport_t *transport, int peer,
                                           uint64_t src_offset, uint64_t length,
                                           uint64_t remote_offset,
                                           uint32_t counter, int timeout_ms) {
  if (!transport)
    return nullHandle();
  if (peer < 0)
    return report(makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                            "peer %d is out of range: world size is %d", peer,
                            transport->comm->worldSize()));
  return guarded([&] {
    moe_transport_command_t command = {};
    command.kind = MOE_TRANSPORT_CMD_WRITE;
    command.peer = static_cast<uint32_t>(peer);
    command.src_offset = src_offset;
    command.length = length;
    command.remote_offset = remote_offset;
    command.counter = counter;
    return report(transport->comm->post(command, timeout_ms));
  });
}

uint64_t moe_transport_arrivals(moe_transport_t *transport, int peer,
                                uint32_t counter) {
  return transport ? transport->comm->arrivals(peer, counter) : 0;
}

moe_transport_status_t moe_transport_wait_arrivals(moe_transport_t *transport,
                                                   int peer, uint32_t counter,
                                                   uint64_t target,
                                                   int timeout_ms) {
  if (!transport)
    return nullHandle();
  return guarded([&] {
    return report(
        transport->comm->waitArrivals(peer, counter, target, timeout_ms));
  });
}

moe_transport_status_t moe_transport_flush(moe_transport_t *transport,
                                           int timeout_ms) {
  if (!transport)
    return nullHandle();
  return guarded([&] { return report(transport->comm->flush(timeout_ms)); });
}

moe_transport_status_t moe_transport_barrier(moe_transport_t *transport,
                                             int timeout_ms) {
  if (!transport)
    return nullHandle();
  return guarded([&] { return report(transport->comm->barrier(timeout_ms)); });
}

moe_transport_status_t moe_transport_alltoallv(moe_transport_t *transport,
                                               const uint64_t *send_offsets,
                                               const uint64_t *send_bytes,
                                               uint64_t *recv_offsets,
                                               uint64_t *recv_bytes,
                                               int timeout_ms) {
  if (!transport)
    return nullHandle();
  return guarded([&] {
    return report(transport->comm->allToAllV(
        send_offsets, send_bytes, recv_offsets, recv_bytes, timeout_ms));
  });
}

const char *moe_transport_last_error(void) { return lastError; }

const char *moe_transport_status_name(moe_transport_status_t status) {
  switch (status) {
  case MOE_TRANSPORT_OK:
    return "ok";
  case MOE_TRANSPORT_ERR_INVALID_ARGUMENT:
    return "invalid argument";
  case MOE_TRANSPORT_ERR_OUT_OF_BOUNDS:
    return "out of bounds";
  case MOE_TRANSPORT_ERR_RING_FULL:
    return "command ring full";
  case MOE_TRANSPORT_ERR_TIMEOUT:
    return "timeout";
  case MOE_TRANSPORT_ERR_PEER_LOST:
    return "peer lost";
  case MOE_TRANSPORT_ERR_BOOTSTRAP:
    return "bootstrap failed";
  case MOE_TRANSPORT_ERR_FABRIC:
    return "fabric error";
  case MOE_TRANSPORT_ERR_STATE:
    return "invalid state";
  case MOE_TRANSPORT_ERR_NO_MEMORY:
    return "out of memory";
  }
  return "unknown status";
}

} // extern "C"
