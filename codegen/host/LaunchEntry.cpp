//===- LaunchEntry.cpp - host code of a GPU layer -------------------------===//
//
// A GPU layer's library exports
//   int32_t moe_<name>_forward(void *const *args, int64_t tokens,
//                              void *stream, void *workspace);
//   int64_t moe_<name>_workspace_size(int64_t tokens);
// and, with token buckets, moe_<name>_set_graphs and moe_<name>_warmup.
// `args` are device pointers in the order of the CPU ABI. The forward encodes
// the plan's TMA descriptors on the host and launches each kernel on
// `stream` through libmoert (runtime/moert.h), descriptors passed by value;
// it neither waits on the stream nor copies, so it can be captured in a CUDA
// graph. The workspace holds the intermediate tensors: fixed plus per-token
// bytes, each slice 256-byte aligned.
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/host/HostBuilder.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

/// The object of the gpu.binary moe-build-kernels made for the function
/// `func` (its gpu.module <func>_kernels).
static FailureOr<StringRef> kernelImageOf(ModuleOp module, StringRef func) {
  auto binary = module.lookupSymbol<gpu::BinaryOp>((func + "_kernels").str());
  if (!binary || binary.getObjects().empty())
    return module.emitError() << "no kernels were compiled for @" << func;
  return cast<gpu::ObjectAttr>(*binary.getObjects().begin())
      .getObject()
      .getValue();
}

FailureOr<StringRef> host::kernelImage(ModuleOp module) {
  for (auto binary : module.getOps<gpu::BinaryOp>())
    for (Attribute object : binary.getObjects())
      return cast<gpu::ObjectAttr>(object).getObject().getValue();
  return module.emitError() << "no kernels were compiled";
}

/// The largest token count whose grids and tensor maps stay within 2^31 - 1
/// blocks and rows (rows are i32 in the kernels).
static int64_t maxTokens(LaunchPlanAttr plan) {
  constexpr int64_t limit = (int64_t(1) << 31) - 1;
  int64_t most = limit;
  auto bound = [&](TokenLinear rows, int64_t capacity) {
    if (rows.perToken > 0)
      most = std::min(most, (capacity - rows.fixed) / rows.perToken);
  };
  for (KernelLaunchAttr launch : plan.getLaunchList())
    bound(launch.getWork(),
          (limit - launch.getExtraBlocks()) * launch.getPerBlock());
  for (TensorMapAttr map : plan.getTensorMapList())
    bound(map.getRows(), limit);
  return std::max<int64_t>(most, 0);
}

/// The offsets of every buffer: argument pointers or workspace slices.
static SmallVector<Value> bufferAddresses(HostBuilder &h, LaunchPlanAttr plan,
                                          Value args, Value tokens,
                                          Value workspace, Value epState) {
  SmallVector<Value> addresses;
  // The header comes first.
  Value header = h.c64(plan.getHeaderBytes());
  for (PlanBufferAttr buffer : plan.getBufferList()) {
    switch (buffer.getKind()) {
    case BufferKind::EpState:
      addresses.push_back(h.offset(epState, h.c64(buffer.getBytes().fixed)));
      break;
    case BufferKind::Counters:
      addresses.push_back(h.offset(workspace, h.c64(buffer.getBytes().fixed)));
      break;
    case BufferKind::Argument: {
      Value slot = LLVM::GEPOp::create(
          h.b, h.loc, h.ptr, h.ptr, args,
          ArrayRef<LLVM::GEPArg>{int32_t(buffer.getIndex())});
      addresses.push_back(LLVM::LoadOp::create(h.b, h.loc, h.ptr, slot));
      break;
    }
    case BufferKind::Workspace:
      addresses.push_back(
          h.offset(workspace,
                   LLVM::AddOp::create(h.b, h.loc, header,
                                       h.linear(buffer.getOffset(), tokens))));
      break;
    }
  }
  return addresses;
}

static bool usesEpState(LaunchPlanAttr plan) {
  return llvm::any_of(plan.getBufferList(), [](PlanBufferAttr buffer) {
    return buffer.getKind() == BufferKind::EpState;
  });
}

/// The expert-parallel group's device state; the call fails (with the
/// runtime's message) where the group was not started.
static Value epStateOrFail(HostBuilder &h) {
  Value state = h.call(RuntimeImport::moe_ep_cuda_state, {});
  Value missing = LLVM::ICmpOp::create(
      h.b, h.loc, LLVM::ICmpPredicate::eq,
      LLVM::PtrToIntOp::create(h.b, h.loc, h.i64, state), h.c64(0));
  h.check(LLVM::ZExtOp::create(h.b, h.loc, h.i32, missing));
  return state;
}

