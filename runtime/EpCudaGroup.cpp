//===- EpCudaGroup.cpp - a GPU layer's expert-parallel group --------------===//
//
// Init for sm_90a expert-parallel layers. Over NVLink (ranks on one host):
// each rank allocates its state (runtime/EpLayout.h) in its current
// context, the ranks swap CUDA IPC handles of their states over
// lib/transport (its bootstrap, then one write per peer), and each maps
// every peer's state and writes the addresses into its own, where the
// kernels read them; the kernels then move every byte.
//
// Through the proxy (ranks on different hosts, or forced): the state lives
// in pinned host memory the GPU maps, registered with the NIC as the
// transport's receive buffer, and each peer's "state" in the kernels' table
// is a staging copy in the send buffer. The kernels write there exactly what
// they would write into the peer; a proxy thread sees each flag the kernels
// raise in a staging copy and posts the bytes before it to the peer with RMA
// writes, and on the receiving side raises the flag the kernels wait for
// once lib/transport has counted those writes in. No ordering between
// writes is assumed (as on EFA).
//
//===----------------------------------------------------------------------===//

#include "runtime/moe_ep.h"

#include "moe_transport.h"
#include "runtime/CudaDriver.h"
#include "runtime/DriverApi.h"
#include "runtime/EpJoin.h"
#include "runtime/EpLayout.h"
#include "runtime/moert.h"

#include <atomic>
#include <cstring>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

using namespace moe::rt;

