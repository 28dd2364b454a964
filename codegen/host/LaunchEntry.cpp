//===- LaunchEntry.cpp - host code of a GPU layer -------------------------===//
//
// A GPU layer's library exports
//   int32_t moe_<name>_forward(void *const *args, int64_t tokens,
//                              void *stream, void *workspace);
//   int64_t moe_<name>_workspace_size(int64_t tokens);
//   const char *moe_last_error(void);
//   const char *moe_layer_info(void);
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

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "runtime/EpLayout.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

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

static LLVM::LLVMFuncOp declare(OpBuilder &b, ModuleOp module, Location loc,
                                StringRef name, Type result,
                                ArrayRef<Type> params) {
  if (auto f = module.lookupSymbol<LLVM::LLVMFuncOp>(name))
    return f;
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(module.getBody());
  return LLVM::LLVMFuncOp::create(b, loc, name,
                                  LLVM::LLVMFunctionType::get(result, params));
}

/// The offsets of every buffer: argument pointers or workspace slices.
static SmallVector<Value> bufferAddresses(HostBuilder &h, LaunchPlanAttr plan,
                                          Value args, Value tokens,
                                          Value workspace, Value epState) {
  SmallVector<Value> addresses;
  // The header comes first.
  Value cursor = h.c64(plan.getHeaderBytes());
  for (PlanBufferAttr buffer : plan.getBufferList()) {
    if (buffer.getArg() == -2) {
      addresses.push_back(h.offset(epState, h.c64(buffer.getBytes().fixed)));
      continue;
    }
    if (buffer.getArg() == -3) {
      addresses.push_back(h.offset(workspace, h.c64(buffer.getBytes().fixed)));
      continue;
    }
    if (buffer.getArg() >= 0) {
      Value slot =
          LLVM::GEPOp::create(h.b, h.loc, h.ptr, h.ptr, args,
                              ArrayRef<LLVM::GEPArg>{int32_t(buffer.getArg())});
      addresses.push_back(LLVM::LoadOp::create(h.b, h.loc, h.ptr, slot));
      continue;
    }
    addresses.push_back(h.offset(workspace, cursor));
    cursor = LLVM::AddOp::create(h.b, h.loc, cursor,
                                 h.linear(buffer.getSliceBytes(), tokens));
  }
  return addresses;
}

/// `then` in its own block when `cond` holds; continues after it.
static void ifThen(HostBuilder &h, Value cond, function_ref<void()> then) {
  OpBuilder &b = h.b;
  Block *current = b.getInsertionBlock();
  Region *region = current->getParent();
  Block *body = b.createBlock(region);
  Block *next = b.createBlock(region);
  b.setInsertionPointToEnd(current);
  LLVM::CondBrOp::create(b, h.loc, cond, body, ValueRange{}, next,
                         ValueRange{});
  b.setInsertionPointToStart(body);
  then();
  LLVM::BrOp::create(b, h.loc, ValueRange{}, next);
  b.setInsertionPointToStart(next);
}

