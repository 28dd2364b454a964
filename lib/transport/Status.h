//===- Status.h - Error codes with messages, without exceptions -*- C++ -*-===//
#ifndef MOE_TRANSPORT_STATUS_H
#define MOE_TRANSPORT_STATUS_H

#include "moe_transport.h"

#include <string>

namespace moe::transport {

/// The result of an operation: a code from the C API and, on failure, a
/// message for moe_transport_last_error().
class [[nodiscard]] Status {
public:
  static Status ok() { return Status(); }
  static Status error(moe_transport_status_t code, std::string message) {
    Status status;
    status.code_ = code;
    status.message_ = std::move(message);
    return status;
  }

  bool failed() const { return code_ != MOE_TRANSPORT_OK; }
  moe_transport_status_t code() const { return code_; }
  const std::string &message() const { return message_; }

private:
  moe_transport_status_t code_ = MOE_TRANSPORT_OK;
  std::string message_;
};

/// printf-style formatting for error messages.
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/// Status::error with a printf-style message.
Status makeError(moe_transport_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/// describe(rank) for every rank in [0, count) where it is not empty, joined
/// by ", ": how timeouts list the ranks they waited for.
template <typename Describe>
std::string joinRanks(int count, Describe describe) {
  std::string text;
  for (int rank = 0; rank < count; ++rank) {
    std::string part = describe(rank);
    if (part.empty())
      continue;
    if (!text.empty())
      text += ", ";
    text += part;
  }
  return text;
}

} // namespace moe::transport

#endif // MOE_TRANSPORT_STATUS_H
