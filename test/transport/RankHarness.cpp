//===- RankHarness.cpp - Run test ranks as forked processes ---------------===//
#include "RankHarness.h"

#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace moe::transport::testing {

int RankContext::fail(int code, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(board->messages[rank], sizeof(board->messages[rank]), fmt, args);
  va_end(args);
  return code;
}

void RankContext::finishAndWaitForRelease(int limitMs) {
  board->finished[rank].store(1);
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(limitMs);
  while (!board->release.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

moe_transport_status_t RankContext::open(const Provider &provider,
                                         moe_transport_config_t config,
                                         moe_transport_t **out) {
  config.rank = rank;
  config.world_size = worldSize;
  config.provider = provider.name;
  config.domain = provider.domain;
  moe_transport_status_t status = moe_transport_open(&config, out);
  if (status != MOE_TRANSPORT_OK) {
    if (listenFd >= 0)
      close(listenFd);
    return status;
  }
  return moe_transport_bootstrap(*out, "127.0.0.1", port, listenFd);
}

std::vector<RankOutcome>
runRanks(int worldSize, int spawn, int limitMs,
         const std::function<int(RankContext &)> &body,
         const std::function<void(const std::vector<pid_t> &, Board &)>
             &whileRunning) {
  std::vector<RankOutcome> outcomes(spawn);
  void *mapping = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    outcomes[0].message = "mmap failed";
    return outcomes;
  }
  Board *board = new (mapping) Board();
  int listenFd = -1, port = 0;
  if (moe_transport_bootstrap_listen("127.0.0.1", 0, &listenFd, &port) !=
      MOE_TRANSPORT_OK) {
    outcomes[0].message = moe_transport_last_error();
    munmap(mapping, sizeof(Board));
    return outcomes;
  }

  std::vector<pid_t> pids(spawn, -1);
  for (int rank = 0; rank < spawn; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      if (rank != 0)
        close(listenFd);
      RankContext context = {rank, worldSize, port, rank == 0 ? listenFd : -1,
                             board};
      int code = body(context);
      // Skip gtest's and static destructors: the parent owns the test.
      _exit(code);
    }
    pids[rank] = pid;
  }
  close(listenFd);

  if (whileRunning)
    whileRunning(pids, *board);

  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(limitMs);
  int running = spawn;
  while (running > 0) {
    for (int rank = 0; rank < spawn; ++rank) {
      if (pids[rank] < 0)
        continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) != pids[rank])
        continue;
      outcomes[rank].exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      outcomes[rank].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids[rank] = -1;
      --running;
    }
    if (running == 0)
      break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < spawn; ++rank) {
        if (pids[rank] < 0)
          continue;
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], nullptr, 0);
        outcomes[rank].timedOut = true;
        pids[rank] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int rank = 0; rank < spawn; ++rank)
    outcomes[rank].message = board->messages[rank];
  munmap(mapping, sizeof(Board));
  return outcomes;
}

uint8_t payloadByte(int source, int target, uint64_t iteration,
                    uint64_t index) {
  uint64_t x = (iteration * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(source) << 48) ^
               (static_cast<uint64_t>(target) << 32) ^ index;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

uint64_t payloadSize(uint64_t seed, uint64_t iteration, int source, int target,
                     uint64_t maxBytes) {
  uint64_t x = seed ^ (iteration * 0xD6E8FEB86659FD93ull) ^
               (static_cast<uint64_t>(source) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(target) << 40);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  if ((x & 7) == 0)
    return 0;
  return (x >> 3) % (maxBytes + 1);
}

} // namespace moe::transport::testing
