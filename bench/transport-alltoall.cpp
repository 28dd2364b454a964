//===- transport-alltoall.cpp - All-to-all latency and bandwidth ----------===//
//
// Forks --ranks processes on loopback, bootstraps them through rank 0, and
// times moe_transport_alltoallv with the same size to every peer. Rank 0
// prints one row per size: mean latency of one all-to-all and the bandwidth
// one rank sends to its peers (bytes to other ranks / latency).
//
//   moe-transport-bench --provider "tcp;ofi_rxm" --domain lo --ranks 4
//       --sizes 64,4096,65536,1048576
//
//===----------------------------------------------------------------------===//
#include "moe_transport.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

struct Options {
  const char *provider = "tcp;ofi_rxm";
  const char *domain = nullptr;
  int ranks = 2;
  std::vector<uint64_t> sizes = {64, 4096, 65536, 1 << 20};
  uint64_t totalBytes = 256ull << 20; // per size, bounds the iterations
};

int usage(const char *program) {
  fprintf(stderr,
          "usage: %s [--provider NAME] [--domain NAME] [--ranks N] "
          "[--sizes B,B,...]\n",
          program);
  return 2;
}

bool parse(int argc, char **argv, Options &options) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc)
      return false;
    const char *value = argv[++i];
    if (flag == "--provider") {
      options.provider = value;
    } else if (flag == "--domain") {
      options.domain = value;
    } else if (flag == "--ranks") {
      options.ranks = atoi(value);
    } else if (flag == "--sizes") {
      options.sizes.clear();
      for (const char *p = value; *p;) {
        char *end;
        options.sizes.push_back(strtoull(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p)
          return false;
      }
    } else {
      return false;
    }
  }
  return options.ranks >= 1 && options.ranks <= 64 && !options.sizes.empty();
}

#define CHECK(call)                                                            \
  do {                                                                         \
    if ((call) != MOE_TRANSPORT_OK) {                                          \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call,                        \
              moe_transport_last_error());                                     \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int runRank(const Options &options, int rank, int port, int listenFd) {
  uint64_t largest = 0;
  for (uint64_t size : options.sizes)
    largest = std::max(largest, size);
  moe_transport_config_t config;
  moe_transport_config_init(&config);
  config.rank = rank;
  config.world_size = options.ranks;
  config.provider = options.provider;
  config.domain = options.domain;
  config.send_bytes = config.recv_bytes = options.ranks * largest + 1;
  moe_transport_t *transport = nullptr;
  CHECK(moe_transport_open(&config, &transport));
  CHECK(moe_transport_bootstrap(transport, "127.0.0.1", port, listenFd));
  if (rank == 0)
    printf("%-12s %5s %10s %12s %12s %8s\n", "provider", "ranks", "bytes/peer",
           "latency_us", "send_MB/s", "iters");

  int world = options.ranks;
  std::vector<uint64_t> offsets(world), bytes(world), recvOffsets(world),
      recvBytes(world);
  for (uint64_t size : options.sizes) {
    for (int peer = 0; peer < world; ++peer) {
      offsets[peer] = peer * size;
      bytes[peer] = size;
    }
    uint64_t perIteration = std::max<uint64_t>(size * (world - 1), 1);
    int iterations = static_cast<int>(std::min<uint64_t>(
        2000, std::max<uint64_t>(20, options.totalBytes / perIteration)));
    for (int i = 0; i < 10; ++i)
      CHECK(moe_transport_alltoallv(transport, offsets.data(), bytes.data(),
                                    recvOffsets.data(), recvBytes.data(), -1));
    CHECK(moe_transport_barrier(transport, -1));
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i)
      CHECK(moe_transport_alltoallv(transport, offsets.data(), bytes.data(),
                                    recvOffsets.data(), recvBytes.data(), -1));
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    CHECK(moe_transport_barrier(transport, -1));
    if (rank == 0) {
      double latency = seconds / iterations;
      printf("%-12s %5d %10llu %12.1f %12.1f %8d\n",
             moe_transport_provider(transport), world, (unsigned long long)size,
             latency * 1e6, size * (world - 1) / latency / 1e6, iterations);
      fflush(stdout);
    }
  }
  moe_transport_close(transport);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  Options options;
  if (!parse(argc, argv, options))
    return usage(argv[0]);
  int listenFd = -1, port = 0;
  if (moe_transport_bootstrap_listen("127.0.0.1", 0, &listenFd, &port) !=
      MOE_TRANSPORT_OK) {
    fprintf(stderr, "%s\n", moe_transport_last_error());
    return 1;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < options.ranks; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      if (rank != 0)
        close(listenFd);
      _exit(runRank(options, rank, port, rank == 0 ? listenFd : -1));
    }
    pids.push_back(pid);
  }
  close(listenFd);
  int failures = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failures += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  return failures ? 1 : 0;
}
