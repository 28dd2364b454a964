//===- Fabric.cpp - One libfabric RDM endpoint with its resources ---------===//
#include "Fabric.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

namespace moe::transport {

namespace {
/// Frees a fi_getinfo list when it goes out of scope.
struct InfoList {
  fi_info *head = nullptr;
  ~InfoList() {
    if (head)
      fi_freeinfo(head);
  }
};

/// Providers offering what we need, in the order an unconfigured run picks
/// them: the production NICs first, then what every Linux host has.
const char *const kPreferredProviders[] = {"efa", "verbs;ofi_rxm",
                                           "tcp;ofi_rxm", "shm"};

fi_info *makeHints(const char *provider, const char *domain, bool hmem) {
  fi_info *hints = fi_allocinfo();
  if (!hints)
    return nullptr;
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0);
  // We can pass a context per operation, so providers needing one qualify.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // Everything we can cope with; the provider's answer says what applies.
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR |
                                FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                                (hmem ? FI_MR_HMEM : 0);
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  if (provider)
    hints->fabric_attr->prov_name = strdup(provider);
  if (domain)
    hints->domain_attr->name = strdup(domain);
  return hints;
}

int getInfo(const char *provider, const char *domain, bool hmem,
            InfoList &list) {
  fi_info *hints = makeHints(provider, domain, hmem);
  if (!hints)
    return -FI_ENOMEM;
  int result =
      fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &list.head);
  fi_freeinfo(hints);
  return result;
}

bool usable(const fi_info *info) {
  // EFA carries 4 bytes of immediate data; we never need more.
  return info->domain_attr->cq_data_size >= 4 && !(info->mode & FI_RX_CQ_DATA);
}
} // namespace

Status Fabric::check(int result, const char *what) {
  if (result >= 0)
    return Status::ok();
  return makeError(MOE_TRANSPORT_ERR_FABRIC, "%s failed on provider '%s': %s",
                   what, providerName_.c_str(), fi_strerror(-result));
}

namespace {
/// The inode of this process's pid namespace: pids mean something only in it.
unsigned long long pidNamespace() {
  struct stat info;
  if (stat("/proc/self/ns/pid", &info) != 0)
    return 0;
  return static_cast<unsigned long long>(info.st_ino);
}

/// Unlinks the shm regions named moe-<our pid namespace>-<pid>-* whose
/// process no longer exists (killed before it could close).
void removeStaleShmRegions() {
  DIR *dir = opendir("/dev/shm");
  if (!dir)
    return;
  char prefix[48];
  int prefixLength =
      std::snprintf(prefix, sizeof(prefix), "moe-%llu-", pidNamespace());
  while (dirent *entry = readdir(dir)) {
    if (std::strncmp(entry->d_name, prefix, prefixLength) != 0)
      continue;
    char *end = nullptr;
    long pid = std::strtol(entry->d_name + prefixLength, &end, 10);
    if (pid <= 0 || !end || *end != '-')
      continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      unlinkat(dirfd(dir), entry->d_name, 0);
  }
  closedir(dir);
}
} // namespace