/// The proxy routine of an expert-parallel GPU layer, specialized to its
/// layout (runtime/EpLayout.h: ranks, record and row bytes, offsets):
///   int32_t moe_<name>_ep_proxy_turn(moe_transport_t *transport,
///       uint8_t *state, uint8_t *staging, int32_t self,
///       uint64_t *progress, int32_t timeout_ms)
/// One pass over the peers: what the kernels staged for a peer (its flag
/// raised) is posted to it with RMA writes, and a peer's flag is raised in
/// the state once lib/transport has counted its writes in. `progress`
/// holds six counters per peer between passes. Returns 0 when there was
/// nothing to do, 1 when it did something, 2 when a write failed. The
/// runtime's proxy thread (EpCudaGroup.cpp) calls it in a loop.
static LLVM::LLVMFuncOp addProxyTurn(ModuleOp module, StringRef name,
                                     const ::moe::rt::EpDeviceLayout &layout) {
  using ::moe::rt::EpDeviceLayout;
  Location loc = module.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, loc);
  Type ptr = h.ptr, i64 = h.i64, i32 = h.i32;
  auto writeFn = declare(b, module, loc, "moe_transport_write", i32,
                         {ptr, i32, i64, i64, i64, i32, i32});
  auto arrivalsFn =
      declare(b, module, loc, "moe_transport_arrivals", i64, {ptr, i32, i32});
  b.setInsertionPointToEnd(module.getBody());
  auto turn = LLVM::LLVMFuncOp::create(
      b, loc, ("moe_" + name + "_ep_proxy_turn").str(),
      LLVM::LLVMFunctionType::get(i32, {ptr, ptr, ptr, i32, ptr, i32}));
  Block *entry = turn.addEntryBlock(b);
  // A failed write returns 2 (its message is lib/transport's last error).
  h.failure = b.createBlock(&turn.getBody(), {}, {i32}, {loc});
  LLVM::ReturnOp::create(b, loc, h.c32(2));
  b.setInsertionPointToStart(entry);
  Value transport = entry->getArgument(0), state = entry->getArgument(1);
  Value staging = entry->getArgument(2), self = entry->getArgument(3);
  Value progress = entry->getArgument(4), timeout = entry->getArgument(5);

  const ::moe::rt::EpLayout &l = layout.recvLayout;
  int64_t ranks = l.ranks, stateBytes = int64_t(layout.bytes());
  int64_t slots = EpDeviceLayout::kRecv;
  int64_t regions = EpDeviceLayout::kRecv + int64_t(l.dispatchOffset());
  int64_t rows = EpDeviceLayout::kRecv + int64_t(l.combineOffset());
  int64_t flags = int64_t(layout.combineFlags());
  int64_t stride = int64_t(l.maxRecordBytes()), rowBytes = l.outRowBytes();
  const int64_t dispatchPayload = ::moe::rt::kCounterDispatchPayload,
                dispatchCount = ::moe::rt::kCounterDispatchCount,
                combinePayload = ::moe::rt::kCounterCombinePayload,
                combineCount = ::moe::rt::kCounterCombineCount;

  Value did = h.stackSlot(i32, 1, 4);
  LLVM::StoreOp::create(b, loc, h.c32(0), did);
  Value self64 = LLVM::ZExtOp::create(b, loc, i64, self);
  auto add = [&](Value x, Value y) {
    return LLVM::AddOp::create(b, loc, x, y);
  };
  auto mul = [&](Value x, int64_t y) {
    return LLVM::MulOp::create(b, loc, x, h.c64(y));
  };
  auto cmp = [&](LLVM::ICmpPredicate p, Value x, Value y) {
    return LLVM::ICmpOp::create(b, loc, p, x, y);
  };
  auto load32 = [&](Value base, Value bytes) {
    return LLVM::LoadOp::create(b, loc, i32, h.offset(base, bytes), 4,
                                /*isVolatile=*/true)
        .getResult();
  };
  auto store32 = [&](Value v, Value base, Value bytes) {
    LLVM::StoreOp::create(b, loc, v, h.offset(base, bytes), 4,
                          /*isVolatile=*/true);
  };
  auto counter = [&](int64_t which, int64_t q) {
    return h.offset(progress, h.c64(8 * (which * ranks + q)));
  };
  auto fence = [&](LLVM::AtomicOrdering ordering) {
    LLVM::FenceOp::create(b, loc, ordering);
  };
  auto write = [&](int64_t q, Value src, Value length, Value dst,
                   int64_t counterId) {
    h.check(LLVM::CallOp::create(b, loc, writeFn,
                                 ValueRange{transport, h.c32(q), src, length,
                                            dst, h.c32(counterId), timeout})
                .getResult());
  };
  auto arrivals = [&](int64_t q, int64_t counterId) {
    return LLVM::CallOp::create(
               b, loc, arrivalsFn,
               ValueRange{transport, h.c32(q), h.c32(counterId)})
        .getResult();
  };
  auto markDone = [&] { LLVM::StoreOp::create(b, loc, h.c32(1), did); };

  for (int64_t q = 0; q < ranks; ++q) {
    ifThen(h, cmp(LLVM::ICmpPredicate::ne, self, h.c32(q)), [&] {
      Value stage = h.offset(staging, h.c64(q * stateBytes));
      Value mySlot = add(h.c64(slots), mul(self64, 16));
      // Send: records staged for q, then the count slot without its
      // sequence number (q's proxy raises that once the writes are in).
      Value seq = LLVM::ZExtOp::create(b, loc, i64,
                                       load32(stage, add(mySlot, h.c64(12))));
      Value sent = LLVM::LoadOp::create(b, loc, i64, counter(0, q), 8);
      ifThen(h, cmp(LLVM::ICmpPredicate::ne, seq, sent), [&] {
        fence(LLVM::AtomicOrdering::acquire);
        Value records =
            LLVM::ZExtOp::create(b, loc, i64, load32(stage, mySlot));
        Value region = add(h.c64(regions), mul(self64, l.regionBytes()));
        ifThen(h, cmp(LLVM::ICmpPredicate::ne, records, h.c64(0)), [&] {
          write(q, add(h.c64(q * stateBytes), region), mul(records, stride),
                region, dispatchPayload);
        });
        write(q, add(h.c64(q * stateBytes), mySlot), h.c64(12), mySlot,
              dispatchCount);
        LLVM::StoreOp::create(b, loc, seq, counter(0, q), 8);
        markDone();
      });
      Value myFlag = add(h.c64(flags), mul(self64, 16));
      Value done = LLVM::ZExtOp::create(b, loc, i64, load32(stage, myFlag));
      Value sentBack = LLVM::LoadOp::create(b, loc, i64, counter(1, q), 8);
      ifThen(h, cmp(LLVM::ICmpPredicate::ne, done, sentBack), [&] {
        fence(LLVM::AtomicOrdering::acquire);
        // The rows owed q, where q said its outputs from this rank go.
        Value owed = LLVM::ZExtOp::create(
            b, loc, i64,
            load32(state, h.c64(int64_t(EpDeviceLayout::kReturnRows) + 4 * q)));
        Value base = LLVM::ZExtOp::create(
            b, loc, i64, load32(state, h.c64(slots + 16 * q + 4)));
        Value at = add(h.c64(rows), mul(base, rowBytes));
        ifThen(h, cmp(LLVM::ICmpPredicate::ne, owed, h.c64(0)), [&] {
          write(q, add(h.c64(q * stateBytes), at), mul(owed, rowBytes), at,
                combinePayload);
        });
        Value countAt = add(myFlag, h.c64(4));
        store32(LLVM::TruncOp::create(b, loc, i32, owed), stage, countAt);
        write(q, add(h.c64(q * stateBytes), countAt), h.c64(4), countAt,
              combineCount);
        LLVM::StoreOp::create(b, loc, done, counter(1, q), 8);
        markDone();
      });
      // Receive: raise q's flags once its writes are all in.
      auto raise = [&](int64_t countId, int64_t payloadId, int64_t got,
                       int64_t gotPayload, int64_t countOffset,
                       int64_t flagOffset) {
        Value seen = LLVM::LoadOp::create(b, loc, i64, counter(got, q), 8);
        ifThen(
            h, cmp(LLVM::ICmpPredicate::ugt, arrivals(q, countId), seen), [&] {
              Value n = load32(state, h.c64(countOffset));
              Value any = cmp(LLVM::ICmpPredicate::ne, n, h.c32(0));
              Value payloads =
                  LLVM::LoadOp::create(b, loc, i64, counter(gotPayload, q), 8);
              Value arrived = cmp(LLVM::ICmpPredicate::ugt,
                                  arrivals(q, payloadId), payloads);
              Value complete = LLVM::OrOp::create(
                  b, loc,
                  LLVM::XOrOp::create(
                      b, loc, any,
                      LLVM::ConstantOp::create(b, loc, b.getI1Type(), 1)),
                  arrived);
              ifThen(h, complete, [&] {
                LLVM::StoreOp::create(
                    b, loc,
                    add(payloads, LLVM::ZExtOp::create(b, loc, i64, any)),
                    counter(gotPayload, q), 8);
                Value next = add(seen, h.c64(1));
                LLVM::StoreOp::create(b, loc, next, counter(got, q), 8);
                fence(LLVM::AtomicOrdering::release);
                store32(LLVM::TruncOp::create(b, loc, i32, next), state,
                        h.c64(flagOffset));
                markDone();
              });
            });
      };
      raise(dispatchCount, dispatchPayload, 2, 3, slots + 16 * q,
            slots + 16 * q + 12);
      raise(combineCount, combinePayload, 4, 5, flags + 16 * q + 4,
            flags + 16 * q);
    });
  }
  LLVM::ReturnOp::create(b, loc,
                         LLVM::LoadOp::create(b, loc, i32, did, 4).getResult());
  // The runtime gets its address from init: not part of the ABI.
  turn.setLinkage(LLVM::Linkage::Internal);
  return turn;
}

