//===- Communicator.cpp - Set-up and the producer side --------------------===//
#include "Communicator.h"

#include "Bootstrap.h"
#include "CommandRing.h"

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <unistd.h>

namespace moe::transport {

namespace {
constexpr int kDefaultTimeoutMs = 30000;
constexpr int kDefaultPeerTimeoutMs = 10000;
constexpr uint32_t kDefaultRingCapacity = 1024;
// 40 MiB of commands: far more than a proxy drains between two polls.
constexpr uint32_t kMaxRingCapacity = 1u << 20;
constexpr uint64_t kMaxChunkBytes = 1ull << 30;
constexpr size_t kPageBytes = 4096;

void *allocateZeroed(size_t bytes) {
  // Rounding up to whole pages must not wrap around for absurd sizes.
  if (bytes > SIZE_MAX - (kPageBytes - 1))
    return nullptr;
  size_t rounded = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void *buffer = aligned_alloc(kPageBytes, rounded);
  if (buffer)
    memset(buffer, 0, rounded);
  return buffer;
}

/// Identifies this boot of this host, so ranks know whose pids they can check.
uint64_t hostId() {
  char text[512] = {};
  gethostname(text, 256);
  if (FILE *file = fopen("/proc/sys/kernel/random/boot_id", "r")) {
    size_t length = strlen(text);
    if (!fgets(text + length, sizeof(text) - length, file))
      text[length] = '\0';
    fclose(file);
  }
  uint64_t hash = 0xcbf29ce484222325ull; // FNV-1a
  for (const char *c = text; *c; ++c)
    hash = (hash ^ static_cast<uint8_t>(*c)) * 0x100000001b3ull;
  return hash;
}

/// False once the process has exited (gone, or a zombie not yet reaped).
bool processAlive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return false;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE *file = fopen(path, "r");
  if (!file)
    return true; // no procfs: trust kill()
  char stat[512] = {};
  size_t length = fread(stat, 1, sizeof(stat) - 1, file);
  fclose(file);
  stat[length] = '\0';
  const char *end = strrchr(stat, ')'); // the name may contain spaces
  return !(end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X'));
}

/// How long a stopping proxy may take: it drains (up to 1 s), says goodbye
/// (up to 1 s) and quiesces (up to 0.5 s).
constexpr auto kProxyStopTime = std::chrono::seconds(4);
} // namespace

void idlePause(Clock::duration idleFor) {
  using std::chrono::microseconds;
  if (idleFor < microseconds(50))
    sched_yield();
  else if (idleFor < std::chrono::milliseconds(2))
    std::this_thread::sleep_for(microseconds(20));
  else
    std::this_thread::sleep_for(microseconds(200));
}

Status Communicator::open(const moe_transport_config_t &config,
                          std::unique_ptr<Communicator> &out) {
  if (config.world_size < 1 || config.world_size > MOE_TRANSPORT_MAX_RANKS)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "world_size %d is outside [1, %d]", config.world_size,
                     MOE_TRANSPORT_MAX_RANKS);
  if (config.rank < 0 || config.rank >= config.world_size)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "rank %d is outside [0, %d)", config.rank,
                     config.world_size);
  if (config.send_bytes == 0 || config.recv_bytes == 0)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "send_bytes and recv_bytes must be nonzero (got %zu and "
                     "%zu)",
                     config.send_bytes, config.recv_bytes);
  uint32_t capacity =
      config.ring_capacity ? config.ring_capacity : kDefaultRingCapacity;
  if (!isPowerOfTwo(capacity) || capacity > kMaxRingCapacity)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "ring_capacity %u is not a power of two up to %u",
                     capacity, kMaxRingCapacity);

  std::unique_ptr<Communicator> comm(new Communicator());
  comm->rank_ = config.rank;
  comm->worldSize_ = config.world_size;
  comm->timeoutMs_ =
      config.timeout_ms > 0 ? config.timeout_ms : kDefaultTimeoutMs;
  comm->peerTimeoutMs_ = config.peer_timeout_ms > 0 ? config.peer_timeout_ms
                                                    : kDefaultPeerTimeoutMs;
  if (Status status = comm->fabric_.open(config.provider, config.domain);
      status.failed())
    return status;
  comm->chunkBytes_ =
      std::min<uint64_t>(comm->fabric_.maxMessageSize(), kMaxChunkBytes);

  size_t world = static_cast<size_t>(config.world_size);
  struct Buffer {
    void *given;
    size_t bytes;
    uint64_t access;
    Region &region;
  } buffers[] = {
      {config.send_buffer, config.send_bytes, FI_WRITE, comm->sendRegion_},
      {config.recv_buffer, config.recv_bytes, FI_REMOTE_WRITE,
       comm->recvRegion_},
      // Counts we send and counts peers write to us.
      {nullptr, (world + 1) * (world + 1) * sizeof(uint64_t),
       FI_WRITE | FI_REMOTE_WRITE, comm->controlRegion_},
  };
  for (Buffer &buffer : buffers) {
    void *base = buffer.given;
    if (!base) {
      base = allocateZeroed(buffer.bytes);
      if (!base)
        return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                         "cannot allocate %zu bytes", buffer.bytes);
      comm->ownedBuffers_.push_back(base);
    }
    if (Status status = comm->fabric_.registerRegion(
            base, buffer.bytes, buffer.access, buffer.region);
        status.failed())
      return status;
  }

  comm->slots_.assign(capacity, moe_transport_command_t{});
  comm->ring_.capacity = capacity;
  comm->ring_.slots = comm->slots_.data();
  comm->arrivals_.reset(
      new std::atomic<uint64_t>[world * MOE_TRANSPORT_NUM_COUNTERS]());
  comm->barriers_.reset(new std::atomic<uint64_t>[world]());
  comm->lost_.reset(new std::atomic<bool>[world]());
  comm->departed_.reset(new std::atomic<bool>[world]());
  comm->expectedCounts_.assign(world, 0);
  comm->expectedPayload_.assign(world, 0);
  out = std::move(comm);
  return Status::ok();
}

