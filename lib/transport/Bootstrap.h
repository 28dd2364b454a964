//===- Bootstrap.h - Address exchange through rank 0 over TCP ---*- C++ -*-===//
#ifndef MOE_TRANSPORT_BOOTSTRAP_H
#define MOE_TRANSPORT_BOOTSTRAP_H

#include "Status.h"

#include <vector>

namespace moe::transport {

/// Binds and listens on host:port (0: any free port).
Status bootstrapListen(const char *host, int port, int &listenFd,
                       int &boundPort);

/// Gathers every rank's info at rank 0 and sends the table back to all.
/// Rank 0 listens on host:port, or on listenFd if >= 0 (and closes it); the
/// others connect, retrying until rank 0 is up. Rank 0 waits timeoutMs for
/// the others to join, they wait up to 1.5 times as long for its answer, and
/// a rank that never joins fails every rank with its name.
Status exchangePeerInfo(const char *host, int port, int listenFd, int rank,
                        int worldSize, int timeoutMs,
                        const moe_transport_peer_info_t &mine,
                        std::vector<moe_transport_peer_info_t> &all);

} // namespace moe::transport

#endif // MOE_TRANSPORT_BOOTSTRAP_H