/// An array of i64 `values` on the stack.
static Value i64Array(HostBuilder &h, ArrayRef<Value> values) {
  Value slot = h.stackSlot(h.i64, values.size());
  for (auto [j, v] : llvm::enumerate(values))
    LLVM::StoreOp::create(h.b, h.loc, v, h.offset(slot, h.c64(8 * j)));
  return slot;
}

/// Encodes the plan's TMA descriptors on the host, 128 bytes each in one
/// stack buffer; the launches copy them.
static SmallVector<Value> encodeTensorMaps(HostBuilder &h, LaunchPlanAttr plan,
                                           ArrayRef<Value> buffers,
                                           Value tokens) {
  SmallVector<Value> maps;
  SmallVector<TensorMapAttr> tensorMaps = plan.getTensorMapList();
  if (tensorMaps.empty())
    return maps;
  Value staging = h.stackSlot(h.b.getI8Type(), tensorMaps.size() * 128, 64);
  for (auto [i, map] : llvm::enumerate(tensorMaps)) {
    // Dimensions innermost first: columns, rows (which may grow with the
    // token count), then the outer ones.
    SmallVector<Value> dims = {h.c64(map.getCols()),
                               h.linear(map.getRows(), tokens)};
    SmallVector<Value> strides = {
        h.c64(map.getRowStride() ? map.getRowStride() : map.getCols())};
    SmallVector<Value> box = {h.c64(map.getBoxCols()), h.c64(map.getBoxRows())};
    ArrayRef<int64_t> outer = map.getOuter();
    for (size_t j = 0; j < outer.size(); j += 3) {
      dims.push_back(h.c64(outer[j]));
      strides.push_back(h.c64(outer[j + 1]));
      box.push_back(h.c64(outer[j + 2]));
    }
    Value descriptor = h.offset(staging, h.c64(i * 128));
    h.check(
        h.call(RuntimeImport::moert_tensor_map,
               {descriptor, buffers[map.getBuffer()],
                h.c32(map.getElementBytes()), h.c32(dims.size()),
                i64Array(h, dims), i64Array(h, strides), i64Array(h, box)}));
    maps.push_back(descriptor);
  }
  return maps;
}

/// The kernel's name as a C string, one global per kernel shared by the
/// plans that launch it.
static Value kernelName(HostBuilder &h, ModuleOp module, StringRef kernel) {
  std::string global = ("moe_kernel_name_" + kernel).str();
  if (auto known = module.lookupSymbol<LLVM::GlobalOp>(global))
    return LLVM::AddressOfOp::create(h.b, h.loc, known);
  return LLVM::createGlobalString(h.loc, h.b, global,
                                  (kernel + Twine('\0')).str(),
                                  LLVM::Linkage::Internal);
}

namespace {
/// The values a plan's launches share.
struct LaunchContext {
  ModuleOp module;
  Value cudaModule, image, tokens, stream, workspace;
  ArrayRef<Value> buffers, maps;
};
} // namespace

