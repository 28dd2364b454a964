//===- LayerLibrary.cpp - a compiled layer's library ----------------------===//

#include "tools/moe-exec/LayerLibrary.h"

#include "runtime/Json.h"

#include <cstring>
#include <dlfcn.h>

using namespace moe::exec;
using moe::rt::Json;

namespace {

/// Reads the `ep` object: the rank count comes from it alone, and a layer
/// without one runs on one rank.
bool parseEpInfo(const Json &parallel, EpInfo &ep, std::string &error) {
  const Json *ranks = parallel.get("ranks");
  const Json *init = parallel.get("init");
  const Json *finalize = parallel.get("finalize");
  if (!ranks || !ranks->isInteger || ranks->integer < 2 || !init ||
      init->kind != Json::String || !finalize ||
      finalize->kind != Json::String) {
    error = "the library's expert-parallel description is malformed";
    return false;
  }
  const Json *status = parallel.get("status");
  ep = {ranks->integer, init->text, finalize->text,
        status && status->kind == Json::String ? status->text : ""};
  return true;
}

bool parseArg(const Json &item, LayerArg &arg, std::string &error) {
  const Json *name = item.get("name"), *dtype = item.get("dtype");
  const Json *shape = item.get("shape"), *output = item.get("output");
  if (!name || !dtype || !shape || !output || shape->kind != Json::Array ||
      !moe::rt::parseDType(dtype->text, arg.dtype)) {
    error = "the library's layer description has a malformed argument";
    return false;
  }
  arg.name = name->text;
  arg.isOutput = output->boolean;
  for (const Json &dim : shape->items)
    arg.shape.push_back(dim.integer);
  return true;
}

template <typename Function>
Function lookUp(const LayerLibrary &layer, const std::string &name) {
  return reinterpret_cast<Function>(dlsym(layer.handle, name.c_str()));
}

} // namespace

bool moe::exec::parseLayerInfo(const char *text, LayerInfo &info,
                               std::string &error) {
  Json root;
  if (!moe::rt::parseJson(text, text + std::strlen(text), root, error))
    return false;
  const Json *version = root.get("abi_version");
  const Json *symbol = root.get("forward");
  const Json *list = root.get("args");
  if (!version || !version->isInteger || version->integer != 1 || !symbol ||
      symbol->kind != Json::String || !list || list->kind != Json::Array) {
    error = "the library's layer description is not ABI version 1";
    return false;
  }
  info.forward = symbol->text;
  const Json *target = root.get("target");
  info.target = target && target->kind == Json::String ? target->text : "cpu";
  if (const Json *size = root.get("workspace_size"))
    info.workspaceSize = size->text;
  if (const Json *parallel = root.get("ep"))
    if (!parseEpInfo(*parallel, info.ep, error))
      return false;
  for (const Json &item : list->items) {
    LayerArg arg;
    if (!parseArg(item, arg, error))
      return false;
    info.args.push_back(std::move(arg));
  }
  return true;
}

bool moe::exec::isExpertWeight(const std::string &name) {
  return name == "w13" || name == "w2" || name == "w13_scale" ||
         name == "w2_scale" || name == "w13_bias" || name == "w2_bias";
}

bool moe::exec::openLayerLibrary(const std::string &path, LayerLibrary &layer,
                                 std::string &error) {
  // dlopen searches the library path for bare names: name the file itself.
  layer.path = path.find('/') == std::string::npos ? "./" + path : path;
  layer.handle = dlopen(layer.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!layer.handle) {
    error = std::string("cannot load ") + dlerror();
    return false;
  }
  auto describe = lookUp<const char *(*)()>(layer, "moe_layer_info");
  if (!describe) {
    error = layer.path + " is not a layer compiled by moe-compile (no "
                         "moe_layer_info)";
    return false;
  }
  if (!parseLayerInfo(describe(), layer.info, error)) {
    error = layer.path + ": " + error;
    return false;
  }
  return true;
}

bool moe::exec::findForward(LayerLibrary &layer, std::string &error) {
  layer.entries.forward = lookUp<void *>(layer, layer.info.forward);
  if (layer.entries.forward)
    return true;
  error = layer.path + " lacks its entry point " + layer.info.forward;
  return false;
}

bool moe::exec::findGpuEntries(LayerLibrary &layer, std::string &error) {
  LayerEntries &entries = layer.entries;
  entries.workspaceSize =
      lookUp<int64_t (*)(int64_t)>(layer, layer.info.workspaceSize);
  entries.lastError = lookUp<const char *(*)()>(layer, "moe_last_error");
  if (entries.workspaceSize && entries.lastError)
    return true;
  error = layer.path + " lacks its workspace or error entry points";
  return false;
}

bool moe::exec::findEpEntries(LayerLibrary &layer, std::string &error) {
  LayerEntries &entries = layer.entries;
  const EpInfo &ep = layer.info.ep;
  bool gpu = layer.info.onGpu();
  entries.init = lookUp<int32_t (*)(const moe_ep_config_t *)>(layer, ep.init);
  entries.finalize = lookUp<void (*)()>(layer, ep.finalize);
  entries.lastError = lookUp<const char *(*)()>(layer, "moe_last_error");
  if (gpu) {
    entries.status = lookUp<int32_t (*)()>(layer, ep.status);
    entries.workspaceSize =
        lookUp<int64_t (*)(int64_t)>(layer, layer.info.workspaceSize);
  }
  if (entries.init && entries.finalize && entries.lastError &&
      (!gpu || (entries.status && entries.workspaceSize)))
    return true;
  error = layer.path + " lacks its expert-parallel entry points";
  return false;
}