namespace {
// cuMemHostAlloc flags: portable, mapped into the device's address space.
constexpr unsigned kHostAllocPortableMapped = 0x1 | 0x2;
// Peers' states are mapped with peer access enabled on first use.
constexpr unsigned kLazyEnablePeerAccess = 1;

struct GpuGroup {
  CudaDevice::Driver *driver = nullptr;
  moe_transport_t *transport = nullptr;
  uint64_t state = 0;
  int rank = 0, ranks = 0;
  int timeoutMs = 30000;
  std::vector<uint64_t> peers;
  // Through the proxy: state and staging in mapped host memory.
  bool proxy = false;
  uint8_t *hostState = nullptr, *staging = nullptr;
  size_t stateBytes = 0;
  EpDeviceLayout layout{};
  std::thread thread;
  std::atomic<bool> stop{false};
  // The context init ran in (the state's).
  void *context = nullptr;
  // Stopping without forwarding what is staged or meeting the others.
  std::atomic<bool> leaving{false};
  std::string proxyError;
  // The layer's generated proxy routine (internal moe_ep_proxy_turn).
  int32_t (*turn)(moe_transport_t *, uint8_t *, uint8_t *, int32_t, uint64_t *,
                  int32_t) = nullptr;
};
GpuGroup group;

/// Volatile 32-bit access to memory a GPU writes or polls.
uint32_t read32(const uint8_t *p) {
  uint32_t v = *reinterpret_cast<const volatile uint32_t *>(p);
  std::atomic_thread_fence(std::memory_order_acquire);
  return v;
}
void write32(uint8_t *p, uint32_t v) {
  std::atomic_thread_fence(std::memory_order_release);
  *reinterpret_cast<volatile uint32_t *>(p) = v;
}

int32_t fail(const std::string &message) {
  moert_set_error(message.c_str());
  return 1;
}

bool check(int result, const char *call, std::string &error) {
  return CudaDevice::checkResult(group.driver, result, call, error);
}

void release() {
  group.stop.store(true, std::memory_order_release);
  if (group.thread.joinable())
    group.thread.join();
  moe_transport_close(group.transport);
  group.transport = nullptr;
  if (group.driver) {
    if (group.proxy) {
      if (group.hostState)
        group.driver->cuMemFreeHost(group.hostState);
      if (group.staging)
        group.driver->cuMemFreeHost(group.staging);
    } else {
      for (int q = 0; q < int(group.peers.size()); ++q)
        if (q != group.rank && group.peers[q])
          group.driver->cuIpcCloseMemHandle(group.peers[q]);
      if (group.state)
        group.driver->cuMemFree(group.state);
    }
  }
  group.driver = nullptr;
  group.transport = nullptr;
  group.state = 0;
  group.peers.clear();
  group.proxy = false;
  group.hostState = group.staging = nullptr;
  group.proxyError.clear();
  group.context = nullptr;
  group.stop.store(false);
  group.leaving.store(false);
}

/// The proxy thread: the layer's generated proxy routine (one pass over the
/// peers: staged bytes forwarded, arrived ones flagged), called until
/// stopped or a write fails (the kernels' waits then time out and status
/// names the rank). Asked to stop once the GPU is done, it forwards what is
/// still staged, then meets the other ranks, so none is left waiting for
/// bytes still here.
void proxyLoop() {
  GpuGroup &g = group;
  std::vector<uint64_t> progress(6 * size_t(g.ranks), 0);
  while (true) {
    bool stopping = g.stop.load(std::memory_order_acquire);
    int32_t did = g.turn(g.transport, g.hostState, g.staging, g.rank,
                         progress.data(), g.timeoutMs);
    if (did == 2) {
      g.proxyError = moe_transport_last_error();
      return;
    }
    if (stopping && g.leaving.load(std::memory_order_acquire))
      return;
    if (stopping && did == 0) {
      moe_transport_flush(g.transport, g.timeoutMs);
      moe_transport_barrier(g.transport, g.timeoutMs);
      return;
    }
    if (did == 0)
      std::this_thread::yield();
  }
}

int32_t initProxy(int64_t stateBytes, int64_t capacity, int64_t hidden,
                  int64_t topK, int64_t experts, const moe_ep_config_t *config,
                  ListenSocket &listenSocket) {
  GpuGroup &g = group;
  g.proxy = true;
  g.layout = EpDeviceLayout{
      EpLayout{hidden, topK, experts, int64_t(g.ranks), capacity}};
  g.stateBytes = size_t(stateBytes);
  if (g.layout.bytes() != g.stateBytes) {
    release();
    return fail("the layer's state size does not match this runtime's "
                "layout (" +
                std::to_string(stateBytes) + " bytes, not " +
                std::to_string(g.layout.bytes()) + ")");
  }
  std::string error;
  void *state = nullptr, *staging = nullptr;
  if (!check(g.driver->cuMemHostAlloc(&state, g.stateBytes,
                                      kHostAllocPortableMapped),
             "cuMemHostAlloc", error) ||
      !check(g.driver->cuMemHostAlloc(&staging, g.stateBytes * size_t(g.ranks),
                                      kHostAllocPortableMapped),
             "cuMemHostAlloc", error)) {
    if (state)
      g.driver->cuMemFreeHost(state);
    release();
    return fail(
        "rank " + std::to_string(config->rank) +
        " cannot pin its expert-parallel buffers in host memory: " + error);
  }
  g.hostState = static_cast<uint8_t *>(state);
  g.staging = static_cast<uint8_t *>(staging);
  std::memset(g.hostState, 0, g.stateBytes);
  std::memset(g.staging, 0, g.stateBytes * size_t(g.ranks));
  // Mapped host memory has one address for host and device (UVA).
  g.state = reinterpret_cast<uintptr_t>(g.hostState);
  write32(g.hostState + EpDeviceLayout::kRank, uint32_t(config->rank));
  std::array<uint32_t, 2> hooks = testHookWords(config->rank);
  std::memcpy(g.hostState + EpDeviceLayout::kTestExtraChoice, hooks.data(),
              sizeof hooks);
  uint64_t timeoutNs = uint64_t(g.timeoutMs) * 1000000ull;
  std::memcpy(g.hostState + EpDeviceLayout::kTimeoutNs, &timeoutNs, 8);
  for (int q = 0; q < g.ranks; ++q) {
    uint64_t peer =
        q == config->rank
            ? g.state
            : reinterpret_cast<uintptr_t>(g.staging + size_t(q) * g.stateBytes);
    std::memcpy(g.hostState + EpDeviceLayout::kPeers + 8 * size_t(q), &peer, 8);
  }

  std::string why;
  g.transport = joinEpGroup(config, listenSocket, g.staging,
                            g.stateBytes * size_t(g.ranks), g.hostState,
                            g.stateBytes, why);
  if (!g.transport) {
    release();
    return fail(why);
  }
  if (moe_transport_barrier(g.transport, -1) != MOE_TRANSPORT_OK) {
    why = std::string("init barrier: ") + moe_transport_last_error();
    release();
    return fail(why);
  }
  g.thread = std::thread(proxyLoop);
  return 0;
}
} // namespace