bool Communicator::stopProxy() {
  if (!proxy_.joinable())
    return !proxyDetached_;
  stopProxy_.store(true, std::memory_order_release);
  Clock::time_point deadline = Clock::now() + kProxyStopTime;
  while (!proxyExited_.load(std::memory_order_acquire)) {
    if (Clock::now() > deadline) {
      proxy_.detach();
      proxyDetached_ = true;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  proxy_.join();
  return true;
}

Communicator::~Communicator() {
  // A proxy stuck in the provider still uses the endpoint and the buffers:
  // leave them (the owner should have leaked this object, as
  // moe_transport_close does, since the thread also uses its members).
  if (!stopProxy()) {
    fabric_.abandon();
    return;
  }
  // Buffers an endpoint that would not close may still use are left too.
  if (!fabric_.close())
    return;
  for (void *buffer : ownedBuffers_)
    free(buffer);
}

moe_transport_peer_info_t Communicator::localInfo() const {
  moe_transport_peer_info_t info = {};
  info.rank = static_cast<uint32_t>(rank_);
  info.recv_base = recvRegion_.remoteBase;
  info.recv_key = recvRegion_.key;
  info.recv_bytes = recvRegion_.bytes;
  info.control_base = controlRegion_.remoteBase;
  info.control_key = controlRegion_.key;
  info.host_id = hostId();
  info.pid = static_cast<uint32_t>(getpid());
  // Read at open: the endpoint belongs to the proxy thread once it runs.
  const std::vector<uint8_t> &address = fabric_.localAddress();
  info.address_length = static_cast<uint32_t>(address.size());
  memcpy(info.address, address.data(), address.size());
  return info;
}

Status Communicator::connect(const moe_transport_peer_info_t *peers) {
  if (connected_)
    return makeError(MOE_TRANSPORT_ERR_STATE, "rank %d is already connected",
                     rank_);
  std::vector<std::vector<uint8_t>> addresses;
  for (int peer = 0; peer < worldSize_; ++peer) {
    const moe_transport_peer_info_t &info = peers[peer];
    if (info.rank != static_cast<uint32_t>(peer) || info.address_length == 0 ||
        info.address_length > MOE_TRANSPORT_MAX_ADDRESS)
      return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                       "peer info %d is malformed (rank %u, address of %u "
                       "bytes)",
                       peer, info.rank, info.address_length);
    addresses.emplace_back(info.address, info.address + info.address_length);
  }
  if (Status status = fabric_.insertPeers(addresses); status.failed())
    return status;
  peers_.assign(peers, peers + worldSize_);

  size_t depth =
      std::max<size_t>(16, std::min<size_t>(fabric_.transmitDepth(), 256));
  operations_.assign(depth, Operation{});
  for (Operation &operation : operations_)
    freeOperations_.push_back(&operation);
  // Enough for a heartbeat to every peer, but never most of the depth.
  reservedOperations_ =
      std::min<size_t>(static_cast<size_t>(worldSize_ - 1), depth / 4);
  heartbeatDue_.assign(worldSize_, 0);
  lastHeard_.assign(worldSize_, Clock::now());
  lastHeartbeat_ = Clock::now();
  connected_ = true;
  proxyTickNs_.store(Clock::now().time_since_epoch().count());
  proxy_ = std::thread([this] { runProxy(); });
  return Status::ok();
}

Status Communicator::bootstrap(const char *host, int port, int listenFd) {
  if (connected_) {
    if (listenFd >= 0)
      ::close(listenFd);
    return makeError(MOE_TRANSPORT_ERR_STATE, "rank %d is already connected",
                     rank_);
  }
  std::vector<moe_transport_peer_info_t> all;
  if (Status status = exchangePeerInfo(host, port, listenFd, rank_, worldSize_,
                                       timeoutMs_, localInfo(), all);
      status.failed())
    return status;
  return connect(all.data());
}

void Communicator::fail(const Status &status) {
  std::lock_guard<std::mutex> lock(failureMutex_);
  if (failedCode_.load(std::memory_order_relaxed) != MOE_TRANSPORT_OK)
    return;
  failure_ = status;
  failedCode_.store(status.code(), std::memory_order_release);
}

int Communicator::deadLocalPeer() const {
  uint64_t here = hostId();
  for (int peer = 0; peer < worldSize_; ++peer)
    if (peer != rank_ && !departed_[peer].load() &&
        peers_[peer].host_id == here && peers_[peer].pid &&
        !processAlive(static_cast<pid_t>(peers_[peer].pid)))
      return peer;
  return -1;
}

void Communicator::checkProxyAlive(Clock::time_point now) {
  if (!connected_)
    return;
  // The proxy is stuck only if this thread watched its tick stand still for
  // the whole peer timeout. A gap in the watching (the process was stopped,
  // or this thread did not wait for a while) proves nothing: after a stop
  // this thread may run before the proxy has had a turn.
  int64_t tick = proxyTickNs_.load(std::memory_order_relaxed);
  auto slack = std::chrono::milliseconds(peerTimeoutMs_) / 2;
  if (tick != watchedTick_ || now - lastWatch_ > slack) {
    watchedTick_ = tick;
    tickSeenAt_ = now;
  }
  lastWatch_ = now;
  auto stuck =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - tickSeenAt_);
  if (stuck.count() <= peerTimeoutMs_)
    return;
  // The provider call the proxy is in never returns. The dead process is
  // the one to name; failing that, the peer the write was for.
  int writingTo = proxyWritingTo_.load();
  int dead = deadLocalPeer();
  if (dead >= 0)
    markLost(dead, format("its process (pid %u) is gone and the proxy has "
                          "been stuck in the provider for %lld ms",
                          peers_[dead].pid, (long long)stuck.count()));
  else if (writingTo >= 0)
    markLost(writingTo, format("the proxy has been stuck for %lld ms in a "
                               "write to it",
                               (long long)stuck.count()));
  else
    fail(makeError(MOE_TRANSPORT_ERR_PEER_LOST,
                   "rank %d: the proxy has been stuck in the provider for "
                   "%lld ms (a peer may have died mid-operation)",
                   rank_, (long long)stuck.count()));
}