/// int32_t enqueue(void *const *args, int64_t tokens, void *stream,
///                 void *workspace)
/// launches `plan`'s kernels on `stream` with grids, workspace slices and
/// TMA descriptors sized for `tokens` (the kernels read the call's own
/// count from the workspace, so a bucket's graph is captured at its size).
static LLVM::LLVMFuncOp addEnqueue(ModuleOp module, StringRef symbol,
                                   LaunchPlanAttr plan, LLVM::GlobalOp image,
                                   LLVM::GlobalOp moduleSlot) {
  Location loc = module.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, loc);
  Type ptr = h.ptr, i64 = h.i64, i32 = h.i32;
  auto launchFn = declare(b, module, loc, "moert_launch", i32,
                          {ptr, ptr, ptr, i32, i32, i32, i32, ptr, ptr});
  auto smFn = declare(b, module, loc, "moert_multiprocessors", i32, {});
  auto mapFn = declare(b, module, loc, "moert_tensor_map", i32,
                       {ptr, ptr, i32, i32, ptr, ptr, ptr});
  b.setInsertionPointToEnd(module.getBody());
  auto f = LLVM::LLVMFuncOp::create(
      b, loc, symbol, LLVM::LLVMFunctionType::get(i32, {ptr, i64, ptr, ptr}),
      LLVM::Linkage::Internal);
  Block *entry = f.addEntryBlock(b);
  h.failure = b.createBlock(&f.getBody(), {}, {i32}, {loc});
  LLVM::ReturnOp::create(b, loc, h.failure->getArgument(0));
  b.setInsertionPointToStart(entry);
  Value argv = entry->getArgument(0), tokens = entry->getArgument(1);
  Value stream = entry->getArgument(2), ws = entry->getArgument(3);
  // An expert-parallel layer's state, mapped by every peer at init.
  Value epState = LLVM::ZeroOp::create(b, loc, ptr);
  if (llvm::any_of(plan.getBufferList(), [](PlanBufferAttr buffer) {
        return buffer.getArg() == -2;
      })) {
    auto stateFn = declare(b, module, loc, "moe_ep_cuda_state", ptr, {});
    epState = LLVM::CallOp::create(b, loc, stateFn, ValueRange{}).getResult();
    Value missing = LLVM::ICmpOp::create(
        b, loc, LLVM::ICmpPredicate::eq,
        LLVM::PtrToIntOp::create(b, loc, i64, epState), h.c64(0));
    h.check(LLVM::ZExtOp::create(b, loc, i32, missing));
  }
  Value imageAddress = LLVM::AddressOfOp::create(b, loc, image);
  Value moduleAddress = LLVM::AddressOfOp::create(b, loc, moduleSlot);
  SmallVector<Value> buffers =
      bufferAddresses(h, plan, argv, tokens, ws, epState);

  // TMA descriptors, encoded on the host; the launches copy them.
  SmallVector<Value> maps;
  SmallVector<TensorMapAttr> tensorMaps = plan.getTensorMapList();
  if (!tensorMaps.empty()) {
    int64_t bytes = int64_t(tensorMaps.size()) * 128;
    Value staging = h.stackSlot(b.getI8Type(), bytes, 64);
    for (auto [i, map] : llvm::enumerate(tensorMaps)) {
      // Dimensions innermost first: columns, rows (which may grow with the
      // token count), then the outer ones.
      SmallVector<Value> dims = {h.c64(map.getCols()),
                                 h.linear(map.getRows(), tokens)};
      SmallVector<Value> strides = {
          h.c64(map.getRowStride() ? map.getRowStride() : map.getCols())};
      SmallVector<Value> box = {h.c64(map.getBoxCols()),
                                h.c64(map.getBoxRows())};
      ArrayRef<int64_t> outer = map.getOuter();
      for (size_t j = 0; j < outer.size(); j += 3) {
        dims.push_back(h.c64(outer[j]));
        strides.push_back(h.c64(outer[j + 1]));
        box.push_back(h.c64(outer[j + 2]));
      }
      auto array = [&](ArrayRef<Value> values) {
        Value slot = h.stackSlot(i64, values.size());
        for (auto [j, v] : llvm::enumerate(values))
          LLVM::StoreOp::create(b, loc, v, h.offset(slot, h.c64(8 * j)));
        return slot;
      };
      Value status =
          LLVM::CallOp::create(b, loc, mapFn,
                               ValueRange{h.offset(staging, h.c64(i * 128)),
                                          buffers[map.getBuffer()],
                                          h.c32(map.getElementBytes()),
                                          h.c32(dims.size()), array(dims),
                                          array(strides), array(box)})
              .getResult();
      h.check(status);
      maps.push_back(h.offset(staging, h.c64(i * 128)));
    }
  }

  for (auto [i, launch] : llvm::enumerate(plan.getLaunchList())) {
    Value params = h.stackSlot(ptr, launch.getArgs().size());
    for (auto [j, arg] : llvm::enumerate(launch.getArgs())) {
      // kernelParams[j] points at the parameter's value: a descriptor is
      // its own 128 bytes, other values (addresses) get a slot.
      Value slot;
      if (arg.kind == KernelArgKind::TensorMap) {
        slot = maps[arg.index];
      } else {
        Value value =
            arg.kind == KernelArgKind::Buffer ? buffers[arg.index] : Value(ws);
        slot = h.stackSlot(value.getType(), 1);
        LLVM::StoreOp::create(b, loc, value, slot);
      }
      Value entryAddress = LLVM::GEPOp::create(
          b, loc, ptr, ptr, params, ArrayRef<LLVM::GEPArg>{int32_t(j)});
      LLVM::StoreOp::create(b, loc, slot, entryAddress);
    }
    // ceil(work / per_block) + extra_blocks blocks along x.
    Value work = h.linear(launch.getWork(), tokens);
    Value blocks = LLVM::UDivOp::create(
        b, loc,
        LLVM::AddOp::create(b, loc, work, h.c64(launch.getPerBlock() - 1)),
        h.c64(launch.getPerBlock()));
    blocks =
        LLVM::AddOp::create(b, loc, blocks, h.c64(launch.getExtraBlocks()));
    Value gridX = LLVM::TruncOp::create(b, loc, i32, blocks);
    if (launch.getPersistent()) {
      Value sms = LLVM::CallOp::create(b, loc, smFn, ValueRange{}).getResult();
      gridX = LLVM::UMinOp::create(b, loc, gridX, sms);
    }
    // One name string per kernel, shared by the plans that launch it.
    StringRef kernelName = launch.getKernel().getValue();
    std::string global = ("moe_kernel_name_" + kernelName).str();
    Value kernel;
    if (auto known = module.lookupSymbol<LLVM::GlobalOp>(global))
      kernel = LLVM::AddressOfOp::create(b, loc, known);
    else
      kernel = LLVM::createGlobalString(loc, b, global,
                                        (kernelName + Twine('\0')).str(),
                                        LLVM::Linkage::Internal);
    h.check(LLVM::CallOp::create(
                b, loc, launchFn,
                ValueRange{moduleAddress, imageAddress, kernel, gridX,
                           h.c32(launch.getGridY()), h.c32(launch.getBlock()),
                           h.c32(launch.getSharedBytes()), stream, params})
                .getResult());
  }
  LLVM::ReturnOp::create(b, loc, h.c32(0));
  return f;
}