Status Fabric::open(const char *provider, const char *domain) {
  // Every domain is asked for and the named one picked below, so that a
  // domain no entry offers is told apart from a missing provider.
  InfoList list;
  int result = getInfo(provider, nullptr, /*hmem=*/false, list);
  if (result < 0 || !list.head) {
    const char *env = getenv("FI_PROVIDER");
    // libfabric applies FI_PROVIDER itself, process-wide, before our choice:
    // a config.provider outside it cannot be opened. Say so.
    bool both = provider && env && *env;
    return makeError(
        MOE_TRANSPORT_ERR_FABRIC,
        "no libfabric provider offers RDM endpoints with RMA writes "
        "(provider '%s', FI_PROVIDER '%s', domain '%s'): %s%s",
        provider ? provider : "any", env ? env : "", domain ? domain : "any",
        fi_strerror(-result),
        both ? " (libfabric only loads the providers FI_PROVIDER names; "
               "unset it or include the configured provider)"
             : "");
  }

  // Some providers (tcp) answer with every domain whatever the hints name,
  // so the named domain is honoured here.
  auto inDomain = [&](const fi_info *info) {
    return !domain || (info->domain_attr->name &&
                       strcmp(info->domain_attr->name, domain) == 0);
  };
  auto fits = [&](const fi_info *info) {
    return usable(info) && inDomain(info);
  };
  // An explicit choice (argument or FI_PROVIDER, which fi_getinfo applies)
  // takes the first match; otherwise the preference order decides.
  fi_info *chosen = nullptr;
  if (!provider && !getenv("FI_PROVIDER")) {
    for (const char *name : kPreferredProviders) {
      for (fi_info *info = list.head; info && !chosen; info = info->next)
        if (fits(info) && strcmp(info->fabric_attr->prov_name, name) == 0)
          chosen = info;
      if (chosen)
        break;
    }
  }
  for (fi_info *info = list.head; info && !chosen; info = info->next)
    if (fits(info))
      chosen = info;
  bool domainOffered = false;
  for (fi_info *info = list.head; info && domain; info = info->next)
    domainOffered |= inDomain(info);
  if (!chosen && domain && !domainOffered) {
    std::string offered;
    for (fi_info *info = list.head; info; info = info->next) {
      const char *name =
          info->domain_attr->name ? info->domain_attr->name : "?";
      if (offered.find(std::string("'") + name + "'") != std::string::npos)
        continue;
      offered += offered.empty() ? "" : ", ";
      offered += std::string("'") + name + "'";
    }
    return makeError(MOE_TRANSPORT_ERR_INVALID_ARGUMENT,
                     "domain '%s' is not offered by provider '%s' (it offers "
                     "%s)",
                     domain,
                     provider ? provider : list.head->fabric_attr->prov_name,
                     offered.c_str());
  }
  if (!chosen)
    return makeError(MOE_TRANSPORT_ERR_FABRIC,
                     "provider '%s' lacks 4-byte remote CQ data",
                     list.head->fabric_attr->prov_name);
  info_ = fi_dupinfo(chosen);
  if (!info_)
    return makeError(MOE_TRANSPORT_ERR_FABRIC, "fi_dupinfo: out of memory");
  providerName_ = info_->fabric_attr->prov_name;
  domainName_ = info_->domain_attr->name ? info_->domain_attr->name : "";
  if (providerName_ == "shm") {
    // shm names its shared-memory region (/dev/shm/<name>) after the source
    // address, by default the pid; a process killed before closing leaves
    // the region behind. Ours are named moe-<pid namespace>-<pid>-<random>:
    // fresh for every endpoint, and telling which process made them, so
    // that the regions of processes gone from our pid namespace are removed
    // here.
    removeStaleShmRegions();
    std::random_device random;
    char name[96];
    std::snprintf(name, sizeof(name), "moe-%llu-%d-%08x%08x",
                  (unsigned long long)pidNamespace(), int(getpid()), random(),
                  random());
    free(info_->src_addr);
    info_->src_addr = strdup(name);
    info_->src_addrlen = std::strlen(name) + 1;
  }
  maxMessageSize_ = info_->ep_attr->max_msg_size;
  transmitDepth_ = info_->tx_attr->size;
  virtualAddresses_ = info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR;

  // Device memory support is whatever the provider answers when asked.
  InfoList hmemList;
  if (getInfo(providerName_.c_str(), info_->domain_attr->name, /*hmem=*/true,
              hmemList) == 0)
    for (fi_info *info = hmemList.head; info; info = info->next)
      hmemSupported_ |= (info->caps & FI_HMEM) != 0;

  if (Status status =
          check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
      status.failed())
    return status;
  if (Status status =
          check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
      status.failed())
    return status;

  fi_cq_attr cqAttr = {};
  // Room for every write we can have in flight plus the arrivals that pile
  // up while the proxy is busy; the provider's default may be much smaller.
  cqAttr.size = std::max<size_t>(
      4096, info_->tx_attr->size + (info_->rx_attr ? info_->rx_attr->size : 0));
  cqAttr.format = FI_CQ_FORMAT_DATA;
  cqAttr.wait_obj = FI_WAIT_NONE;
  if (Status status =
          check(fi_cq_open(domain_, &cqAttr, &cq_, nullptr), "fi_cq_open");
      status.failed())
    return status;

  fi_av_attr avAttr = {};
  avAttr.type = FI_AV_UNSPEC;
  if (Status status =
          check(fi_av_open(domain_, &avAttr, &av_, nullptr), "fi_av_open");
      status.failed())
    return status;

  if (Status status = check(fi_endpoint(domain_, info_, &endpoint_, nullptr),
                            "fi_endpoint");
      status.failed())
    return status;
  if (Status status =
          check(fi_ep_bind(endpoint_, &av_->fid, 0), "fi_ep_bind(av)");
      status.failed())
    return status;
  if (Status status =
          check(fi_ep_bind(endpoint_, &cq_->fid, FI_TRANSMIT | FI_RECV),
                "fi_ep_bind(cq)");
      status.failed())
    return status;
  if (Status status = check(fi_enable(endpoint_), "fi_enable"); status.failed())
    return status;
  // Read the address now, from the opening thread: later the endpoint is the
  // proxy's alone (FI_THREAD_DOMAIN), and callers may ask at any time.
  size_t length = MOE_TRANSPORT_MAX_ADDRESS;
  localAddress_.assign(length, 0);
  if (Status status =
          check(fi_getname(&endpoint_->fid, localAddress_.data(), &length),
                "fi_getname");
      status.failed())
    return status;
  localAddress_.resize(length);
  return Status::ok();
}

