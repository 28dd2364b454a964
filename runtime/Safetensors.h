//===- Safetensors.h - tensors in the safetensors format --------*- C++ -*-===//
//
// The HF ecosystem's tensor file: an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and byte range, then the
// data. This reader has no dependency beyond the C++ standard library, so
// the runtime ships without LLVM; every malformed file is an error message,
// never a crash.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_SAFETENSORS_H
#define MOE_RUNTIME_SAFETENSORS_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moe::rt {

enum class DType { BF16, F16, F32, F8_E4M3, F8_E8M0, I32 };

/// The format's name for `dtype` ("BF16", "F8_E4M3", ...).
const char *dtypeName(DType dtype);
/// Bytes per element.
size_t dtypeSize(DType dtype);
/// Parses a format name; false for names this runtime does not handle.
bool parseDType(const std::string &name, DType &dtype);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t offset = 0; // Into the data section.
  size_t bytes = 0;

  int64_t numElements() const;
};

/// A safetensors file read into memory.
class SafetensorsFile {
public:
  /// Reads and validates `path`; on failure returns null and sets `error`.
  static std::unique_ptr<SafetensorsFile> read(const std::string &path,
                                               std::string &error);
  /// Validates an in-memory file; `origin` names it in messages.
  static std::unique_ptr<SafetensorsFile> parse(std::vector<uint8_t> bytes,
                                                const std::string &origin,
                                                std::string &error);

  const std::vector<TensorInfo> &tensors() const { return tensorList; }
  /// The tensor called `name`, or null.
  const TensorInfo *find(const std::string &name) const;
  const uint8_t *data(const TensorInfo &tensor) const {
    return bytes.data() + dataStart + tensor.offset;
  }
  const std::map<std::string, std::string> &metadata() const {
    return metadataMap;
  }

private:
  std::vector<uint8_t> bytes;
  size_t dataStart = 0;
  std::vector<TensorInfo> tensorList;
  std::map<std::string, std::string> metadataMap;
};

/// A tensor to write: its bytes are `TensorInfo::bytes` long at `data`.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void *data;
};

/// Encodes tensors as a safetensors file, in the order given.
std::vector<uint8_t>
encodeSafetensors(const std::vector<TensorToWrite> &tensors);
/// Writes `encodeSafetensors(tensors)` to `path`; false with `error` set on
/// failure.
bool writeSafetensors(const std::string &path,
                      const std::vector<TensorToWrite> &tensors,
                      std::string &error);

} // namespace moe::rt

#endif // MOE_RUNTIME_SAFETENSORS_H
