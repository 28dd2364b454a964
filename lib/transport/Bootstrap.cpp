//===- Bootstrap.cpp - Address exchange through rank 0 over TCP -----------===//
//
// Each rank sends rank 0 a Hello with its info; rank 0 answers every rank
// with a Reply: either the full table or the reason the exchange failed.
// All ranks run the same binary, so fixed-size structs go on the wire as is.
//
//===----------------------------------------------------------------------===//
#include "Bootstrap.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace moe::transport {

namespace {
constexpr uint32_t kMagic = 0x6d6f6531; // "moe1"

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint32_t worldSize;
  uint32_t reserved;
  moe_transport_peer_info_t info;
};

struct Reply {
  uint32_t magic;
  uint32_t ok;
  char error[256]; // why the exchange failed, when !ok
};

using Clock = std::chrono::steady_clock;

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

/// Waits for fd to become ready for events; false on timeout.
bool waitReady(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd entry = {fd, events, 0};
    int ready = poll(&entry, 1, remainingMs(deadline));
    if (ready > 0)
      return true;
    if (ready == 0 || errno != EINTR)
      return false;
  }
}

bool sendAll(int fd, const void *data, size_t length,
             Clock::time_point deadline) {
  auto *bytes = static_cast<const uint8_t *>(data);
  while (length > 0) {
    if (!waitReady(fd, POLLOUT, deadline))
      return false;
    ssize_t sent = send(fd, bytes, length, MSG_NOSIGNAL);
    if (sent < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (sent <= 0)
      return false;
    bytes += sent;
    length -= static_cast<size_t>(sent);
  }
  return true;
}

enum class Received { All, TimedOut, Closed, Failed };

Received receiveAll(int fd, void *data, size_t length,
                    Clock::time_point deadline) {
  auto *bytes = static_cast<uint8_t *>(data);
  while (length > 0) {
    if (!waitReady(fd, POLLIN, deadline))
      return Received::TimedOut;
    ssize_t received = recv(fd, bytes, length, 0);
    if (received < 0 &&
        (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (received == 0)
      return Received::Closed;
    if (received < 0)
      return Received::Failed;
    bytes += received;
    length -= static_cast<size_t>(received);
  }
  return Received::All;
}

/// getaddrinfo would take a port past 16 bits modulo 2^16.
Status checkPort(int port) {
  if (port < 0 || port > 65535)
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "bootstrap port %d is outside [0, 65535]", port);
  return Status::ok();
}

Status resolve(const char *host, int port, sockaddr_storage &address,
               socklen_t &length) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *result = nullptr;
  std::string service = std::to_string(port);
  int error = getaddrinfo(host, service.c_str(), &hints, &result);
  if (error != 0 || !result)
    return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                     "bootstrap: cannot resolve '%s': %s", host,
                     gai_strerror(error));
  memcpy(&address, result->ai_addr, result->ai_addrlen);
  length = result->ai_addrlen;
  freeaddrinfo(result);
  return Status::ok();
}

bool setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

/// One connection attempt that gives up at the deadline: a blocking
/// connect() can take the kernel's SYN retries (minutes) when rank 0's host
/// does not answer. 0 on success, else an errno value.
int connectBefore(int fd, const sockaddr_storage &address, socklen_t length,
                  Clock::time_point deadline) {
  if (!setNonBlocking(fd))
    return errno;
  if (connect(fd, reinterpret_cast<const sockaddr *>(&address), length) == 0)
    return 0;
  // EINTR: the connection still proceeds asynchronously, as EINPROGRESS.
  if (errno != EINPROGRESS && errno != EINTR)
    return errno;
  if (!waitReady(fd, POLLOUT, deadline))
    return ETIMEDOUT;
  int error = 0;
  socklen_t size = sizeof(error);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0)
    return errno;
  return error;
}