void Fabric::abandon() {
  endpoint_ = nullptr;
  regions_.clear();
  av_ = nullptr;
  cq_ = nullptr;
  domain_ = nullptr;
  fabric_ = nullptr;
  info_ = nullptr;
}

bool Fabric::close() {
  // Children before parents: endpoint, then what it is bound to. If the
  // endpoint does not close, what it is bound to may still be in use:
  // leave it all rather than free it under the provider.
  if (endpoint_ && fi_close(&endpoint_->fid) != 0) {
    abandon();
    return false;
  }
  for (fid_mr *mr : regions_)
    fi_close(&mr->fid);
  if (av_)
    fi_close(&av_->fid);
  if (cq_)
    fi_close(&cq_->fid);
  if (domain_)
    fi_close(&domain_->fid);
  if (fabric_)
    fi_close(&fabric_->fid);
  if (info_)
    fi_freeinfo(info_);
  abandon();
  peerAddresses_.clear();
  return true;
}

Status Fabric::registerRegion(void *base, size_t bytes, uint64_t access,
                              Region &region) {
  fid_mr *mr = nullptr;
  // The requested key only matters without FI_MR_PROV_KEY; keep it unique.
  if (Status status = check(fi_mr_reg(domain_, base, bytes, access, 0,
                                      nextKey_++, 0, &mr, nullptr),
                            "fi_mr_reg");
      status.failed())
    return status;
  regions_.push_back(mr);
  region.base = base;
  region.bytes = bytes;
  region.desc = fi_mr_desc(mr);
  region.key = fi_mr_key(mr);
  if (region.key == FI_KEY_NOTAVAIL)
    return makeError(MOE_TRANSPORT_ERR_FABRIC,
                     "provider '%s' uses raw MR keys, which are unsupported",
                     providerName_.c_str());
  // With FI_MR_VIRT_ADDR peers address the region by our virtual address,
  // otherwise by the offset from its start.
  region.remoteBase = virtualAddresses_ ? reinterpret_cast<uintptr_t>(base) : 0;
  return Status::ok();
}

Status Fabric::insertPeers(const std::vector<std::vector<uint8_t>> &addresses) {
  peerAddresses_.assign(addresses.size(), FI_ADDR_NOTAVAIL);
  // One at a time: address lengths may differ (shm names are strings).
  for (size_t peer = 0; peer < addresses.size(); ++peer) {
    int inserted = fi_av_insert(av_, addresses[peer].data(), 1,
                                &peerAddresses_[peer], 0, nullptr);
    if (inserted != 1)
      return makeError(MOE_TRANSPORT_ERR_FABRIC,
                       "fi_av_insert of rank %zu's address failed: %s", peer,
                       fi_strerror(inserted < 0 ? -inserted : FI_EINVAL));
  }
  return Status::ok();
}

bool Fabric::readError(fi_cq_err_entry &error, std::string &text) {
  error = {};
  if (fi_cq_readerr(cq_, &error, 0) <= 0)
    return false;
  const char *detail =
      fi_cq_strerror(cq_, error.prov_errno, error.err_data, nullptr, 0);
  text = format("%s (%s)", fi_strerror(error.err), detail ? detail : "");
  return true;
}

} // namespace moe::transport