/// Launches `launch` with ceil(work / per_block) + extra_blocks blocks along
/// x (at most one per multiprocessor for a persistent kernel), times the
/// blocks of a cluster.
static void launchKernel(HostBuilder &h, const LaunchContext &c,
                         KernelLaunchAttr launch) {
  Value params = h.stackSlot(h.ptr, launch.getArgs().size());
  for (auto [j, arg] : llvm::enumerate(launch.getArgs())) {
    // kernelParams[j] points at the parameter's value: a descriptor is its
    // own 128 bytes, other values (addresses) get a slot.
    Value slot;
    if (arg.kind == KernelArgKind::TensorMap) {
      slot = c.maps[arg.index];
    } else {
      Value value = arg.kind == KernelArgKind::Buffer ? c.buffers[arg.index]
                                                      : c.workspace;
      slot = h.stackSlot(value.getType(), 1);
      LLVM::StoreOp::create(h.b, h.loc, value, slot);
    }
    Value entryAddress = LLVM::GEPOp::create(
        h.b, h.loc, h.ptr, h.ptr, params, ArrayRef<LLVM::GEPArg>{int32_t(j)});
    LLVM::StoreOp::create(h.b, h.loc, slot, entryAddress);
  }
  Value work = h.linear(launch.getWork(), c.tokens);
  Value blocks = LLVM::UDivOp::create(
      h.b, h.loc,
      LLVM::AddOp::create(h.b, h.loc, work, h.c64(launch.getPerBlock() - 1)),
      h.c64(launch.getPerBlock()));
  blocks =
      LLVM::AddOp::create(h.b, h.loc, blocks, h.c64(launch.getExtraBlocks()));
  Value gridX = LLVM::TruncOp::create(h.b, h.loc, h.i32, blocks);
  int64_t cluster = launch.getCluster();
  if (launch.getPersistent()) {
    // A cluster of two fits every pair of multiprocessors (Hopper's
    // texture processor clusters hold two).
    Value clusters = h.call(RuntimeImport::moert_multiprocessors, {});
    if (cluster > 1)
      clusters = LLVM::UMaxOp::create(
          h.b, h.loc,
          LLVM::UDivOp::create(h.b, h.loc, clusters, h.c32(cluster)), h.c32(1));
    gridX = LLVM::UMinOp::create(h.b, h.loc, gridX, clusters);
  }
  if (cluster > 1)
    gridX = LLVM::MulOp::create(h.b, h.loc, gridX, h.c32(cluster));
  h.check(h.call(RuntimeImport::moert_launch,
                 {c.cudaModule, c.image,
                  kernelName(h, c.module, launch.getKernel().getValue()), gridX,
                  h.c32(launch.getGridY()), h.c32(launch.getBlock()),
                  h.c32(launch.getSharedBytes()),
                  h.c32(launch.getCooperative() ? 1 : 0), c.stream, params}));
}

/// int32_t enqueue(void *const *args, int64_t tokens, void *stream,
///                 void *workspace)
/// launches `plan`'s kernels on `stream` with grids, workspace slices and
/// TMA descriptors sized for `tokens` (the kernels read the call's own
/// count from the workspace, so a bucket's graph is captured at its size).
static LLVM::LLVMFuncOp addEnqueue(ModuleOp module, StringRef symbol,
                                   LaunchPlanAttr plan, LLVM::GlobalOp image,
                                   LLVM::GlobalOp moduleSlot) {
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, module.getLoc());
  auto f = LLVM::LLVMFuncOp::create(
      b, h.loc, symbol,
      LLVM::LLVMFunctionType::get(h.i32, {h.ptr, h.i64, h.ptr, h.ptr}),
      LLVM::Linkage::Internal);
  Block *entry = f.addEntryBlock(b);
  h.failure = b.createBlock(&f.getBody(), {}, {h.i32}, {h.loc});
  LLVM::ReturnOp::create(b, h.loc, h.failure->getArgument(0));
  b.setInsertionPointToStart(entry);
  Value argv = entry->getArgument(0), tokens = entry->getArgument(1);
  Value stream = entry->getArgument(2), ws = entry->getArgument(3);
  // An expert-parallel layer's state, mapped by every peer at init.
  Value epState = usesEpState(plan) ? epStateOrFail(h)
                                    : LLVM::ZeroOp::create(b, h.loc, h.ptr);
  SmallVector<Value> buffers =
      bufferAddresses(h, plan, argv, tokens, ws, epState);
  SmallVector<Value> maps = encodeTensorMaps(h, plan, buffers, tokens);
  LaunchContext context{module,
                        LLVM::AddressOfOp::create(b, h.loc, moduleSlot),
                        LLVM::AddressOfOp::create(b, h.loc, image),
                        tokens,
                        stream,
                        ws,
                        buffers,
                        maps};
  for (KernelLaunchAttr launch : plan.getLaunchList())
    launchKernel(h, context, launch);
  LLVM::ReturnOp::create(b, h.loc, h.c32(0));
  return f;
}

namespace {
/// A GPU layer's plans and the globals its entry points share.
struct GpuLayer {
  InterfaceAttr interface;
  LaunchPlanAttr plan;
  SmallVector<LaunchPlanAttr> buckets;
  LLVM::GlobalOp graphsOn;
  SmallVector<LLVM::GlobalOp> graphSlots;
  // Each bucket's enqueue, then the plan's for any count.
  SmallVector<LLVM::LLVMFuncOp> enqueues;
  // A training library's training forward and backward, which share the
  // forward's workspace.
  LaunchPlanAttr train, backward;
};
} // namespace

