//===- Entry.cpp - C entry point and metadata of a compiled layer ---------===//
//
// moe_<name>_forward(void *const *args, int64_t tokens) calls the lowered
// layer with one row-major buffer per argument (outputs last) whose token
// dimension is `tokens`. moe_layer_info() returns the layer's description as
// JSON, so a runner needs neither the header nor MLIR.
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/host/HostBuilder.h"

#include "dialects/moe/MoeOps.h"
#include "runtime/EpLayout.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/JSON.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

static FailureOr<std::string> dtypeName(Type type) {
  if (type.isBF16())
    return std::string("BF16");
  if (type.isF16())
    return std::string("F16");
  if (type.isF32())
    return std::string("F32");
  if (isa<Float8E4M3FNType>(type))
    return std::string("F8_E4M3");
  if (isa<Float8E8M0FNUType>(type))
    return std::string("F8_E8M0");
  if (type.isInteger(32))
    return std::string("I32");
  return failure();
}

/// An argument's description; only a leading token dimension may be dynamic.
static FailureOr<host::ArgInfo> describe(Operation *where, StringRef name,
                                         Type type, bool isOutput) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  FailureOr<std::string> dtype = tensor ? dtypeName(tensor.getElementType())
                                        : FailureOr<std::string>(failure());
  if (failed(dtype))
    return where->emitOpError() << "cannot pass " << type << " as '" << name
                                << "' through the C entry point";
  host::ArgInfo info{name.str(), *dtype, {}, isOutput};
  for (auto [i, size] : llvm::enumerate(tensor.getShape())) {
    if (ShapedType::isDynamic(size) && i != 0)
      return where->emitOpError()
             << "'" << name << "' may have a dynamic size only in its first "
             << "(token) dimension";
    info.shape.push_back(ShapedType::isDynamic(size) ? -1 : size);
  }
  return info;
}

/// A function of L1 ops (one kernel family, say): its arguments are named
/// by their `moe.name` attribute, else argN, and its one result is `out`.
static FailureOr<SmallVector<host::ArgInfo>>
describeKernelFunction(func::FuncOp func) {
  if (func.getNumResults() != 1)
    return func.emitOpError() << "must return one tensor to be compiled, but "
                                 "returns "
                              << func.getNumResults();
  SmallVector<host::ArgInfo> args;
  llvm::StringSet<> seen;
  for (unsigned i = 0; i < func.getNumArguments(); ++i) {
    auto given = func.getArgAttrOfType<StringAttr>(i, "moe.name");
    std::string name = given ? given.str() : "arg" + std::to_string(i);
    if (name == "out" || !seen.insert(name).second)
      return func.emitOpError()
             << "argument " << i << " is named '" << name
             << "', which another argument or the result has";
    FailureOr<host::ArgInfo> info =
        describe(func, name, func.getArgument(i).getType(), false);
    if (failed(info))
      return failure();
    args.push_back(*info);
  }
  FailureOr<host::ArgInfo> out =
      describe(func, "out", func.getResultTypes()[0], true);
  if (failed(out))
    return failure();
  args.push_back(*out);
  return args;
}