/// Connects to rank 0, retrying while it is not listening yet.
Status connectToRoot(const char *host, int port, Clock::time_point deadline,
                     int timeoutMs, int &fd) {
  sockaddr_storage address;
  socklen_t length;
  if (Status status = resolve(host, port, address, length); status.failed())
    return status;
  for (;;) {
    fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP, "bootstrap: socket: %s",
                       strerror(errno));
    // The socket stays non-blocking: sends and receives poll first.
    int error = connectBefore(fd, address, length, deadline);
    if (error == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Status::ok();
    }
    ::close(fd);
    fd = -1;
    if (remainingMs(deadline) == 0)
      return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                       "bootstrap: rank 0 not reachable at %s:%d within %d "
                       "ms: %s",
                       host, port, timeoutMs, strerror(error));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status runRoot(const char *host, int port, int listenFd, int worldSize,
               int timeoutMs, Clock::time_point deadline,
               const moe_transport_peer_info_t &mine,
               std::vector<moe_transport_peer_info_t> &all) {
  if (listenFd < 0) {
    int boundPort;
    if (Status status = bootstrapListen(host, port, listenFd, boundPort);
        status.failed())
      return status;
  }
  // Connections are served together, each Hello read as its bytes come: a
  // client that connects and says nothing (or says it slowly) cannot hold
  // up the ranks behind it.
  setNonBlocking(listenFd);
  all.assign(worldSize, moe_transport_peer_info_t{});
  all[0] = mine;
  std::vector<int> clients(worldSize, -1);
  struct Pending {
    int fd;
    size_t got;
    Hello hello;
  };
  std::vector<Pending> pending;
  // Strangers beyond this many are turned away at once.
  const size_t maxPending = 2 * static_cast<size_t>(worldSize) + 16;
  int joined = 1;
  Status status = Status::ok();
  while (joined < worldSize && !status.failed()) {
    // A stream of strangers keeps poll() ready: the deadline still holds.
    bool late = Clock::now() >= deadline;
    std::vector<pollfd> fds = {{listenFd, POLLIN, 0}};
    for (const Pending &p : pending)
      fds.push_back({p.fd, POLLIN, 0});
    int ready = late ? 0 : poll(fds.data(), fds.size(), remainingMs(deadline));
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready < 0) {
      status = makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                         "bootstrap: rank 0 cannot wait for connections: %s",
                         strerror(errno));
      break;
    }
    if (ready == 0) {
      std::string missing = joinRanks(worldSize, [&](int rank) {
        return rank > 0 && clients[rank] < 0 ? format("rank %d", rank)
                                             : std::string();
      });
      status = makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                         "bootstrap: %s never connected to rank 0 (port %d) "
                         "within %d ms",
                         missing.c_str(), port, timeoutMs);
      break;
    }
    // Backwards, so that erasing keeps the remaining indices valid.
    for (size_t i = pending.size(); i-- > 0 && !status.failed();) {
      if (!fds[i + 1].revents)
        continue;
      Pending &p = pending[i];
      ssize_t n = recv(p.fd, reinterpret_cast<uint8_t *>(&p.hello) + p.got,
                       sizeof(Hello) - p.got, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
        continue;
      if (n > 0)
        p.got += static_cast<size_t>(n);
      // Gone, or not one of ours: forget it and keep waiting.
      if (n <= 0 ||
          (p.got >= sizeof(p.hello.magic) && p.hello.magic != kMagic)) {
        ::close(p.fd);
        pending.erase(pending.begin() + i);
        continue;
      }
      if (p.got < sizeof(Hello))
        continue;
      Hello hello = p.hello;
      int client = p.fd;
      pending.erase(pending.begin() + i);
      if (hello.worldSize != static_cast<uint32_t>(worldSize) ||
          hello.rank == 0 || hello.rank >= hello.worldSize ||
          clients[hello.rank] >= 0) {
        status =
            makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                      "bootstrap: a process claims rank %u of %u, but rank "
                      "0 expects %d ranks and that rank %s",
                      hello.rank, hello.worldSize, worldSize,
                      hello.rank < static_cast<uint32_t>(worldSize) &&
                              hello.rank != 0 && clients[hello.rank] >= 0
                          ? "already joined"
                          : "cannot exist");
        Reply reply = {kMagic, 0, {}};
        snprintf(reply.error, sizeof(reply.error), "%s",
                 status.message().c_str());
        sendAll(client, &reply, sizeof(reply), deadline);
        ::close(client);
        break;
      }
      clients[hello.rank] = client;
      all[hello.rank] = hello.info;
      ++joined;
    }
    if (fds[0].revents & POLLIN)
      for (;;) {
        int client =
            accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (client < 0)
          break;
        if (pending.size() >= maxPending) {
          ::close(client);
          continue;
        }
        pending.push_back({client, 0, {}});
      }
  }
  for (const Pending &p : pending)
    ::close(p.fd);
  ::close(listenFd);

  Reply reply = {kMagic, status.failed() ? 0u : 1u, {}};
  snprintf(reply.error, sizeof(reply.error), "%s", status.message().c_str());
  // The join deadline may have passed; the answer still deserves delivery.
  Clock::time_point replyDeadline =
      std::max(deadline, Clock::now() + std::chrono::milliseconds(1000));
  for (int rank = 1; rank < worldSize; ++rank) {
    int client = clients[rank];
    if (client < 0)
      continue;
    if (sendAll(client, &reply, sizeof(reply), replyDeadline) &&
        !status.failed())
      sendAll(client, all.data(), all.size() * sizeof(all[0]), replyDeadline);
    ::close(client);
  }
  return status;
}
} // namespace