/// The image of `cubin` and its loaded module (cached by the runtime on
/// first use), as globals named after `stem`.
static std::pair<LLVM::GlobalOp, LLVM::GlobalOp>
addImage(ModuleOp host, StringRef stem, StringRef cubin) {
  OpBuilder b = OpBuilder::atBlockEnd(host.getBody());
  Location loc = host.getLoc();
  auto moduleSlot = LLVM::GlobalOp::create(
      b, loc, b.getI64Type(), /*isConstant=*/false, LLVM::Linkage::Internal,
      ("moe_cuda_module" + stem).str(), b.getI64IntegerAttr(0));
  // 64-byte aligned as cuModuleLoadData wants.
  auto image = LLVM::GlobalOp::create(
      b, loc, LLVM::LLVMArrayType::get(b.getI8Type(), cubin.size()),
      /*isConstant=*/true, LLVM::Linkage::Internal, ("moe_cubin" + stem).str(),
      b.getStringAttr(cubin), /*alignment=*/64);
  return {image, moduleSlot};
}

/// The loaded module, the switch for graphs, each bucket's graphs, the
/// image and an enqueue function per plan.
static void addPlans(ModuleOp host, GpuLayer &layer, StringRef cubin) {
  OpBuilder b = OpBuilder::atBlockEnd(host.getBody());
  Location loc = host.getLoc();
  Type i64 = b.getI64Type();
  // Whether a bucket's call replays its graph (set_graphs).
  layer.graphsOn = LLVM::GlobalOp::create(
      b, loc, b.getI32Type(), /*isConstant=*/false, LLVM::Linkage::Internal,
      "moe_graphs_enabled", b.getI32IntegerAttr(1));
  // Each bucket's graphs, owned by the runtime.
  for (size_t i = 0; i < layer.buckets.size(); ++i)
    layer.graphSlots.push_back(LLVM::GlobalOp::create(
        b, loc, i64, /*isConstant=*/false, LLVM::Linkage::Internal,
        ("moe_graphs_" + Twine(i)).str(), b.getI64IntegerAttr(0)));
  auto [image, moduleSlot] = addImage(host, "", cubin);
  for (auto [i, bucket] : llvm::enumerate(layer.buckets))
    layer.enqueues.push_back(addEnqueue(host, ("moe_enqueue_" + Twine(i)).str(),
                                        bucket, image, moduleSlot));
  layer.enqueues.push_back(
      addEnqueue(host, "moe_enqueue", layer.plan, image, moduleSlot));
}

/// The bytes a call's workspace needs: its bucket's at the bucket's size
/// (its graph is captured there), else the plan's for any count.
static Value workspaceAt(HostBuilder &h, const GpuLayer &layer, Value tokens) {
  Value bytes = h.linear(layer.plan.getWorkspaceBytes(), tokens);
  for (LaunchPlanAttr bucket : llvm::reverse(layer.buckets)) {
    Value inside = LLVM::ICmpOp::create(h.b, h.loc, LLVM::ICmpPredicate::sle,
                                        tokens, h.c64(bucket.getMaxTokens()));
    TokenLinear room = bucket.getWorkspaceBytes();
    bytes = LLVM::SelectOp::create(
        h.b, h.loc, inside,
        h.c64(room.fixed + room.perToken * bucket.getMaxTokens()), bytes);
  }
  for (LaunchPlanAttr plan : {layer.train, layer.backward})
    if (plan)
      bytes = LLVM::UMaxOp::create(h.b, h.loc, bytes,
                                   h.linear(plan.getWorkspaceBytes(), tokens));
  return bytes;
}

/// int64_t moe_<name>_workspace_size(int64_t tokens)
static void addWorkspaceSize(ModuleOp host, const GpuLayer &layer) {
  OpBuilder b = OpBuilder::atBlockEnd(host.getBody());
  HostBuilder h(b, host.getLoc());
  auto f = LLVM::LLVMFuncOp::create(
      b, h.loc, layer.interface.getSymbol("workspace_size"),
      LLVM::LLVMFunctionType::get(h.i64, {h.i64}));
  Block *entry = f.addEntryBlock(b);
  b.setInsertionPointToStart(entry);
  LLVM::ReturnOp::create(b, h.loc,
                         workspaceAt(h, layer, entry->getArgument(0)));
}