FailureOr<SmallVector<host::ArgInfo>> host::describeLayer(func::FuncOp func) {
  SmallVector<Operation *> layers;
  for (Operation &op : func.getBody().front())
    if (isa<LayerOp, AttentionOp, TiledAttentionOp>(op))
      layers.push_back(&op);
  if (layers.empty())
    return describeKernelFunction(func);
  if (layers.size() != 1)
    return func.emitOpError() << "must hold exactly one moe.layer or "
                                 "moe.attention to be compiled, but holds "
                              << layers.size();
  Operation *layer = layers.front();
  // The ABI names each argument after the operand it feeds.
  SmallVector<std::pair<StringRef, Value>> operands;
  if (isa<AttentionOp, TiledAttentionOp>(layer)) {
    operands = {{"query", layer->getOperand(0)},
                {"key", layer->getOperand(1)},
                {"value", layer->getOperand(2)}};
  } else {
    auto l = cast<LayerOp>(layer);
    operands = {
        {"hidden_states", l.getHiddenStates()},
        {"router_weight", l.getRouterWeight()},
        {"router_bias", l.getRouterBias()},
        {"w13", l.getW13()},
        {"w2", l.getW2()},
        {"w13_scale", l.getW13Scale()},
        {"w2_scale", l.getW2Scale()},
        {"w13_bias", l.getW13Bias()},
        {"w2_bias", l.getW2Bias()},
        {"shared_w13", l.getSharedW13()},
        {"shared_w2", l.getSharedW2()},
        {"shared_gate", l.getSharedGate()},
        {"shared_w13_scale", l.getSharedW13Scale()},
        {"shared_w2_scale", l.getSharedW2Scale()},
    };
  }
  SmallVector<StringRef> names(func.getNumArguments());
  for (auto [name, value] : operands) {
    if (!value)
      continue;
    auto arg = dyn_cast<BlockArgument>(value);
    if (!arg || arg.getOwner() != &func.getBody().front() ||
        !names[arg.getArgNumber()].empty())
      return layer->emitOpError() << "operand '" << name
                                  << "' must be its own function argument to "
                                     "be compiled";
    names[arg.getArgNumber()] = name;
  }
  auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
  if (ret.getNumOperands() != 1 || ret.getOperand(0) != layer->getResult(0))
    return func.emitOpError() << "must return the layer's result";

  SmallVector<ArgInfo> args;
  for (auto [i, name] : llvm::enumerate(names)) {
    if (name.empty())
      return func.emitOpError() << "argument " << i
                                << " does not feed the "
                                   "layer";
    FailureOr<ArgInfo> info =
        describe(func, name, func.getArgument(i).getType(), false);
    if (failed(info))
      return failure();
    args.push_back(*info);
  }
  FailureOr<ArgInfo> out =
      describe(func, "out", layer->getResult(0).getType(), true);
  if (failed(out))
    return failure();
  args.push_back(*out);
  return args;
}

/// The layer's configuration, as a runner or a reference needs it.
static llvm::json::Value configJson(ConfigAttr config) {
  // A function of L1 ops has no layer config.
  if (!config)
    return nullptr;
  RouterAttr router = config.getRouter();
  ActivationAttr activation = config.getActivation();
  llvm::json::Object object{
      {"experts", config.getExperts()},
      {"top_k", config.getTopK()},
      {"hidden", config.getHidden()},
      {"intermediate", config.getIntermediate()},
      {"router", stringifyRouterKind(router.getKind())},
      {"renormalize", router.getRenormalize()},
      {"n_group", router.getNGroup()},
      {"topk_group", router.getTopkGroup()},
      {"scaling", router.getScaling().convertToDouble()},
      {"activation", stringifyActivationKind(activation.getKind())},
      {"alpha", activation.getAlpha().convertToDouble()},
      {"limit", activation.getLimit().convertToDouble()},
      {"shared_intermediate", config.getSharedIntermediate()},
      {"shared_gate", config.getSharedGate()},
      {"ep_size", config.getEpSize()}};
  if (QuantAttr quant = config.getQuant()) {
    object["quant"] = stringifyQuantKind(quant.getKind());
    object["rounding"] = stringifyScaleRounding(quant.getRounding());
  } else {
    object["quant"] = nullptr;
  }
  return object;
}

