//===- Status.cpp - Error codes with messages -----------------------------===//
#include "Status.h"

#include <cstdarg>
#include <cstdio>

namespace moe::transport {

static std::string vformat(const char *fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int length = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (length <= 0)
    return std::string();
  std::string text(static_cast<size_t>(length) + 1, '\0');
  std::vsnprintf(text.data(), text.size(), fmt, args);
  text.pop_back();
  return text;
}

std::string format(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string text = vformat(fmt, args);
  va_end(args);
  return text;
}

Status makeError(moe_transport_status_t code, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string text = vformat(fmt, args);
  va_end(args);
  return Status::error(code, std::move(text));
}

} // namespace moe::transport