/// What moert_check_call checks each argument for: 'e' empty (a size of
/// 0: never read), 't' sized by the token count, 'w' fixed.
static std::string argumentKinds(InterfaceAttr interface) {
  std::string kinds;
  for (ArgumentAttr arg : interface.getArgList()) {
    ArrayRef<int64_t> shape = arg.getType().getShape();
    kinds.push_back(llvm::is_contained(shape, 0)                        ? 'e'
                    : !shape.empty() && ShapedType::isDynamic(shape[0]) ? 't'
                                                                        : 'w');
  }
  kinds.push_back('\0');
  return kinds;
}

/// The most tokens a call may bring: what every plan's grids and maps
/// take, at most an expert-parallel layer's capacity, or a bucket's size.
static int64_t callLimit(const GpuLayer &layer) {
  int64_t most = maxTokens(layer.plan);
  for (LaunchPlanAttr bucket : layer.buckets)
    most = std::max(most, std::min(maxTokens(bucket), bucket.getMaxTokens()));
  // A bucket above an expert-parallel layer's capacity raises nothing.
  if (ExpertParallelAttr ep = layer.interface.getExpertParallel())
    most = std::min(most, ep.getMaxTokens());
  return most;
}

/// The arguments a bucket's graphs are kept under, and their count: the
/// call's, then an expert-parallel layer's state (a group started again
/// may have another, and a graph holds the address it was captured with).
static std::pair<Value, int64_t> graphKey(HostBuilder &h, const GpuLayer &layer,
                                          Value argv) {
  int64_t numArgs = layer.interface.getArgs().size();
  if (!usesEpState(layer.plan))
    return {argv, numArgs};
  OpBuilder &b = h.b;
  Value state = epStateOrFail(h);
  Value key = h.stackSlot(h.ptr, numArgs + 1);
  auto slot = [&](Value array, int64_t j) -> Value {
    return LLVM::GEPOp::create(b, h.loc, h.ptr, h.ptr, array,
                               ArrayRef<LLVM::GEPArg>{int32_t(j)});
  };
  for (int64_t j = 0; j < numArgs; ++j)
    LLVM::StoreOp::create(b, h.loc,
                          LLVM::LoadOp::create(b, h.loc, h.ptr, slot(argv, j)),
                          slot(key, j));
  LLVM::StoreOp::create(b, h.loc, state, slot(key, numArgs));
  return {key, numArgs + 1};
}

/// Returns from the forward what the smallest bucket that holds the call
/// returns from replaying its graph; falls through above every bucket.
static void replayBuckets(HostBuilder &h, const GpuLayer &layer, Value argv,
                          Value tokens, Value stream, Value ws) {
  OpBuilder &b = h.b;
  Value enabled = LLVM::LoadOp::create(
      b, h.loc, h.i32, LLVM::AddressOfOp::create(b, h.loc, layer.graphsOn));
  int64_t numArgs;
  std::tie(argv, numArgs) = graphKey(h, layer, argv);
  for (auto [i, bucket] : llvm::enumerate(layer.buckets)) {
    Value inside = LLVM::ICmpOp::create(b, h.loc, LLVM::ICmpPredicate::sle,
                                        tokens, h.c64(bucket.getMaxTokens()));
    Block *current = b.getInsertionBlock();
    Block *replay = b.createBlock(current->getParent());
    Block *next = b.createBlock(current->getParent());
    b.setInsertionPointToEnd(current);
    LLVM::CondBrOp::create(b, h.loc, inside, replay, ValueRange{}, next,
                           ValueRange{});
    b.setInsertionPointToStart(replay);
    Value status =
        h.call(RuntimeImport::moert_graph_launch,
               {LLVM::AddressOfOp::create(b, h.loc, layer.graphSlots[i]),
                LLVM::AddressOfOp::create(b, h.loc, layer.enqueues[i]), argv,
                h.c32(numArgs), tokens, h.c64(bucket.getMaxTokens()), stream,
                ws, enabled});
    LLVM::ReturnOp::create(b, h.loc, status);
    b.setInsertionPointToStart(next);
  }
}

