//===- HostTensors.cpp - the layer's arguments in host memory -------------===//

#include "tools/moe-exec/HostTensors.h"
#include "tools/moe-exec/LayerLibrary.h"

#include "runtime/Safetensors.h"

#include <map>
#include <memory>
#include <set>

using namespace moe::exec;
using namespace moe::rt;

namespace {

std::string shapeText(const std::vector<int64_t> &shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") +
            (shape[i] < 0 ? std::string("T") : std::to_string(shape[i]));
  return text + "]";
}

/// The inputs files, read whole, and which of them holds each tensor.
struct InputFiles {
  std::vector<std::string> paths;
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, size_t> fileOf;
};

bool readInputFiles(const std::vector<std::string> &paths, InputFiles &inputs,
                    std::string &error) {
  inputs.paths = paths;
  // Each tensor name in one file only: which one is meant is not a guess.
  for (const std::string &path : paths) {
    auto file = SafetensorsFile::read(path, error);
    if (!file)
      return false;
    for (const TensorInfo &tensor : file->tensors())
      if (!inputs.fileOf.emplace(tensor.name, inputs.files.size()).second) {
        error = "tensor '" + tensor.name + "' is in both " +
                paths[inputs.fileOf[tensor.name]] + " and " + path;
        return false;
      }
    inputs.files.push_back(std::move(file));
  }
  return true;
}

/// The token count, from the first input that has it.
struct TokenCount {
  int64_t tokens = -1;
  std::string from;
};

/// Checks `tensor` against the input `arg` of a layer over `ranks` ranks,
/// whose inputs hold every rank's experts; returns why it does not fit, or
/// "".
std::string checkInput(const LayerArg &arg, const TensorInfo &tensor,
                       int64_t ranks, TokenCount &count) {
  if (tensor.dtype != arg.dtype)
    return "input '" + arg.name + "' is " + dtypeName(tensor.dtype) +
           ", but the layer takes " + dtypeName(arg.dtype);
  std::vector<int64_t> whole = arg.shape;
  if (ranks > 1 && isExpertWeight(arg.name))
    whole[0] *= ranks;
  bool fits = tensor.shape.size() == arg.shape.size();
  for (size_t d = 0; fits && d < arg.shape.size(); ++d) {
    if (arg.shape[d] >= 0) {
      fits = tensor.shape[d] == whole[d];
    } else if (count.tokens < 0) {
      count.tokens = tensor.shape[d];
      count.from = arg.name;
    } else if (tensor.shape[d] != count.tokens) {
      return "input '" + arg.name + "' has " + std::to_string(tensor.shape[d]) +
             " tokens, but '" + count.from + "' has " +
             std::to_string(count.tokens);
    }
  }
  if (!fits)
    return "input '" + arg.name + "' has shape " + shapeText(tensor.shape) +
           ", but the layer takes " + shapeText(whole) +
           (whole != arg.shape ? " (all ranks' experts)" : "");
  return "";
}

/// Names the first tensor of `inputs` that is not in `used`, or "".
std::string findUnused(const InputFiles &inputs,
                       const std::set<std::string> &used,
                       const std::vector<LayerArg> &args) {
  for (const auto &[name, index] : inputs.fileOf)
    if (!used.count(name)) {
      std::string takes;
      for (const LayerArg &arg : args)
        if (!arg.isOutput)
          takes += (takes.empty() ? "" : ", ") + arg.name;
      return "unexpected tensor '" + name + "' in " + inputs.paths[index] +
             " (the layer takes " + takes + ")";
    }
  return "";
}

} // namespace

bool moe::exec::readInputs(const std::vector<std::string> &paths,
                           const LayerInfo &info, HostTensors &tensors,
                           std::string &error) {
  InputFiles inputs;
  if (!readInputFiles(paths, inputs, error))
    return false;
  std::string inputNames;
  for (const std::string &path : paths)
    inputNames += (inputNames.empty() ? "" : ", ") + path;

  TokenCount count;
  tensors.storage.assign(info.args.size(), {});
  std::set<std::string> used;
  for (size_t i = 0; i < info.args.size(); ++i) {
    const LayerArg &arg = info.args[i];
    if (arg.isOutput)
      continue;
    auto where = inputs.fileOf.find(arg.name);
    if (where == inputs.fileOf.end()) {
      error = "input '" + arg.name + "' is missing from " + inputNames;
      return false;
    }
    const SafetensorsFile &file = *inputs.files[where->second];
    const TensorInfo *tensor = file.find(arg.name);
    used.insert(arg.name);
    error = checkInput(arg, *tensor, info.ep.ranks, count);
    if (!error.empty())
      return false;
    // Copied: the file's data need not be aligned for its dtype.
    const uint8_t *data = file.data(*tensor);
    tensors.storage[i].assign(data, data + tensor->bytes);
  }
  error = findUnused(inputs, used, info.args);
  tensors.tokens = count.tokens < 0 ? 0 : count.tokens;
  return error.empty();
}

std::vector<HostSpan> moe::exec::wholeBuffers(HostTensors &tensors) {
  std::vector<HostSpan> spans;
  for (std::vector<uint8_t> &buffer : tensors.storage)
    spans.push_back({buffer.data(), buffer.size()});
  return spans;
}

void moe::exec::allocateOutputs(const std::vector<LayerArg> &args,
                                HostTensors &tensors) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isOutput) {
      size_t bytes = dtypeSize(args[i].dtype);
      for (int64_t d : args[i].shape)
        bytes *= size_t(d < 0 ? tensors.tokens : d);
      tensors.storage[i].assign(bytes, 0);
    }
    // Empty tensors still get a valid, unread address.
    tensors.storage[i].reserve(1);
  }
}

bool moe::exec::writeOutputs(const std::string &path,
                             const std::vector<LayerArg> &args,
                             const HostTensors &tensors, std::string &error) {
  std::vector<TensorToWrite> outputs;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].isOutput) {
      std::vector<int64_t> shape = args[i].shape;
      for (int64_t &d : shape)
        d = d < 0 ? tensors.tokens : d;
      outputs.push_back(
          {args[i].name, args[i].dtype, shape, tensors.storage[i].data()});
    }
  return writeSafetensors(path, outputs, error);
}