Status Communicator::failure() const {
  std::lock_guard<std::mutex> lock(failureMutex_);
  return failure_;
}

Status Communicator::checkUsable() const {
  if (!connected_)
    return makeError(MOE_TRANSPORT_ERR_STATE,
                     "rank %d is not connected: call bootstrap or connect "
                     "first",
                     rank_);
  if (failedCode_.load(std::memory_order_acquire) != MOE_TRANSPORT_OK)
    return failure();
  return Status::ok();
}

Status Communicator::validate(const moe_transport_command_t &command) const {
  if (command.kind == kBarrierControl)
    return Status::ok();
  if (command.kind == MOE_TRANSPORT_CMD_BARRIER)
    return command.counter < MOE_TRANSPORT_NUM_COUNTERS
               ? Status::ok()
               : makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                           "counter %u is out of range: there are %d counters",
                           command.counter, MOE_TRANSPORT_NUM_COUNTERS);
  if (command.kind != MOE_TRANSPORT_CMD_WRITE && command.kind != kWriteControl)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "unknown command kind %u", command.kind);
  if (command.peer >= static_cast<uint32_t>(worldSize_))
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "peer %u is out of range: world size is %d", command.peer,
                     worldSize_);
  if (command.counter >= MOE_TRANSPORT_NUM_COUNTERS)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "counter %u is out of range: there are %d counters",
                     command.counter, MOE_TRANSPORT_NUM_COUNTERS);
  bool control = command.kind == kWriteControl;
  uint64_t sourceBytes = control ? controlRegion_.bytes : sendRegion_.bytes;
  if (!inBounds(command.src_offset, command.length, sourceBytes))
    return makeError(MOE_TRANSPORT_ERR_OUT_OF_BOUNDS,
                     "write of %llu bytes at offset %llu runs past the send "
                     "buffer (%llu bytes)",
                     (unsigned long long)command.length,
                     (unsigned long long)command.src_offset,
                     (unsigned long long)sourceBytes);
  uint64_t targetBytes =
      control ? controlRegion_.bytes : peers_[command.peer].recv_bytes;
  if (!inBounds(command.remote_offset, command.length, targetBytes))
    return makeError(MOE_TRANSPORT_ERR_OUT_OF_BOUNDS,
                     "write of %llu bytes at remote offset %llu runs past "
                     "rank %u's receive buffer (%llu bytes)",
                     (unsigned long long)command.length,
                     (unsigned long long)command.remote_offset, command.peer,
                     (unsigned long long)targetBytes);
  if (command.length > fabric_.maxMessageSize())
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "write of %llu bytes exceeds provider '%s''s limit of "
                     "%zu bytes",
                     (unsigned long long)command.length,
                     fabric_.providerName().c_str(), fabric_.maxMessageSize());
  return Status::ok();
}