std::string host::infoJson(StringRef name, ArrayRef<host::ArgInfo> args,
                           ConfigAttr config, StringRef target,
                           const TokenLinear *workspace, int64_t epCapacity,
                           int64_t epStateBytes, ArrayRef<int64_t> buckets) {
  llvm::json::Array list;
  for (const host::ArgInfo &arg : args)
    list.push_back(llvm::json::Object{{"name", arg.name},
                                      {"dtype", arg.dtype},
                                      {"shape", llvm::json::Array(arg.shape)},
                                      {"output", arg.isOutput}});
  llvm::json::Object info{{"abi_version", 1},
                          {"name", name},
                          {"forward", ("moe_" + name + "_forward").str()},
                          {"target", target},
                          {"config", configJson(config)},
                          {"args", std::move(list)}};
  if (config && config.getEpSize() > 1) {
    // Both buffers are linear in max_tokens: base + per_max_token * it.
    ::moe::rt::EpLayout none{config.getHidden(), config.getTopK(),
                             config.getExperts(), config.getEpSize(), 0};
    ::moe::rt::EpLayout one = none;
    one.maxTokens = 1;
    auto linear = [](size_t base, size_t withOne) {
      return llvm::json::Object{{"base", int64_t(base)},
                                {"per_max_token", int64_t(withOne - base)}};
    };
    llvm::json::Object ep{{"ranks", config.getEpSize()},
                          {"local_experts", config.getLocalExperts()},
                          {"init", ("moe_" + name + "_ep_init").str()},
                          {"finalize", ("moe_" + name + "_ep_finalize").str()}};
    if (epCapacity > 0) {
      // GPU: one device allocation per rank, for a compiled capacity.
      ep["max_tokens"] = epCapacity;
      ep["state_bytes"] = epStateBytes;
      ep["status"] = ("moe_" + name + "_ep_status").str();
    } else {
      ep["send_bytes"] = linear(none.sendBytes(), one.sendBytes());
      ep["recv_bytes"] = linear(none.recvBytes(), one.recvBytes());
    }
    info["ep"] = std::move(ep);
  }
  if (workspace) {
    info["workspace"] = llvm::json::Object{{"base", workspace->fixed},
                                           {"per_token", workspace->perToken}};
    info["workspace_size"] = ("moe_" + name + "_workspace_size").str();
  }
  if (!buckets.empty()) {
    info["token_buckets"] = llvm::json::Array(buckets);
    info["set_graphs"] = ("moe_" + name + "_set_graphs").str();
    info["warmup"] = ("moe_" + name + "_warmup").str();
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(info));
  return text;
}

/// Declares the runtime function `name` in `module` unless it is there.
static LLVM::LLVMFuncOp runtimeFunction(ModuleOp module, StringRef name,
                                        Type result, ArrayRef<Type> args) {
  if (auto existing = module.lookupSymbol<LLVM::LLVMFuncOp>(name))
    return existing;
  OpBuilder b = OpBuilder::atBlockBegin(module.getBody());
  return LLVM::LLVMFuncOp::create(b, module.getLoc(), name,
                                  LLVM::LLVMFunctionType::get(result, args));
}

/// An expert-parallel CPU layer: the forward runs between moe_ep_begin and
/// moe_ep_end (runtime/moe_ep.h), and init, finalize and moe_last_error
/// wrap the runtime's, with the layer's shape given to init.
static void addExpertParallelEntryPoints(ModuleOp module, StringRef name,
                                         ConfigAttr config,
                                         LLVM::LLVMFuncOp forward,
                                         LLVM::LLVMFuncOp layer,
                                         ValueRange operands) {
  Location loc = forward.getLoc();
  OpBuilder b(module.getContext());
  b.setInsertionPointToEnd(&forward.getBody().back());
  HostBuilder h(b, loc);
  Type ptr = h.ptr, i64 = h.i64, i32 = h.i32;
  Type none = LLVM::LLVMVoidType::get(module.getContext());
  auto begin = runtimeFunction(module, "moe_ep_begin", i32, {i64});
  auto end = runtimeFunction(module, "moe_ep_end", i32, {});
  auto init =
      runtimeFunction(module, "moe_ep_init", i32, {i64, i64, i64, i64, ptr});
  auto finalize = runtimeFunction(module, "moe_ep_finalize", none, {});
  auto lastError = runtimeFunction(module, "moe_ep_last_error", ptr, {});

  // forward: begin; the layer; end's status.
  Block *failure = b.createBlock(&forward.getBody(), {}, {i32}, {loc});
  LLVM::ReturnOp::create(b, loc, failure->getArgument(0));
  b.setInsertionPointToEnd(&forward.getBody().front());
  h.failure = failure;
  h.check(
      LLVM::CallOp::create(b, loc, begin, ValueRange{forward.getArgument(1)})
          .getResult());
  LLVM::CallOp::create(b, loc, layer, operands);
  LLVM::ReturnOp::create(
      b, loc, LLVM::CallOp::create(b, loc, end, ValueRange{}).getResult());

  b.setInsertionPointToEnd(module.getBody());
  auto initEntry =
      LLVM::LLVMFuncOp::create(b, loc, ("moe_" + name + "_ep_init").str(),
                               LLVM::LLVMFunctionType::get(i32, {ptr}));
  b.setInsertionPointToStart(initEntry.addEntryBlock(b));
  Value status =
      LLVM::CallOp::create(
          b, loc, init,
          ValueRange{h.c64(config.getHidden()), h.c64(config.getTopK()),
                     h.c64(config.getExperts()), h.c64(config.getEpSize()),
                     initEntry.getArgument(0)})
          .getResult();
  LLVM::ReturnOp::create(b, loc, status);

  b.setInsertionPointToEnd(module.getBody());
  auto finalizeEntry =
      LLVM::LLVMFuncOp::create(b, loc, ("moe_" + name + "_ep_finalize").str(),
                               LLVM::LLVMFunctionType::get(none, {}));
  b.setInsertionPointToStart(finalizeEntry.addEntryBlock(b));
  LLVM::CallOp::create(b, loc, finalize, ValueRange{});
  LLVM::ReturnOp::create(b, loc, ValueRange{});

  b.setInsertionPointToEnd(module.getBody());
  auto errorEntry = LLVM::LLVMFuncOp::create(
      b, loc, "moe_last_error", LLVM::LLVMFunctionType::get(ptr, {}));
  b.setInsertionPointToStart(errorEntry.addEntryBlock(b));
  LLVM::ReturnOp::create(
      b, loc,
      LLVM::CallOp::create(b, loc, lastError, ValueRange{}).getResult());
}

