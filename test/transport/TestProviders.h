//===- TestProviders.h - The providers the transport tests run on -*- C++
//-*-===//
#ifndef MOE_TEST_TRANSPORT_TESTPROVIDERS_H
#define MOE_TEST_TRANSPORT_TESTPROVIDERS_H

#include <ostream>

namespace moe::transport::testing {

/// A libfabric provider as the tests select it.
struct Provider {
  const char *label; // for test names
  const char *name;
  const char *domain; // loopback only
};
inline constexpr Provider kTcp = {"tcp", "tcp;ofi_rxm", "lo"};
inline constexpr Provider kShm = {"shm", "shm", nullptr};
/// For gtest's messages: the label rather than the struct's bytes.
inline void PrintTo(const Provider &provider, std::ostream *out) {
  *out << provider.label;
}

} // namespace moe::transport::testing

#endif // MOE_TEST_TRANSPORT_TESTPROVIDERS_H