Status bootstrapListen(const char *host, int port, int &listenFd,
                       int &boundPort) {
  if (Status status = checkPort(port); status.failed())
    return status;
  sockaddr_storage address;
  socklen_t length;
  if (Status status = resolve(host, port, address, length); status.failed())
    return status;
  int fd = socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP, "bootstrap: socket: %s",
                     strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr *>(&address), length) != 0 ||
      listen(fd, MOE_TRANSPORT_MAX_RANKS) != 0) {
    int error = errno;
    ::close(fd);
    return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                     "bootstrap: cannot listen on %s:%d: %s", host, port,
                     strerror(error));
  }
  length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length);
  boundPort = ntohs(address.ss_family == AF_INET6
                        ? reinterpret_cast<sockaddr_in6 &>(address).sin6_port
                        : reinterpret_cast<sockaddr_in &>(address).sin_port);
  listenFd = fd;
  return Status::ok();
}

Status exchangePeerInfo(const char *host, int port, int listenFd, int rank,
                        int worldSize, int timeoutMs,
                        const moe_transport_peer_info_t &mine,
                        std::vector<moe_transport_peer_info_t> &all) {
  if (Status status = checkPort(port); status.failed()) {
    if (listenFd >= 0)
      ::close(listenFd);
    return status;
  }
  Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(timeoutMs);
  if (rank == 0)
    return runRoot(host, port, listenFd, worldSize, timeoutMs, deadline, mine,
                   all);
  if (listenFd >= 0)
    ::close(listenFd);

  int fd = -1;
  if (Status status = connectToRoot(host, port, deadline, timeoutMs, fd);
      status.failed())
    return status;
  Hello hello = {kMagic, static_cast<uint32_t>(rank),
                 static_cast<uint32_t>(worldSize), 0, mine};
  // Rank 0 enforces the join deadline and then tells us why it gave up:
  // wait a little longer than it does so that its verdict reaches us.
  Clock::time_point replyDeadline =
      deadline + std::chrono::milliseconds(timeoutMs / 2 + 100);
  Reply reply;
  errno = 0;
  if (!sendAll(fd, &hello, sizeof(hello), deadline)) {
    int error = errno;
    ::close(fd);
    return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                     "bootstrap: rank %d could not send its address to rank 0 "
                     "at %s:%d: %s",
                     rank, host, port, error ? strerror(error) : "timed out");
  }
  Received received = receiveAll(fd, &reply, sizeof(reply), replyDeadline);
  if (received != Received::All || reply.magic != kMagic) {
    int error = errno;
    ::close(fd);
    if (received == Received::TimedOut)
      return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                       "bootstrap: rank %d got no answer from rank 0 at %s:%d "
                       "within %d ms",
                       rank, host, port, timeoutMs + timeoutMs / 2 + 100);
    if (received == Received::Closed)
      return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                       "bootstrap: rank 0 at %s:%d closed the connection "
                       "without answering rank %d",
                       host, port, rank);
    if (received == Received::Failed)
      return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                       "bootstrap: rank %d lost the connection to rank 0 at "
                       "%s:%d: %s",
                       rank, host, port, strerror(error));
    return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                     "bootstrap: rank %d got an unexpected reply from %s:%d "
                     "(magic 0x%08x, expected 0x%08x): is rank 0 there?",
                     rank, host, port, reply.magic, kMagic);
  }
  if (!reply.ok) {
    ::close(fd);
    reply.error[sizeof(reply.error) - 1] = '\0';
    return Status::error(MOE_TRANSPORT_ERR_BOOTSTRAP, reply.error);
  }
  all.assign(worldSize, moe_transport_peer_info_t{});
  bool delivered = receiveAll(fd, all.data(), all.size() * sizeof(all[0]),
                              replyDeadline) == Received::All;
  ::close(fd);
  if (!delivered)
    return makeError(MOE_TRANSPORT_ERR_BOOTSTRAP,
                     "bootstrap: rank 0 closed the connection before sending "
                     "the address table");
  return Status::ok();
}

} // namespace moe::transport
