//===- Safetensors.cpp - tensors in the safetensors format ----------------===//

#include "runtime/Safetensors.h"

#include "runtime/Json.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

using namespace moe::rt;

namespace {
struct DTypeEntry {
  DType dtype;
  const char *name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::BF16, "BF16", 2},       {DType::F16, "F16", 2},
    {DType::F32, "F32", 4},         {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E8M0, "F8_E8M0", 1}, {DType::I32, "I32", 4},
};

bool checkedMultiply(size_t a, size_t b, size_t &out) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a)
    return false;
  out = a * b;
  return true;
}
} // namespace

const char *moe::rt::dtypeName(DType dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.name;
  return "?";
}

size_t moe::rt::dtypeSize(DType dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (entry.dtype == dtype)
      return entry.size;
  return 0;
}

bool moe::rt::parseDType(const std::string &name, DType &dtype) {
  for (const DTypeEntry &entry : kDTypes)
    if (name == entry.name) {
      dtype = entry.dtype;
      return true;
    }
  return false;
}

int64_t TensorInfo::numElements() const {
  int64_t count = 1;
  for (int64_t dim : shape)
    count *= dim;
  return count;
}

const TensorInfo *SafetensorsFile::find(const std::string &name) const {
  for (const TensorInfo &tensor : tensorList)
    if (tensor.name == name)
      return &tensor;
  return nullptr;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::read(const std::string &path,
                                                       std::string &error) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    error = path + ": cannot open for reading";
    return nullptr;
  }
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  if (file.bad()) {
    error = path + ": read failed";
    return nullptr;
  }
  return parse(std::move(bytes), path, error);
}

std::unique_ptr<SafetensorsFile>
SafetensorsFile::parse(std::vector<uint8_t> bytes, const std::string &origin,
                       std::string &error) {
  auto fail = [&](const std::string &what) {
    error = origin + ": " + what;
    return nullptr;
  };
  if (bytes.size() < 8)
    return fail("not a safetensors file: shorter than its 8-byte header size");
  uint64_t headerSize = 0;
  for (int i = 7; i >= 0; --i)
    headerSize = headerSize << 8 | bytes[i];
  if (headerSize > bytes.size() - 8)
    return fail("header size " + std::to_string(headerSize) +
                " runs past the end of the file (" +
                std::to_string(bytes.size()) + " bytes)");

  const char *header = reinterpret_cast<const char *>(bytes.data() + 8);
  Json root;
  std::string jsonError;
  if (!parseJson(header, header + headerSize, root, jsonError))
    return fail("bad JSON header: " + jsonError);
  if (root.kind != Json::Object)
    return fail("the header must be a JSON object");

  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->dataStart = 8 + headerSize;
  size_t dataSize = bytes.size() - file->dataStart;
  for (auto &[name, entry] : root.members) {
    if (name == "__metadata__") {
      if (entry.kind != Json::Object)
        return fail("__metadata__ must be an object of strings");
      for (auto &[key, value] : entry.members) {
        if (value.kind != Json::String)
          return fail("__metadata__ value '" + key + "' must be a string");
        file->metadataMap[key] = value.text;
      }
      continue;
    }
    if (entry.kind != Json::Object)
      return fail("tensor '" + name + "' must be described by an object");
    if (file->find(name))
      return fail("tensor '" + name + "' appears twice");
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (auto &[key, value] : entry.members) {
      if (key == "dtype")
        dtype = &value;
      else if (key == "shape")
        shape = &value;
      else if (key == "data_offsets")
        offsets = &value;
    }
    TensorInfo tensor;
    tensor.name = name;
    if (!dtype || dtype->kind != Json::String)
      return fail("tensor '" + name + "' has no string 'dtype'");
    if (!parseDType(dtype->text, tensor.dtype))
      return fail("tensor '" + name + "' has unsupported dtype '" +
                  dtype->text +
                  "' (supported: BF16, F16, F32, F8_E4M3, F8_E8M0, I32)");
    if (!shape || shape->kind != Json::Array)
      return fail("tensor '" + name + "' has no 'shape' array");
    size_t elements = 1;
    for (const Json &dim : shape->items) {
      if (dim.kind != Json::Number || !dim.isInteger || dim.integer < 0)
        return fail("tensor '" + name +
                    "' has a shape entry that is not a non-negative integer");
      tensor.shape.push_back(dim.integer);
      if (!checkedMultiply(elements, static_cast<size_t>(dim.integer),
                           elements))
        return fail("tensor '" + name + "' is too large");
    }
    if (!offsets || offsets->kind != Json::Array || offsets->items.size() != 2)
      return fail("tensor '" + name + "' has no 'data_offsets' [begin, end]");
    for (const Json &offset : offsets->items)
      if (offset.kind != Json::Number || !offset.isInteger ||
          offset.integer < 0)
        return fail("tensor '" + name +
                    "' has data_offsets that are not non-negative integers");
    uint64_t begin = offsets->items[0].integer;
    uint64_t end = offsets->items[1].integer;
    if (begin > end || end > dataSize)
      return fail("tensor '" + name + "' has data_offsets [" +
                  std::to_string(begin) + ", " + std::to_string(end) +
                  "] outside the " + std::to_string(dataSize) +
                  "-byte data section");
    size_t expected;
    if (!checkedMultiply(elements, dtypeSize(tensor.dtype), expected) ||
        end - begin != expected)
      return fail("tensor '" + name + "' holds " + std::to_string(end - begin) +
                  " bytes, but its dtype and " + "shape need " +
                  std::to_string(elements) + " x " +
                  std::to_string(dtypeSize(tensor.dtype)));
    tensor.offset = begin;
    tensor.bytes = end - begin;
    file->tensorList.push_back(std::move(tensor));
  }
  file->bytes = std::move(bytes);
  return file;
}

static std::string jsonQuote(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof(escape), "\\u%04x", c);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::vector<uint8_t>
moe::rt::encodeSafetensors(const std::vector<TensorToWrite> &tensors) {
  std::ostringstream header;
  header << "{";
  size_t offset = 0;
  std::vector<size_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite &tensor = tensors[i];
    size_t bytes = dtypeSize(tensor.dtype);
    for (int64_t dim : tensor.shape)
      bytes *= static_cast<size_t>(dim);
    sizes.push_back(bytes);
    header << (i ? "," : "") << jsonQuote(tensor.name) << ":{\"dtype\":\""
           << dtypeName(tensor.dtype) << "\",\"shape\":[";
    for (size_t d = 0; d < tensor.shape.size(); ++d)
      header << (d ? "," : "") << tensor.shape[d];
    header << "],\"data_offsets\":[" << offset << "," << offset + bytes << "]}";
    offset += bytes;
  }
  header << "}";
  std::string text = header.str();
  // Readers may map the data section: align it to 8 bytes, as the format
  // allows, with trailing spaces.
  while ((8 + text.size()) % 8 != 0)
    text += ' ';

  std::vector<uint8_t> out(8);
  uint64_t size = text.size();
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<uint8_t>(size >> (8 * i));
  out.insert(out.end(), text.begin(), text.end());
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto *data = static_cast<const uint8_t *>(tensors[i].data);
    out.insert(out.end(), data, data + sizes[i]);
  }
  return out;
}

bool moe::rt::writeSafetensors(const std::string &path,
                               const std::vector<TensorToWrite> &tensors,
                               std::string &error) {
  std::vector<uint8_t> bytes = encodeSafetensors(tensors);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file.write(reinterpret_cast<const char *>(bytes.data()), bytes.size())) {
    error = path + ": cannot write";
    return false;
  }
  return true;
}