LogicalResult host::addEntryPoints(ModuleOp module, StringRef name,
                                   ArrayRef<ArgInfo> args, ConfigAttr config) {
  auto layer = module.lookupSymbol<LLVM::LLVMFuncOp>(name);
  if (!layer)
    return module.emitError() << "no lowered function '" << name << "'";
  Location loc = layer.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, loc);
  Type ptr = h.ptr, i64 = h.i64, i32 = h.i32;

  auto forward =
      LLVM::LLVMFuncOp::create(b, loc, ("moe_" + name + "_forward").str(),
                               LLVM::LLVMFunctionType::get(i32, {ptr, i64}));
  Block *entry = forward.addEntryBlock(b);
  b.setInsertionPointToStart(entry);
  Value argv = entry->getArgument(0), tokens = entry->getArgument(1);
  // Each buffer becomes a memref descriptor: pointer twice, offset 0, sizes,
  // row-major strides (static: only the leading size is dynamic).
  SmallVector<Value> operands;
  for (auto [i, arg] : llvm::enumerate(args)) {
    Value slot = LLVM::GEPOp::create(b, loc, ptr, ptr, argv,
                                     ArrayRef<LLVM::GEPArg>{int32_t(i)});
    Value data = LLVM::LoadOp::create(b, loc, ptr, slot);
    operands.append({data, data, h.c64(0)});
    for (int64_t size : arg.shape)
      operands.push_back(size < 0 ? tokens : h.c64(size));
    SmallVector<int64_t> strides(arg.shape.size(), 1);
    for (int64_t d = int64_t(arg.shape.size()) - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * arg.shape[d + 1];
    for (int64_t stride : strides)
      operands.push_back(h.c64(stride));
  }
  if (layer.getNumArguments() != operands.size())
    return layer.emitOpError()
           << "takes " << layer.getNumArguments()
           << " values, but the layer's buffers give " << operands.size();
  bool expertParallel = config && config.getEpSize() > 1;
  if (!expertParallel) {
    LLVM::CallOp::create(b, loc, layer, operands);
    LLVM::ReturnOp::create(b, loc, h.c32(0));
  } else {
    addExpertParallelEntryPoints(module, name, config, forward, layer,
                                 operands);
  }
  // Only the entry points are the library's interface.
  layer.setLinkage(LLVM::Linkage::Internal);

  addLayerInfo(module, infoJson(name, args, config, "cpu"));
  return success();
}