Clock::time_point Communicator::deadlineAfter(int timeoutMs) const {
  return Clock::now() + std::chrono::milliseconds(effectiveTimeout(timeoutMs));
}

Status Communicator::enqueue(const moe_transport_command_t &command,
                             Clock::time_point deadline, int timeoutMs) {
  if (Status status = validate(command); status.failed())
    return status;
  Status status = waitFor(
      deadline, [&] { return ringTryPush(ring_, command); },
      [&] {
        return format("command ring full: %llu commands pending after %d ms "
                      "(the proxy is not keeping up or has stopped)",
                      (unsigned long long)ring_.capacity,
                      effectiveTimeout(timeoutMs));
      });
  if (status.code() == MOE_TRANSPORT_ERR_TIMEOUT)
    return Status::error(MOE_TRANSPORT_ERR_RING_FULL, status.message());
  if (!status.failed())
    ++commandsPosted_;
  return status;
}

Status Communicator::post(const moe_transport_command_t &command,
                          int timeoutMs) {
  if (Status status = checkUsable(); status.failed())
    return status;
  if (command.kind == kWriteControl || command.kind == kBarrierControl)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "unknown command kind %u", command.kind);
  // The all-to-all counts its steps on these: a raw write there would make
  // the next all-to-all miscount.
  if (command.counter == MOE_TRANSPORT_COUNTER_ALLTOALL_COUNTS ||
      command.counter == MOE_TRANSPORT_COUNTER_ALLTOALL_PAYLOAD)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "counter %u belongs to the all-to-all; raw commands use "
                     "counters 2 to %d",
                     command.counter, MOE_TRANSPORT_NUM_COUNTERS - 1);
  return enqueue(command, deadlineAfter(timeoutMs), timeoutMs);
}

uint64_t Communicator::arrivals(int peer, uint32_t counter) const {
  if (peer < 0 || peer >= worldSize_ || counter >= MOE_TRANSPORT_NUM_COUNTERS ||
      !arrivals_)
    return 0;
  return arrivalCounter(peer, counter).load(std::memory_order_acquire);
}