/// moe_<name>_forward: checks the call, sets the token count in the
/// workspace, then replays a bucket's graph or launches the plan.
static void addForward(ModuleOp host, const GpuLayer &layer) {
  OpBuilder b = OpBuilder::atBlockEnd(host.getBody());
  HostBuilder h(b, host.getLoc());
  auto forward = LLVM::LLVMFuncOp::create(
      b, h.loc, layer.interface.getSymbol("forward"),
      LLVM::LLVMFunctionType::get(h.i32, {h.ptr, h.i64, h.ptr, h.ptr}));
  Block *entry = forward.addEntryBlock(b);
  h.failure = b.createBlock(&forward.getBody(), {}, {h.i32}, {h.loc});
  LLVM::ReturnOp::create(b, h.loc, h.failure->getArgument(0));
  b.setInsertionPointToStart(entry);
  Value argv = entry->getArgument(0), tokens = entry->getArgument(1);
  Value stream = entry->getArgument(2), ws = entry->getArgument(3);
  // A call the kernels cannot take safely fails here, not on the GPU.
  Value kinds = LLVM::createGlobalString(h.loc, b, "moe_arg_kinds",
                                         argumentKinds(layer.interface),
                                         LLVM::Linkage::Internal);
  h.check(h.call(RuntimeImport::moert_check_call,
                 {argv, kinds, tokens, h.c64(callLimit(layer)), ws,
                  workspaceAt(h, layer, tokens)}));
  // The kernels read the count from the workspace header, whose counters
  // start at it too (the most any plan has).
  int64_t words = 1 + layer.plan.getCounters();
  for (LaunchPlanAttr bucket : layer.buckets)
    words = std::max(words, 1 + bucket.getCounters());
  h.check(h.call(RuntimeImport::moert_set_tokens,
                 {ws, tokens, h.c64(words), stream}));
  replayBuckets(h, layer, argv, tokens, stream, ws);
  LLVM::ReturnOp::create(
      b, h.loc,
      LLVM::CallOp::create(b, h.loc, layer.enqueues.back(),
                           ValueRange{argv, tokens, stream, ws})
          .getResult());
}

/// void moe_<name>_set_graphs(int32_t on), and
/// int32_t moe_<name>_warmup(void *const *args, void *stream, void *ws),
/// which captures every bucket's graph for these arguments, launching
/// nothing.
static void addGraphControls(ModuleOp host, const GpuLayer &layer) {
  OpBuilder b = OpBuilder::atBlockEnd(host.getBody());
  HostBuilder h(b, host.getLoc());
  auto setGraphs = LLVM::LLVMFuncOp::create(
      b, h.loc, layer.interface.getSymbol("set_graphs"),
      LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(b.getContext()),
                                  {h.i32}));
  b.setInsertionPointToStart(setGraphs.addEntryBlock(b));
  LLVM::StoreOp::create(b, h.loc, setGraphs.getArgument(0),
                        LLVM::AddressOfOp::create(b, h.loc, layer.graphsOn));
  LLVM::ReturnOp::create(b, h.loc, ValueRange{});

  b.setInsertionPointToEnd(host.getBody());
  auto warmup = LLVM::LLVMFuncOp::create(
      b, h.loc, layer.interface.getSymbol("warmup"),
      LLVM::LLVMFunctionType::get(h.i32, {h.ptr, h.ptr, h.ptr}));
  Block *body = warmup.addEntryBlock(b);
  h.failure = b.createBlock(&warmup.getBody(), {}, {h.i32}, {h.loc});
  LLVM::ReturnOp::create(b, h.loc, h.failure->getArgument(0));
  b.setInsertionPointToStart(body);
  auto [key, numArgs] = graphKey(h, layer, body->getArgument(0));
  for (auto [i, bucket] : llvm::enumerate(layer.buckets))
    h.check(h.call(RuntimeImport::moert_graph_prepare,
                   {LLVM::AddressOfOp::create(b, h.loc, layer.graphSlots[i]),
                    LLVM::AddressOfOp::create(b, h.loc, layer.enqueues[i]), key,
                    h.c32(numArgs), h.c64(bucket.getMaxTokens()),
                    body->getArgument(1), body->getArgument(2)}));
  LLVM::ReturnOp::create(b, h.loc, h.c32(0));
}

//===----------------------------------------------------------------------===//
// Training
//===----------------------------------------------------------------------===//

/// The launch plan of `module`'s function `name`, which must have no token
/// buckets (a training step's kernels take any count).
static FailureOr<LaunchPlanAttr> trainingPlan(ModuleOp module, StringRef name) {
  auto func = module.lookupSymbol<func::FuncOp>(name);
  auto plan =
      func ? func->getAttrOfType<LaunchPlanAttr>(LaunchPlanAttr::getAttrName())
           : LaunchPlanAttr();
  if (!plan)
    return module.emitError()
           << "the training function @" << name << " has no launch plan";
  if (func->hasAttr(kBucketPlansAttrName))
    return func.emitOpError() << "has token buckets; a training step's "
                                 "kernels are built for any count";
  return plan;
}