extern "C" {

int32_t moe_ep_cuda_init(int64_t stateBytes, int64_t capacity, int64_t hidden,
                         int64_t topK, int64_t experts, int64_t ranks,
                         const moe_ep_config_t *config, void *proxyTurn) {
  ListenSocket listenSocket(config);
  if (group.state)
    return fail("the expert-parallel group is already initialized (call "
                "finalize first)");
  std::string why = checkEpConfig(config, ranks, capacity);
  if (!why.empty())
    return fail(why + (config && config->max_tokens > capacity
                           ? " (moe-compile --ep-max-tokens)"
                           : ""));
  std::string error;
  group.driver = CudaDevice::loadDriver(error);
  if (!group.driver)
    return fail(error);
  void *context = nullptr;
  if (group.driver->cuCtxGetCurrent(&context) != 0 || !context) {
    group.driver = nullptr;
    return fail("init needs the rank's GPU context current on the calling "
                "thread");
  }
  group.context = context;
  group.rank = config->rank;
  group.ranks = int(ranks);
  group.timeoutMs = config->timeout_ms ? config->timeout_ms : 30000;
  if (config->proxy) {
    group.turn = reinterpret_cast<decltype(group.turn)>(proxyTurn);
    if (!group.turn) {
      group.driver = nullptr;
      return fail("the layer has no proxy routine");
    }
    return initProxy(stateBytes, capacity, hidden, topK, experts, config,
                     listenSocket);
  }

  // The state, zeroed, with this rank's control words.
  if (!check(group.driver->cuMemAlloc(&group.state, size_t(stateBytes)),
             "cuMemAlloc", error) ||
      !check(group.driver->cuMemsetD8(group.state, 0, size_t(stateBytes)),
             "cuMemsetD8", error)) {
    release();
    return fail("rank " + std::to_string(config->rank) +
                " cannot allocate its expert-parallel state (" +
                std::to_string(stateBytes) + " bytes): " + error);
  }
  uint32_t rank = uint32_t(config->rank);
  std::array<uint32_t, 2> hooks = testHookWords(config->rank);
  uint64_t timeoutNs = uint64_t(group.timeoutMs) * 1000000ull;
  CudaDevice::Driver::IpcHandle handle;
  if (!check(group.driver->cuMemcpyHtoD(group.state + EpDeviceLayout::kRank,
                                        &rank, 4),
             "cuMemcpyHtoD", error) ||
      !check(group.driver->cuMemcpyHtoD(group.state +
                                            EpDeviceLayout::kTestExtraChoice,
                                        hooks.data(), sizeof hooks),
             "cuMemcpyHtoD", error) ||
      !check(group.driver->cuMemcpyHtoD(
                 group.state + EpDeviceLayout::kTimeoutNs, &timeoutNs, 8),
             "cuMemcpyHtoD", error) ||
      !check(group.driver->cuIpcGetMemHandle(&handle, group.state),
             "cuIpcGetMemHandle", error)) {
    release();
    return fail(error);
  }

  // Every rank's handle, through the transport.
  group.transport = joinEpGroup(config, listenSocket, nullptr, sizeof handle,
                                nullptr, sizeof handle * size_t(ranks), why);
  if (!group.transport) {
    release();
    return fail(why);
  }
  std::memcpy(moe_transport_send_buffer(group.transport), &handle,
              sizeof handle);
  auto *handles =
      static_cast<uint8_t *>(moe_transport_recv_buffer(group.transport));
  std::memcpy(handles + sizeof handle * size_t(rank), &handle, sizeof handle);
  moe_transport_status_t status = MOE_TRANSPORT_OK;
  for (int q = 0; q < ranks && status == MOE_TRANSPORT_OK; ++q)
    if (q != config->rank)
      status = moe_transport_write(group.transport, q, 0, sizeof handle,
                                   sizeof handle * size_t(rank),
                                   kCounterIpcHandles, -1);
  for (int q = 0; q < ranks && status == MOE_TRANSPORT_OK; ++q)
    if (q != config->rank)
      status = moe_transport_wait_arrivals(group.transport, q,
                                           kCounterIpcHandles, 1, -1);
  if (status == MOE_TRANSPORT_OK)
    status = moe_transport_flush(group.transport, -1);
  if (status != MOE_TRANSPORT_OK) {
    why = std::string("swapping IPC handles: ") + moe_transport_last_error();
    release();
    return fail(why);
  }
  group.peers.assign(ranks, 0);
  for (int q = 0; q < ranks; ++q) {
    if (q == config->rank) {
      group.peers[q] = group.state;
      continue;
    }
    CudaDevice::Driver::IpcHandle peer;
    std::memcpy(&peer, handles + sizeof peer * size_t(q), sizeof peer);
    if (!check(group.driver->cuIpcOpenMemHandle(&group.peers[q], peer,
                                                kLazyEnablePeerAccess),
               "cuIpcOpenMemHandle", error)) {
      group.peers[q] = 0;
      release();
      return fail(
          "rank " + std::to_string(rank) + " cannot map the state of rank " +
          std::to_string(q) +
          " (its GPU must be on this host, with peer access): " + error);
    }
  }
  if (!check(group.driver->cuMemcpyHtoD(group.state + EpDeviceLayout::kPeers,
                                        group.peers.data(), 8 * size_t(ranks)),
             "cuMemcpyHtoD", error)) {
    release();
    return fail(error);
  }
  // No rank's kernels write into a peer before it has mapped them all.
  if (moe_transport_barrier(group.transport, -1) != MOE_TRANSPORT_OK) {
    why = std::string("init barrier: ") + moe_transport_last_error();
    release();
    return fail(why);
  }
  return 0;
}

void *moe_ep_cuda_state(void) {
  if (!group.state) {
    fail("the expert-parallel group is not initialized (call "
         "moe_<layer>_ep_init first)");
    return nullptr;
  }
  return reinterpret_cast<void *>(static_cast<uintptr_t>(group.state));
}

int32_t moe_ep_cuda_status(void) {
  if (!group.state)
    return fail("the expert-parallel group is not initialized");
  // The control words from kError to kErrorOwn.
  constexpr size_t first = EpDeviceLayout::kError;
  uint32_t words[(EpDeviceLayout::kErrorOwn - first) / 4 + 1] = {};
  auto word = [&](size_t offset) { return words[(offset - first) / 4]; };
  std::string error;
  if (group.proxy) {
    for (size_t i = 0; i < std::size(words); ++i)
      words[i] = read32(group.hostState + first + 4 * i);
  } else if (!check(group.driver->cuMemcpyDtoH(words, group.state + first,
                                               sizeof words),
                    "cuMemcpyDtoH", error)) {
    return fail(error);
  }
  if (!words[0])
    return 0;
  if (word(EpDeviceLayout::kError) == EpDeviceLayout::kUnevenStep)
    return fail("rank " + std::to_string(group.rank) + " passed " +
                std::to_string(word(EpDeviceLayout::kErrorOwn)) +
                " tokens to a training step, rank " +
                std::to_string(word(EpDeviceLayout::kErrorPeer)) + " " +
                std::to_string(word(EpDeviceLayout::kErrorTokens)) +
                ": an expert-parallel training step takes the same count "
                "on every rank (its saved rows are sized for it). Results "
                "since are not valid, a backward writes no gradient, and "
                "the group must be started again");
  std::string self = "rank " + std::to_string(group.rank);
  std::string peer = "rank " + std::to_string(word(EpDeviceLayout::kErrorPeer));
  std::string after = "; results since are not valid, a backward writes no "
                      "gradient, and the group must be started again";
  switch (word(EpDeviceLayout::kError)) {
  case EpDeviceLayout::kRowsMismatch:
    return fail(self + " received counts and records from " + peer +
                " that disagree: " +
                std::to_string(word(EpDeviceLayout::kErrorTokens)) +
                " expert rows claimed (or records sent past the capacity), " +
                std::to_string(word(EpDeviceLayout::kErrorOwn)) +
                " filled, or choices that found no row" + after);
  case EpDeviceLayout::kRowsRefused:
    return fail(peer + " refused the rows " + self +
                " sent it: their counts and records disagreed there" + after);
  case EpDeviceLayout::kBadReturn:
    return fail(peer + " gave " + self + " return base " +
                std::to_string(word(EpDeviceLayout::kErrorTokens)) +
                " for the " + std::to_string(word(EpDeviceLayout::kErrorOwn)) +
                " rows owed it; a combine area holds " +
                std::to_string(group.layout.recvLayout.maxTokens *
                               group.layout.recvLayout.topK) +
                ", so " + self + " sent it none" + after);
  default:
    break;
  }
  if (!group.proxyError.empty())
    return fail(self + "'s proxy could not send: " + group.proxyError);
  return fail(self + " waited " + std::to_string(group.timeoutMs) +
              " ms for rank " +
              std::to_string(word(EpDeviceLayout::kErrorPeer)) +
              ", which never arrived (it died or did not run the same "
              "forward); results since are not valid");
}

void moe_ep_cuda_finalize(void) {
  if (!group.state)
    return;
  // Every rank stops writing into the others' states before any unmaps
  // (through the proxy: its thread forwards what is staged, then meets the
  // others).
  group.driver->cuCtxSynchronize();
  std::string label = "rank " + std::to_string(group.rank);
  moert_kernel_times_report(label.c_str());
  if (!group.proxy)
    moe_transport_barrier(group.transport, -1);
  release();
}

void moe_ep_cuda_leave(void) {
  if (!group.state)
    return;
  // This rank's kernels are done (their waits are bounded); nobody is met.
  // Leave may run on any thread (a collection): the state's context.
  CudaDevice::Driver *driver = group.driver;
  void *context = group.context, *current = nullptr;
  driver->cuCtxGetCurrent(&current);
  if (current != context)
    driver->cuCtxSetCurrent(context);
  driver->cuCtxSynchronize();
  group.leaving.store(true, std::memory_order_release);
  if (!group.proxy) {
    // Peers that still run may write into this rank's state: it stays
    // allocated (until exit), only the mappings of theirs are closed.
    // Through the proxy the transport is closed before its memory is
    // freed, so no peer writes land there after.
    group.state = 0;
  }
  release();
  if (current != context)
    driver->cuCtxSetCurrent(current);
}

} // extern "C"