Status Communicator::waitArrivals(int peer, uint32_t counter, uint64_t target,
                                  int timeoutMs) {
  if (Status status = checkUsable(); status.failed())
    return status;
  if (peer < 0 || peer >= worldSize_ || counter >= MOE_TRANSPORT_NUM_COUNTERS)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "peer %d / counter %u out of range (world size %d, %d "
                     "counters)",
                     peer, counter, worldSize_, MOE_TRANSPORT_NUM_COUNTERS);
  std::atomic<uint64_t> &arrived = arrivalCounter(peer, counter);
  auto ready = [&] {
    return arrived.load(std::memory_order_acquire) >= target;
  };
  return waitFor(
      deadlineAfter(timeoutMs), ready,
      [&] {
        return format("timed out after %d ms waiting for rank %d: %llu of "
                      "%llu writes arrived on counter %u",
                      effectiveTimeout(timeoutMs), peer,
                      (unsigned long long)arrived.load(),
                      (unsigned long long)target, counter);
      },
      [&] { return departed(peer) && !ready() ? peer : -1; });
}

Status Communicator::waitForAll(uint32_t counter,
                                const std::vector<uint64_t> &expected,
                                Clock::time_point deadline, int timeoutMs,
                                const char *what) {
  return waitFor(
      deadline,
      [&] {
        for (int peer = 0; peer < worldSize_; ++peer)
          if (arrivalCounter(peer, counter).load(std::memory_order_acquire) <
              expected[peer])
            return false;
        return true;
      },
      [&] {
        std::string missing = joinRanks(worldSize_, [&](int peer) {
          uint64_t arrived = arrivalCounter(peer, counter).load();
          return arrived < expected[peer]
                     ? format("rank %d (%llu of %llu)", peer,
                              (unsigned long long)arrived,
                              (unsigned long long)expected[peer])
                     : std::string();
        });
        return format("timed out after %d ms waiting for %s from %s",
                      effectiveTimeout(timeoutMs), what, missing.c_str());
      },
      [&] {
        for (int peer = 0; peer < worldSize_; ++peer)
          if (departed(peer) &&
              arrivalCounter(peer, counter).load(std::memory_order_acquire) <
                  expected[peer])
            return peer;
        return -1;
      });
}

Status Communicator::flush(int timeoutMs) {
  if (Status status = checkUsable(); status.failed())
    return status;
  return flushUntil(deadlineAfter(timeoutMs), timeoutMs);
}

Status Communicator::flushUntil(Clock::time_point deadline, int timeoutMs) {
  return waitFor(
      deadline,
      [&] {
        return commandsCompleted_.load(std::memory_order_acquire) >=
               commandsPosted_;
      },
      [&] {
        return format("timed out after %d ms waiting for local completion "
                      "of %llu commands (%llu done)",
                      effectiveTimeout(timeoutMs),
                      (unsigned long long)commandsPosted_,
                      (unsigned long long)commandsCompleted_.load());
      });
}

Status Communicator::barrier(int timeoutMs) {
  if (Status status = checkUsable(); status.failed())
    return status;
  Clock::time_point deadline = deadlineAfter(timeoutMs);
  moe_transport_command_t command = {};
  command.kind = kBarrierControl;
  if (Status status = enqueue(command, deadline, timeoutMs); status.failed())
    return status;
  uint64_t generation = ++barrierGeneration_;
  return waitFor(
      deadline,
      [&] {
        for (int peer = 0; peer < worldSize_; ++peer)
          if (barriers_[peer].load(std::memory_order_acquire) < generation)
            return false;
        return true;
      },
      [&] {
        std::string missing = joinRanks(worldSize_, [&](int peer) {
          return barriers_[peer].load() < generation ? format("rank %d", peer)
                                                     : std::string();
        });
        return format("timed out after %d ms in barrier %llu waiting for "
                      "%s",
                      effectiveTimeout(timeoutMs),
                      (unsigned long long)generation, missing.c_str());
      },
      [&] {
        for (int peer = 0; peer < worldSize_; ++peer)
          if (departed(peer) &&
              barriers_[peer].load(std::memory_order_acquire) < generation)
            return peer;
        return -1;
      });
}

} // namespace moe::transport
