//===- Json.cpp - a small strict JSON reader ------------------------------===//

#include "runtime/Json.h"

#include <cstdlib>
#include <cstring>
#include <limits>

using namespace moe::rt;

namespace {
class JsonParser {
public:
  JsonParser(const char *begin, const char *end) : pos(begin), end(end) {}

  bool parse(Json &value, std::string &error) {
    if (!parseValue(value, 0) || (skipSpace(), pos != end)) {
      error =
          message.empty() ? "unexpected text after the JSON value" : message;
      return false;
    }
    return true;
  }

private:
  static constexpr int kMaxDepth = 8;

  bool fail(const std::string &what) {
    if (message.empty())
      message = what;
    return false;
  }
  void skipSpace() {
    while (pos != end &&
           (*pos == ' ' || *pos == '\t' || *pos == '\n' || *pos == '\r'))
      ++pos;
  }
  bool literal(const char *word) {
    size_t n = std::strlen(word);
    if (static_cast<size_t>(end - pos) < n || std::memcmp(pos, word, n) != 0)
      return fail("invalid JSON literal");
    pos += n;
    return true;
  }

  bool parseValue(Json &value, int depth) {
    if (depth > kMaxDepth)
      return fail("JSON nested too deeply");
    skipSpace();
    if (pos == end)
      return fail("JSON ends early");
    switch (*pos) {
    case '{':
      return parseObject(value, depth);
    case '[':
      return parseArray(value, depth);
    case '"':
      value.kind = Json::String;
      return parseString(value.text);
    case 't':
      value.kind = Json::Bool;
      value.boolean = true;
      return literal("true");
    case 'f':
      value.kind = Json::Bool;
      return literal("false");
    case 'n':
      return literal("null");
    default:
      return parseNumber(value);
    }
  }

  bool parseObject(Json &value, int depth) {
    value.kind = Json::Object;
    ++pos;
    skipSpace();
    if (pos != end && *pos == '}') {
      ++pos;
      return true;
    }
    while (true) {
      skipSpace();
      std::string key;
      if (pos == end || *pos != '"' || !parseString(key))
        return fail("expected a string key in a JSON object");
      skipSpace();
      if (pos == end || *pos++ != ':')
        return fail("expected ':' in a JSON object");
      value.members.emplace_back(std::move(key), Json());
      if (!parseValue(value.members.back().second, depth + 1))
        return false;
      skipSpace();
      if (pos == end)
        return fail("JSON object not closed");
      char c = *pos++;
      if (c == '}')
        return true;
      if (c != ',')
        return fail("expected ',' or '}' in a JSON object");
    }
  }

  bool parseArray(Json &value, int depth) {
    value.kind = Json::Array;
    ++pos;
    skipSpace();
    if (pos != end && *pos == ']') {
      ++pos;
      return true;
    }
    while (true) {
      value.items.emplace_back();
      if (!parseValue(value.items.back(), depth + 1))
        return false;
      skipSpace();
      if (pos == end)
        return fail("JSON array not closed");
      char c = *pos++;
      if (c == ']')
        return true;
      if (c != ',')
        return fail("expected ',' or ']' in a JSON array");
    }
  }

  static void appendUtf8(std::string &out, uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  bool parseHex4(uint32_t &code) {
    if (end - pos < 4)
      return fail("truncated \\u escape in a JSON string");
    code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = *pos++;
      code <<= 4;
      if (c >= '0' && c <= '9')
        code |= c - '0';
      else if (c >= 'a' && c <= 'f')
        code |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        code |= c - 'A' + 10;
      else
        return fail("bad \\u escape in a JSON string");
    }
    return true;
  }

  bool parseString(std::string &out) {
    ++pos; // Opening quote.
    while (pos != end) {
      char c = *pos++;
      if (c == '"')
        return true;
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("control character in a JSON string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos == end)
        break;
      char e = *pos++;
      switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        uint32_t code;
        if (!parseHex4(code))
          return false;
        if (code >= 0xD800 && code < 0xDC00) {
          uint32_t low;
          if (end - pos < 2 || pos[0] != '\\' || pos[1] != 'u')
            return fail("unpaired surrogate in a JSON string");
          pos += 2;
          if (!parseHex4(low) || low < 0xDC00 || low >= 0xE000)
            return fail("unpaired surrogate in a JSON string");
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        appendUtf8(out, code);
        break;
      }
      default:
        return fail("bad escape in a JSON string");
      }
    }
    return fail("JSON string not closed");
  }

  bool parseNumber(Json &value) {
    const char *start = pos;
    bool negative = pos != end && *pos == '-';
    if (negative)
      ++pos;
    if (pos == end || *pos < '0' || *pos > '9')
      return fail("unexpected character in JSON");
    uint64_t magnitude = 0;
    bool overflow = false;
    while (pos != end && *pos >= '0' && *pos <= '9') {
      uint64_t digit = *pos++ - '0';
      if (magnitude > (std::numeric_limits<uint64_t>::max() - digit) / 10)
        overflow = true;
      else
        magnitude = magnitude * 10 + digit;
    }
    bool fraction = false;
    if (pos != end && (*pos == '.' || *pos == 'e' || *pos == 'E')) {
      fraction = true;
      while (pos != end && (std::strchr("0123456789.eE+-", *pos) != nullptr))
        ++pos;
    }
    value.kind = Json::Number;
    value.number = std::strtod(std::string(start, pos).c_str(), nullptr);
    value.isInteger =
        !fraction && !overflow &&
        magnitude <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    if (value.isInteger)
      value.integer = negative ? -static_cast<int64_t>(magnitude)
                               : static_cast<int64_t>(magnitude);
    return true;
  }

  const char *pos;
  const char *end;
  std::string message;
};

} // namespace

bool moe::rt::parseJson(const char *begin, const char *end, Json &value,
                        std::string &error) {
  return JsonParser(begin, end).parse(value, error);
}

const Json *Json::get(const std::string &key) const {
  for (const auto &[name, member] : members)
    if (name == key)
      return &member;
  return nullptr;
}
