//===- Json.h - a small strict JSON reader ----------------------*- C++ -*-===//
//
// Enough JSON for safetensors headers and compiled layers' metadata, with a
// nesting limit and no dependency: the runtime ships without LLVM.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_JSON_H
#define MOE_RUNTIME_JSON_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe::rt {

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool boolean = false;
  double number = 0.0;
  bool isInteger = false; // A Number that fits int64_t exactly.
  int64_t integer = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  /// The member called `key` of an Object, or null.
  const Json *get(const std::string &key) const;
};

/// Parses [begin, end) as one JSON value; false with `error` set otherwise.
bool parseJson(const char *begin, const char *end, Json &value,
               std::string &error);

} // namespace moe::rt

#endif // MOE_RUNTIME_JSON_H
