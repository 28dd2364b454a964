//===- Fabric.h - One libfabric RDM endpoint with its resources -*- C++ -*-===//
#ifndef MOE_TRANSPORT_FABRIC_H
#define MOE_TRANSPORT_FABRIC_H

#include "Status.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>

#include <string>
#include <vector>

namespace moe::transport {

/// A registered memory region as local writes and remote peers address it.
struct Region {
  void *base = nullptr;
  size_t bytes = 0;
  void *desc = nullptr;    // local descriptor (needed under FI_MR_LOCAL)
  uint64_t key = 0;        // what peers pass as the RMA key
  uint64_t remoteBase = 0; // what peers add offsets to
};

/// Fabric, domain, endpoint, AV and CQ for one rank. Only the proxy thread
/// touches it once the proxy runs.
class Fabric {
public:
  Fabric() = default;
  Fabric(const Fabric &) = delete;
  Fabric &operator=(const Fabric &) = delete;
  ~Fabric() { close(); }

  /// Picks a provider (see moe_transport_config) and opens everything.
  Status open(const char *provider, const char *domain);
  /// False if the endpoint would not close: then everything is left as it
  /// is (abandoned), since the provider may still use it.
  bool close();
  /// Forgets every handle without closing it: for when a thread that cannot
  /// be stopped may still use them.
  void abandon();

  /// Registered regions stay registered until close().
  Status registerRegion(void *base, size_t bytes, uint64_t access,
                        Region &region);

  /// The endpoint's address, read once at open.
  const std::vector<uint8_t> &localAddress() const { return localAddress_; }
  Status insertPeers(const std::vector<std::vector<uint8_t>> &addresses);

  /// fi_writedata with a 32-bit immediate: 0, -FI_EAGAIN or another error.
  ssize_t write(const void *src, size_t length, void *desc, int peer,
                uint64_t remoteAddress, uint64_t key, uint32_t immediate,
                void *context) {
    return fi_writedata(endpoint_, src, length, desc, immediate,
                        peerAddresses_[peer], remoteAddress, key, context);
  }
  /// Reads up to count completions: count read, -FI_EAGAIN, -FI_EAVAIL.
  ssize_t readCompletions(fi_cq_data_entry *entries, size_t count) {
    return fi_cq_read(cq_, entries, count);
  }
  /// Reads the error behind -FI_EAVAIL; returns its text.
  bool readError(fi_cq_err_entry &error, std::string &text);

  const std::string &providerName() const { return providerName_; }
  const std::string &domainName() const { return domainName_; }
  bool hmemSupported() const { return hmemSupported_; }
  size_t maxMessageSize() const { return maxMessageSize_; }
  size_t transmitDepth() const { return transmitDepth_; }

private:
  Status check(int result, const char *what);

  fi_info *info_ = nullptr;
  fid_fabric *fabric_ = nullptr;
  fid_domain *domain_ = nullptr;
  fid_av *av_ = nullptr;
  fid_cq *cq_ = nullptr;
  fid_ep *endpoint_ = nullptr;
  std::vector<fid_mr *> regions_;
  std::vector<fi_addr_t> peerAddresses_;
  std::vector<uint8_t> localAddress_;
  std::string providerName_, domainName_;
  bool hmemSupported_ = false;
  bool virtualAddresses_ = false;
  uint64_t nextKey_ = 1;
  size_t maxMessageSize_ = 0;
  size_t transmitDepth_ = 0;
};

} // namespace moe::transport

#endif // MOE_TRANSPORT_FABRIC_H