/// An array of `values` (pointers) on the stack.
static Value pointerArray(HostBuilder &h, ArrayRef<Value> values) {
  Value array = h.stackSlot(h.ptr, values.size());
  for (auto [j, v] : llvm::enumerate(values))
    LLVM::StoreOp::create(
        h.b, h.loc, v,
        LLVM::GEPOp::create(h.b, h.loc, h.ptr, h.ptr, array,
                            ArrayRef<LLVM::GEPArg>{int32_t(j)}));
  return array;
}

/// Checks a training call's arguments (`kinds` as moert_check_call takes
/// them, within `limit` tokens) and `saved`, and sets the token count in
/// the workspace for `plan`.
static void beginTrainingCall(HostBuilder &h, const GpuLayer &layer,
                              LaunchPlanAttr plan, StringRef kindsName,
                              std::string kinds, Value argv, Value tokens,
                              Value saved, Value stream, Value ws) {
  int64_t limit = std::min(maxTokens(plan), maxTokens(layer.plan));
  // An expert-parallel step's exchange holds at most its capacity.
  if (ExpertParallelAttr ep = layer.interface.getExpertParallel())
    limit = std::min(limit, ep.getMaxTokens());
  kinds.push_back('\0');
  Value kindsText = LLVM::createGlobalString(h.loc, h.b, kindsName, kinds,
                                             LLVM::Linkage::Internal);
  h.check(h.call(RuntimeImport::moert_check_call,
                 {argv, kindsText, tokens, h.c64(limit), ws,
                  workspaceAt(h, layer, tokens)}));
  h.check(h.call(RuntimeImport::moert_device_saved_check, {saved, tokens}));
  h.check(h.call(RuntimeImport::moert_set_tokens,
                 {ws, tokens, h.c64(1 + plan.getCounters()), stream}));
}

/// The slices of the saved tensors in `saved`.
static SmallVector<Value> savedSlices(HostBuilder &h, TrainingAttr training,
                                      Value saved, Value tokens) {
  SmallVector<Value> slices;
  for (unsigned i = 0; i < training.getSavedList().size(); ++i)
    slices.push_back(
        h.offset(saved, h.linear(training.getSavedOffset(i), tokens)));
  return slices;
}