LogicalResult host::addLaunchEntryPoints(ModuleOp module, StringRef name,
                                         ArrayRef<ArgInfo> args,
                                         ConfigAttr config, LaunchPlanAttr plan,
                                         ArrayRef<LaunchPlanAttr> buckets,
                                         StringRef cubin, int64_t epMaxTokens) {
  Location loc = module.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, loc);
  Type ptr = h.ptr, i64 = h.i64, i32 = h.i32;
  auto checkFn = declare(b, module, loc, "moert_check_call", i32,
                         {ptr, ptr, i64, i64, ptr, i64});
  auto setTokensFn =
      declare(b, module, loc, "moert_set_tokens", i32, {ptr, i64, i64, ptr});
  auto graphFn = declare(b, module, loc, "moert_graph_launch", i32,
                         {ptr, ptr, ptr, i32, i64, i64, ptr, ptr, i32});
  auto prepareFn = declare(b, module, loc, "moert_graph_prepare", i32,
                           {ptr, ptr, ptr, i32, i64, ptr, ptr});
  b.setInsertionPointToEnd(module.getBody());
  // The loaded module, cached by the runtime on first use.
  auto moduleSlot = LLVM::GlobalOp::create(
      b, loc, i64, /*isConstant=*/false, LLVM::Linkage::Internal,
      "moe_cuda_module", b.getI64IntegerAttr(0));
  // Whether a bucket's call replays its graph (moe_<name>_set_graphs).
  auto graphsOn = LLVM::GlobalOp::create(
      b, loc, i32, /*isConstant=*/false, LLVM::Linkage::Internal,
      "moe_graphs_enabled", b.getI32IntegerAttr(1));
  // Each bucket's graphs, owned by the runtime.
  SmallVector<LLVM::GlobalOp> graphSlots;
  for (auto [i, bucket] : llvm::enumerate(buckets))
    graphSlots.push_back(LLVM::GlobalOp::create(
        b, loc, i64, /*isConstant=*/false, LLVM::Linkage::Internal,
        ("moe_graphs_" + Twine(i)).str(), b.getI64IntegerAttr(0)));
  // The image, 64-byte aligned as cuModuleLoadData wants.
  auto cubinGlobal = LLVM::GlobalOp::create(
      b, loc, LLVM::LLVMArrayType::get(b.getI8Type(), cubin.size()),
      /*isConstant=*/true, LLVM::Linkage::Internal, "moe_cubin",
      b.getStringAttr(cubin), /*alignment=*/64);
  // The enqueue function of each plan: the buckets', then the one for any
  // count.
  SmallVector<LLVM::LLVMFuncOp> enqueues;
  for (auto [i, bucket] : llvm::enumerate(buckets))
    enqueues.push_back(
        addEnqueue(module, ("moe_" + name + "_enqueue_" + Twine(i)).str(),
                   bucket, cubinGlobal, moduleSlot));
  enqueues.push_back(addEnqueue(module, ("moe_" + name + "_enqueue").str(),
                                plan, cubinGlobal, moduleSlot));
  b.setInsertionPointToEnd(module.getBody());

  // The bytes a call's workspace needs: its bucket's at the bucket's size
  // (its graph is captured there), else the plan's for any count.
  auto workspaceAt = [&](Value tokens) {
    Value bytes = h.linear(plan.getWorkspaceBytes(), tokens);
    for (LaunchPlanAttr bucket : llvm::reverse(buckets)) {
      Value inside = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::sle,
                                          tokens, h.c64(bucket.getMaxTokens()));
      bytes = LLVM::SelectOp::create(
          b, loc, inside,
          h.c64(bucket.getWorkspaceBytes().fixed +
                bucket.getWorkspaceBytes().perToken * bucket.getMaxTokens()),
          bytes);
    }
    return bytes;
  };

  // int64_t moe_<name>_workspace_size(int64_t tokens)
  TokenLinear workspace = plan.getWorkspaceBytes();
  {
    auto f = LLVM::LLVMFuncOp::create(b, loc,
                                      ("moe_" + name + "_workspace_size").str(),
                                      LLVM::LLVMFunctionType::get(i64, {i64}));
    Block *entry = f.addEntryBlock(b);
    b.setInsertionPointToStart(entry);
    LLVM::ReturnOp::create(b, loc, workspaceAt(entry->getArgument(0)));
    b.setInsertionPointToEnd(module.getBody());
  }

  std::string kinds;
  for (const ArgInfo &arg : args)
    kinds.push_back(llvm::is_contained(arg.shape, 0)         ? 'e'
                    : !arg.shape.empty() && arg.shape[0] < 0 ? 't'
                                                             : 'w');
  kinds.push_back('\0');
  bool expertParallel =
      llvm::any_of(plan.getBufferList(),
                   [](PlanBufferAttr buffer) { return buffer.getArg() == -2; });
  int64_t most = maxTokens(plan);
  if (expertParallel)
    most = std::min(most, epMaxTokens);
  for (LaunchPlanAttr bucket : buckets)
    most = std::max(most, std::min(maxTokens(bucket), bucket.getMaxTokens()));

  auto forward = LLVM::LLVMFuncOp::create(
      b, loc, ("moe_" + name + "_forward").str(),
      LLVM::LLVMFunctionType::get(i32, {ptr, i64, ptr, ptr}));
  Block *entry = forward.addEntryBlock(b);
  h.failure = b.createBlock(&forward.getBody(), {}, {i32}, {loc});
  LLVM::ReturnOp::create(b, loc, h.failure->getArgument(0));
  b.setInsertionPointToStart(entry);
  Value argv = entry->getArgument(0), tokens = entry->getArgument(1);
  Value stream = entry->getArgument(2), ws = entry->getArgument(3);
  // A call the kernels cannot take safely fails here, not on the GPU.
  Value kindsText = LLVM::createGlobalString(loc, b, "moe_arg_kinds", kinds,
                                             LLVM::Linkage::Internal);
  h.check(LLVM::CallOp::create(b, loc, checkFn,
                               ValueRange{argv, kindsText, tokens, h.c64(most),
                                          ws, workspaceAt(tokens)})
              .getResult());
  // The kernels read the count from the workspace header, whose counters
  // start at it too (the most any plan has).
  int64_t words = 1 + plan.getCounters();
  for (LaunchPlanAttr bucket : buckets)
    words = std::max(words, 1 + bucket.getCounters());
  h.check(LLVM::CallOp::create(b, loc, setTokensFn,
                               ValueRange{ws, tokens, h.c64(words), stream})
              .getResult());
  // The smallest bucket that holds the call replays its graph; a call
  // above every bucket launches the plan for any count.
  Value enabled = LLVM::LoadOp::create(
      b, loc, i32, LLVM::AddressOfOp::create(b, loc, graphsOn));
  for (auto [i, bucket] : llvm::enumerate(buckets)) {
    Value inside = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::sle,
                                        tokens, h.c64(bucket.getMaxTokens()));
    Block *current = b.getInsertionBlock();
    Block *replay = b.createBlock(current->getParent());
    Block *next = b.createBlock(current->getParent());
    b.setInsertionPointToEnd(current);
    LLVM::CondBrOp::create(b, loc, inside, replay, ValueRange{}, next,
                           ValueRange{});
    b.setInsertionPointToStart(replay);
    Value status =
        LLVM::CallOp::create(
            b, loc, graphFn,
            ValueRange{LLVM::AddressOfOp::create(b, loc, graphSlots[i]),
                       LLVM::AddressOfOp::create(b, loc, enqueues[i]), argv,
                       h.c32(args.size()), tokens, h.c64(bucket.getMaxTokens()),
                       stream, ws, enabled})
            .getResult();
    LLVM::ReturnOp::create(b, loc, status);
    b.setInsertionPointToStart(next);
  }
  LLVM::ReturnOp::create(
      b, loc,
      LLVM::CallOp::create(b, loc, enqueues.back(),
                           ValueRange{argv, tokens, stream, ws})
          .getResult());

  if (!buckets.empty()) {
    b.setInsertionPointToEnd(module.getBody());
    // void moe_<name>_set_graphs(int32_t on)
    auto setGraphs = LLVM::LLVMFuncOp::create(
        b, loc, ("moe_" + name + "_set_graphs").str(),
        LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(b.getContext()),
                                    {i32}));
    b.setInsertionPointToStart(setGraphs.addEntryBlock(b));
    LLVM::StoreOp::create(b, loc, setGraphs.getArgument(0),
                          LLVM::AddressOfOp::create(b, loc, graphsOn));
    LLVM::ReturnOp::create(b, loc, ValueRange{});
    // int32_t moe_<name>_warmup(void *const *args, void *stream, void *ws):
    // captures every bucket's graph for these arguments, launching nothing.
    b.setInsertionPointToEnd(module.getBody());
    auto warmup = LLVM::LLVMFuncOp::create(
        b, loc, ("moe_" + name + "_warmup").str(),
        LLVM::LLVMFunctionType::get(i32, {ptr, ptr, ptr}));
    Block *body = warmup.addEntryBlock(b);
    h.failure = b.createBlock(&warmup.getBody(), {}, {i32}, {loc});
    LLVM::ReturnOp::create(b, loc, h.failure->getArgument(0));
    b.setInsertionPointToStart(body);
    for (auto [i, bucket] : llvm::enumerate(buckets))
      h.check(LLVM::CallOp::create(
                  b, loc, prepareFn,
                  ValueRange{LLVM::AddressOfOp::create(b, loc, graphSlots[i]),
                             LLVM::AddressOfOp::create(b, loc, enqueues[i]),
                             body->getArgument(0), h.c32(args.size()),
                             h.c64(bucket.getMaxTokens()), body->getArgument(1),
                             body->getArgument(2)})
                  .getResult());
    LLVM::ReturnOp::create(b, loc, h.c32(0));
  }

  // What the last failing runtime call said (the runtime's own symbols stay
  // inside the library).
  b.setInsertionPointToEnd(module.getBody());
  auto lastErrorFn = declare(b, module, loc, "moert_last_error", ptr, {});
  auto lastError = LLVM::LLVMFuncOp::create(
      b, loc, "moe_last_error", LLVM::LLVMFunctionType::get(ptr, {}));
  b.setInsertionPointToStart(lastError.addEntryBlock(b));
  LLVM::ReturnOp::create(
      b, loc,
      LLVM::CallOp::create(b, loc, lastErrorFn, ValueRange{}).getResult());

  int64_t stateBytes = 0;
  if (expertParallel) {
    ::moe::rt::EpDeviceLayout layout{::moe::rt::EpLayout{
        config.getHidden(), config.getTopK(), config.getExperts(),
        config.getEpSize(), epMaxTokens}};
    stateBytes = int64_t(layout.bytes());
    Type none = LLVM::LLVMVoidType::get(b.getContext());
    auto initFn = declare(b, module, loc, "moe_ep_cuda_init", i32,
                          {i64, i64, i64, i64, i64, i64, ptr, ptr});
    LLVM::LLVMFuncOp turn = addProxyTurn(module, name, layout);
    auto finalizeFn = declare(b, module, loc, "moe_ep_cuda_finalize", none, {});
    auto statusFn = declare(b, module, loc, "moe_ep_cuda_status", i32, {});
    b.setInsertionPointToEnd(module.getBody());
    auto init =
        LLVM::LLVMFuncOp::create(b, loc, ("moe_" + name + "_ep_init").str(),
                                 LLVM::LLVMFunctionType::get(i32, {ptr}));
    b.setInsertionPointToStart(init.addEntryBlock(b));
    LLVM::ReturnOp::create(
        b, loc,
        LLVM::CallOp::create(
            b, loc, initFn,
            ValueRange{h.c64(stateBytes), h.c64(epMaxTokens),
                       h.c64(config.getHidden()), h.c64(config.getTopK()),
                       h.c64(config.getExperts()), h.c64(config.getEpSize()),
                       init.getArgument(0),
                       LLVM::AddressOfOp::create(b, loc, turn)})
            .getResult());
    b.setInsertionPointToEnd(module.getBody());
    auto finalize =
        LLVM::LLVMFuncOp::create(b, loc, ("moe_" + name + "_ep_finalize").str(),
                                 LLVM::LLVMFunctionType::get(none, {}));
    b.setInsertionPointToStart(finalize.addEntryBlock(b));
    LLVM::CallOp::create(b, loc, finalizeFn, ValueRange{});
    LLVM::ReturnOp::create(b, loc, ValueRange{});
    b.setInsertionPointToEnd(module.getBody());
    auto status =
        LLVM::LLVMFuncOp::create(b, loc, ("moe_" + name + "_ep_status").str(),
                                 LLVM::LLVMFunctionType::get(i32, {}));
    b.setInsertionPointToStart(status.addEntryBlock(b));
    LLVM::ReturnOp::create(
        b, loc,
        LLVM::CallOp::create(b, loc, statusFn, ValueRange{}).getResult());
  }

  SmallVector<int64_t> sizes = llvm::map_to_vector(
      buckets, [](LaunchPlanAttr bucket) { return bucket.getMaxTokens(); });
  addLayerInfo(module,
               infoJson(name, args, config, "sm_90a", &workspace,
                        expertParallel ? epMaxTokens : 0, stateBytes, sizes));
  return success();
}