void host::addLayerInfo(ModuleOp module, StringRef json) {
  Location loc = module.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  auto info = LLVM::LLVMFuncOp::create(
      b, loc, "moe_layer_info",
      LLVM::LLVMFunctionType::get(LLVM::LLVMPointerType::get(b.getContext()),
                                  {}));
  b.setInsertionPointToStart(info.addEntryBlock(b));
  std::string text = json.str();
  text.push_back('\0');
  Value global = LLVM::createGlobalString(loc, b, "moe_layer_info_json", text,
                                          LLVM::Linkage::Internal);
  LLVM::ReturnOp::create(b, loc, global);
}

std::string host::headerText(StringRef name, ArrayRef<ArgInfo> args, bool gpu,
                             int64_t epSize, bool buckets) {
  std::string guard = ("MOE_" + name.upper() + "_H");
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "/* " << name << ": a compiled MoE layer (moe-compile). */\n"
     << "#ifndef " << guard << "\n#define " << guard << "\n\n"
     << "#include <stdint.h>\n\n#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
     << "/* args[i] points to row-major data; -1 is the token count.\n";
  for (auto [i, arg] : llvm::enumerate(args)) {
    os << " *   args[" << i << "] " << arg.name << " " << arg.dtype << " [";
    llvm::interleave(arg.shape, os, ", ");
    os << "]" << (arg.isOutput ? " (output)" : "") << "\n";
  }
  if (gpu)
    os << " * args are device pointers; the kernels run on `stream` (a "
          "CUstream,\n * null for the default stream) in the current "
          "context, using `workspace`\n * (device memory of "
          "moe_"
       << name << "_workspace_size(tokens) bytes). Returns 0 on\n"
       << " * success, else a nonzero status (see moert_last_error). */\n"
       << "int32_t moe_" << name
       << "_forward(void *const *args, int64_t tokens, void *stream,\n"
       << "                         void *workspace);\n"
       << "int64_t moe_" << name << "_workspace_size(int64_t tokens);\n"
       << "/* Why the last call on this thread failed. */\n"
       << "const char *moe_last_error(void);\n\n";
  if (gpu && buckets)
    os << "/* Token buckets (moe_layer_info()'s token_buckets): a forward of "
          "at most a\n * bucket's tokens replays the bucket's CUDA graph, "
          "captured on first use\n * for its argument pointers and workspace "
          "(unless the caller is capturing\n * the stream, or graphs are off: "
          "set_graphs(0) or MOE_GRAPHS=0). warmup\n * captures every bucket's "
          "graph for these arguments and workspace\n * (workspace_size of the "
          "largest bucket) and launches nothing. */\n"
       << "void moe_" << name << "_set_graphs(int32_t on);\n"
       << "int32_t moe_" << name
       << "_warmup(void *const *args, void *stream, void *workspace);\n\n";
  else
    os << " * Returns 0 on success. */\n"
       << "int32_t moe_" << name
       << "_forward(void *const *args, int64_t tokens);\n\n";
  if (epSize > 1) {
    os << "/* Expert parallel over " << epSize
       << " ranks (runtime/moe_ep.h): each rank calls init, then\n"
       << " * every forward together with the others, then finalize. A "
          "forward\n * takes the rank's tokens and its local experts' "
          "weights. Nonzero:\n * see moe_last_error(). */\n"
       << "struct moe_ep_config;\n"
       << "int32_t moe_" << name
       << "_ep_init(const struct moe_ep_config *config);\n"
       << "void moe_" << name << "_ep_finalize(void);\n";
    if (gpu)
      os << "/* Nonzero if a forward's wait for a peer ran out of time "
            "(call once\n * the forward's stream is done). */\n"
         << "int32_t moe_" << name << "_ep_status(void);\n\n";
    else
      os << "const char *moe_last_error(void);\n\n";
  }
  os << "/* The arguments above as JSON. */\n"
     << "const char *moe_layer_info(void);\n\n"
     << "#ifdef __cplusplus\n}\n#endif\n\n#endif\n";
  return text;
}