/// int32_t forward_train(void *const *args, int64_t tokens, void *stream,
///                       void *workspace, void *saved), and
/// int32_t backward(void *const *args, int64_t tokens,
///                  const void *output_grad, const void *saved,
///                  void *const *grads, int32_t flags, void *stream,
///                  void *workspace): the training function's plan on args
/// (the output included) and the saved slices, and the backward's on the
/// inputs, the output's gradient, the saved slices and the gradients.
static void addTrainingEntries(ModuleOp host, const GpuLayer &layer,
                               LLVM::LLVMFuncOp enqueueTrain,
                               LLVM::LLVMFuncOp enqueueBackward) {
  InterfaceAttr interface = layer.interface;
  TrainingAttr training = interface.getTraining();
  OpBuilder b = OpBuilder::atBlockEnd(host.getBody());
  HostBuilder h(b, host.getLoc());
  // Launches a plan on the call's pointers and returns its status.
  auto enqueue = [&](LLVM::LLVMFuncOp fn, ArrayRef<Value> pointers,
                     Value tokens, Value stream, Value ws) {
    LLVM::ReturnOp::create(
        b, h.loc,
        LLVM::CallOp::create(
            b, h.loc, fn,
            ValueRange{pointerArray(h, pointers), tokens, stream, ws})
            .getResult());
  };
  SmallVector<ArgumentAttr> args = interface.getArgList();
  std::string kinds = argumentKinds(interface);
  kinds.pop_back();

  auto forward = h.statusFunction(host, interface.getSymbol("forward_train"),
                                  {h.ptr, h.i64, h.ptr, h.ptr, h.ptr});
  Value argv = forward.getArgument(0), tokens = forward.getArgument(1);
  Value stream = forward.getArgument(2), ws = forward.getArgument(3);
  Value saved = forward.getArgument(4);
  beginTrainingCall(h, layer, layer.train, "moe_train_arg_kinds", kinds, argv,
                    tokens, saved, stream, ws);
  SmallVector<Value> pointers;
  for (size_t i = 0; i < args.size(); ++i)
    pointers.push_back(h.pointerAt(argv, i));
  llvm::append_range(pointers, savedSlices(h, training, saved, tokens));
  enqueue(enqueueTrain, pointers, tokens, stream, ws);

  auto backward = h.statusFunction(
      host, interface.getSymbol("backward"),
      {h.ptr, h.i64, h.ptr, h.ptr, h.ptr, h.i32, h.ptr, h.ptr});
  argv = backward.getArgument(0), tokens = backward.getArgument(1);
  Value outputGrad = backward.getArgument(2);
  saved = backward.getArgument(3);
  Value grads = backward.getArgument(4), flags = backward.getArgument(5);
  stream = backward.getArgument(6), ws = backward.getArgument(7);
  // The backward does not read the outputs.
  std::string inputKinds = kinds;
  for (auto [i, arg] : llvm::enumerate(args))
    if (arg.getOutput())
      inputKinds[i] = 'e';
  beginTrainingCall(h, layer, layer.backward, "moe_backward_arg_kinds",
                    inputKinds, argv, tokens, saved, stream, ws);
  std::string gradKinds;
  for (ArgumentAttr grad : training.getGradientList())
    gradKinds.push_back(grad.getType().isDynamicDim(0) ? 't' : 'w');
  gradKinds.push_back('\0');
  int64_t numGrads = training.getGradientList().size();
  h.check(h.call(RuntimeImport::moert_device_backward_check,
                 {outputGrad, grads,
                  LLVM::createGlobalString(h.loc, b, "moe_grad_kinds",
                                           gradKinds, LLVM::Linkage::Internal),
                  tokens, flags}));
  pointers.clear();
  for (auto [i, arg] : llvm::enumerate(args))
    if (!arg.getOutput())
      pointers.push_back(h.pointerAt(argv, i));
  pointers.push_back(outputGrad);
  llvm::append_range(pointers, savedSlices(h, training, saved, tokens));
  for (int64_t i = 0; i < numGrads; ++i)
    pointers.push_back(h.pointerAt(grads, i));
  enqueue(enqueueBackward, pointers, tokens, stream, ws);
}

LogicalResult host::addLaunchEntryPoints(ModuleOp host, ModuleOp module,
                                         InterfaceAttr interface) {
  auto func = module.lookupSymbol<func::FuncOp>(interface.getName());
  GpuLayer layer{interface, {}, {}, {}, {}, {}};
  layer.plan =
      func ? func->getAttrOfType<LaunchPlanAttr>(LaunchPlanAttr::getAttrName())
           : LaunchPlanAttr();
  if (!layer.plan)
    return module.emitError() << "the layer function @" << interface.getName()
                              << " has no launch plan";
  if (auto list = func->getAttrOfType<ArrayAttr>(kBucketPlansAttrName))
    for (Attribute bucket : list)
      layer.buckets.push_back(cast<LaunchPlanAttr>(bucket));
  FailureOr<StringRef> cubin = kernelImageOf(module, interface.getName());
  if (failed(cubin))
    return failure();
  addPlans(host, layer, *cubin);
  LLVM::LLVMFuncOp enqueueTrain, enqueueBackward;
  if (interface.getTraining()) {
    // The training forward and the backward: their own cubins and plans.
    auto add = [&](StringRef suffix, LaunchPlanAttr &plan,
                   LLVM::LLVMFuncOp &enqueue) -> LogicalResult {
      std::string name = (interface.getName() + suffix).str();
      FailureOr<LaunchPlanAttr> found = trainingPlan(module, name);
      FailureOr<StringRef> image = kernelImageOf(module, name);
      if (failed(found) || failed(image))
        return failure();
      plan = *found;
      auto [global, slot] = addImage(host, suffix, *image);
      enqueue =
          addEnqueue(host, ("moe_enqueue" + suffix).str(), plan, global, slot);
      return success();
    };
    if (failed(add("_train", layer.train, enqueueTrain)) ||
        failed(add("_backward", layer.backward, enqueueBackward)))
      return failure();
  }
  addWorkspaceSize(host, layer);
  addForward(host, layer);
  if (!layer.buckets.empty())
    addGraphControls(host, layer);
  if (interface.getTraining()) {
    mlir::moe::host::addSavedSize(host, interface);
    addTrainingEntries(host, layer, enqueueTrain, enqueueBackward);
  }
  return success();
}
