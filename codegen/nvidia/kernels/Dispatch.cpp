//===- Dispatch.cpp - the dispatch kernels --------------------------------===//
//
// moe.dispatch in two kernels. The plan kernel, one block, counts each
// expert's choices, lays the experts out (the same code as the CPU
// backend), and gives each choice the next row of its expert (in choice
// order where `ordered`), all on the device: the host never waits for the
// counts. The
// scatter kernel copies each token's row to its chosen rows with 16-byte
// vectors, scaled on the way for Llama-4's routers, and with `quant`
// quantizes it on the way (the token's own codes too, when asked).
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/support/Hopper.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

DispatchConfig nvidia::configureDispatch(DispatchOp op, TokenLinear tokens) {
  DispatchConfig c;
  auto countsType = cast<RankedTensorType>(op.getTokensPerExpert().getType());
  c.experts = countsType.getDimSize(0);
  c.topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  c.hidden =
      cast<RankedTensorType>(op.getHiddenStates().getType()).getDimSize(1);
  c.align = op.getAlign();
  c.tokens = tokens;
  c.dispatchedRows = {tokens.fixed * c.topK + c.experts * (c.align - 1),
                      tokens.perToken * c.topK};
  c.width = vectorWidth(c.hidden);
  if (QuantAttr quant = op.getQuantAttr()) {
    c.quantBlock = quant.getBlockSize();
    c.lanes = c.quantBlock / c.width;
  }
  return c;
}

/// Once every thread has counted its choices into `count`, thread 0 lays
/// the experts' rows out (common::layOutExperts: each expert's first row
/// into `offsets`, its count into `counts`) and writes each expert's first
/// row into `first` (which may be `count`); the block waits for it.
static void layOutFromCounts(Emitter &e, Value tid, int64_t experts,
                             int64_t align, Value count, Value offsets,
                             Value counts, Value first) {
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    common::layOutExperts(
        e, experts, align, offsets,
        [&](Value x) { return e.loadRaw(count, {x}); },
        [&](Value x, Value offset, Value c) {
          e.storeRaw(c, counts, {x});
          e.storeRaw(offset, first, {x});
        });
  });
  gpu::BarrierOp::create(e.b, e.loc);
}

OrderedChoices::OrderedChoices(Kernel &k, Value ids, Value choices,
                               int64_t experts, int64_t topK, int64_t warps,
                               Value table)
    : k(k), e(k.e), ids(ids), experts(experts), topK(topK), warps(warps),
      table(table) {
  Value tid = k.threadId();
  warp = e.divUI(tid, 32), lane = e.remUI(tid, 32);
  // Warp w's run: [w * run, (w + 1) * run), whole batches of kBatch steps
  // of 32, whose ids are loaded together.
  run = e.imul(e.divUI(e.iadd(choices, e.index(warps * kBatchChoices - 1)),
                       e.index(warps * kBatchChoices)),
               e.index(kBatchChoices));
  runStart = e.imul(warp, run);
  runEnd = e.minUI(e.iadd(runStart, run), choices);
}

Value OrderedChoices::expertAt(Value p) {
  Value inRun = e.ult(p, runEnd);
  Value id = e.loadRaw(ids, at(e.select(inRun, p, e.index(0))));
  Value local = e.andi(
      inRun, e.andi(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                    e.icmp(arith::CmpIPredicate::slt, id, e.i32(experts))));
  return e.select(local, id, e.i32(-1));
}

SmallVector<Value> OrderedChoices::at(Value p) {
  return {e.divUI(p, topK), e.remUI(p, topK)};
}

void OrderedChoices::steps(function_ref<void(Value, Value)> body) {
  OpBuilder &b = e.b;
  // Every lane of a warp runs every step of its run (match.any needs the
  // whole warp), in order; a batch's loads are in flight together.
  auto loop = scf::ForOp::create(b, e.loc, runStart, e.iadd(runStart, run),
                                 e.index(kBatchChoices));
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  SmallVector<Value> ps, idsAt;
  for (int64_t j = 0; j < kBatch; ++j) {
    ps.push_back(e.iadd(loop.getInductionVar(), e.iadd(lane, e.index(j * 32))));
    idsAt.push_back(expertAt(ps.back()));
  }
  for (int64_t j = 0; j < kBatch; ++j)
    body(ps[j], idsAt[j]);
}

void OrderedChoices::count(Value count) {
  OpBuilder &b = e.b;
  Value tid = k.threadId();
  int64_t threads = warps * 32;
  if (count)
    e.forEach(
        tid, e.index(experts),
        [&](Value x) { e.storeRaw(e.i32(0), count, {x}); }, e.index(threads));
  e.forEach(
      tid, e.index(warps * experts),
      [&](Value i) {
        e.storeRaw(e.i32(0), table, {e.divUI(i, experts), e.remUI(i, experts)});
      },
      e.index(threads));
  gpu::BarrierOp::create(b, e.loc);
  // Counts are the same in any order: each lane adds its own.
  steps([&](Value, Value id) {
    e.ifThen(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)), [&] {
      Value x = e.toIndex(id);
      for (auto [buffer, index] :
           {std::pair{count, SmallVector<Value>{x}},
            std::pair{table, SmallVector<Value>{warp, x}}})
        if (buffer)
          memref::AtomicRMWOp::create(b, e.loc, arith::AtomicRMWKind::addi,
                                      e.i32(1), buffer, index);
    });
  });
}

void OrderedChoices::startWarps(function_ref<Value(Value)> first) {
  OpBuilder &b = e.b;
  e.forEach(
      k.threadId(), e.index(experts),
      [&](Value x) {
        e.reduce(e.index(0), e.index(warps), {first(x)},
                 [&](Value w, ValueRange next) -> SmallVector<Value> {
                   Value n = e.loadRaw(table, {w, x});
                   e.storeRaw(next[0], table, {w, x});
                   return {arith::AddIOp::create(b, e.loc, next[0], n)};
                 });
      },
      e.index(warps * 32));
  gpu::BarrierOp::create(b, e.loc);
}

void OrderedChoices::place(function_ref<void(Value, Value)> store) {
  OpBuilder &b = e.b;
  Type i32 = b.getI32Type();
  // The lanes of the warp's step that share `key`, and this lane's rank
  // among them.
  Value below = inlinePtx(b, e.loc, i32, {}, "mov.u32 $0, %lanemask_lt;", "=r");
  auto peers = [&](Value key) -> std::pair<Value, Value> {
    Value mask = inlinePtx(b, e.loc, i32, key,
                           "match.any.sync.b32 $0, $1, 0xffffffff;", "=r,r");
    auto popc = [&](Value v) {
      return inlinePtx(b, e.loc, i32, v, "popc.b32 $0, $1;", "=r,r");
    };
    return {popc(mask), popc(arith::AndIOp::create(b, e.loc, mask, below))};
  };
  steps([&](Value p, Value id) {
    auto [same, rank] = peers(id);
    Value local = e.icmp(arith::CmpIPredicate::sge, id, e.i32(0));
    Value x = e.toIndex(e.select(local, id, e.i32(0)));
    Value next = e.loadRaw(table, {warp, x});
    // Every lane of the step has read its expert's next number before the
    // first lane moves it on.
    NVVM::SyncWarpOp::create(b, e.loc, e.i32(-1));
    e.ifThen(e.andi(local, e.eq(rank, e.i32(0))), [&] {
      e.storeRaw(arith::AddIOp::create(b, e.loc, next, same), table, {warp, x});
    });
    e.ifThen(e.ult(p, runEnd), [&] {
      store(p, e.select(local, arith::AddIOp::create(b, e.loc, next, rank),
                        e.i32(-1)));
    });
    // The first lane's move is seen by the next step's reads.
    NVVM::SyncWarpOp::create(b, e.loc, e.i32(-1));
  });
}

/// The ordered plan (`ordered`: a training forward's), in one block
/// (OrderedChoices): each expert's rows are shared out among the warps in
/// warp order, and each warp gives its choices of an expert the next rows
/// in choice order. The rows within an expert are in token order, the
/// same on every call, so a weight gradient summed over them is too.
static LogicalResult buildOrderedDispatchPlan(LayerKernels &layer,
                                              DispatchOp op,
                                              const DispatchConfig &cfg) {
  int64_t experts = cfg.experts, topK = cfg.topK;
  int64_t warps = cfg.planThreads / 32;
  Type i32 = IntegerType::get(op.getContext(), 32);
  // Each warp's count (then next row) of each expert: in shared memory
  // where it fits beside the experts' counts, else in the workspace.
  bool sharedTable = warps * experts * 4 <= DispatchConfig::kPlanTableBytes;
  TensorInfo table{0, MemRefType::get({warps, experts}, i32), TokenLinear{}};
  SmallVector<unsigned> buffers;
  for (Value v : {op.getExpertIds(), op.getTokensPerExpert(),
                  op.getExpertOffsets(), op.getRows()})
    buffers.push_back(layer.info(v).buffer);
  if (!sharedTable) {
    table.buffer = layer.plan.addWorkspace(TokenLinear{warps * experts * 4, 0});
    buffers.push_back(table.buffer);
  }
  Kernel k = layer.kernelOn(op, "dispatch_plan", buffers);
  k.launch.work = {1, 0};
  k.launch.block = cfg.planThreads;
  Emitter &e = k.e;
  Value ids = k.view(0, layer.info(op.getExpertIds()));
  Value counts = k.view(1, layer.info(op.getTokensPerExpert()));
  Value offsets = k.view(2, layer.info(op.getExpertOffsets()));
  Value rows = k.view(3, layer.info(op.getRows()));
  Value warpRows =
      sharedTable ? k.workgroupBuffer({warps, experts}, i32) : k.view(4, table);
  Value count = k.workgroupBuffer({experts}, i32);
  OrderedChoices ordered(k, ids, e.imul(k.linear(cfg.tokens), topK), experts,
                         topK, warps, warpRows);
  ordered.count(count);
  layOutFromCounts(e, k.threadId(), experts, cfg.align, count, offsets, counts,
                   count);
  // Each expert's first row for each warp, in warp order.
  ordered.startWarps([&](Value x) { return e.loadRaw(count, {x}); });
  ordered.place(
      [&](Value p, Value row) { e.storeRaw(row, rows, ordered.at(p)); });
  return k.finish(op);
}

/// The plan, in one block: counts by shared-memory atomics, offsets by one
/// thread, then each choice takes the next row of its expert. Rows within
/// an expert are in no particular order; each row's result depends only
/// on its token, so the layer's output does not change.
static LogicalResult buildDispatchPlan(LayerKernels &layer, DispatchOp op,
                                       const DispatchConfig &cfg) {
  if (op.getOrdered())
    return buildOrderedDispatchPlan(layer, op, cfg);
  int64_t experts = cfg.experts, topK = cfg.topK;
  Kernel k = layer.kernel(op, "dispatch_plan",
                          {op.getExpertIds(), op.getTokensPerExpert(),
                           op.getExpertOffsets(), op.getRows()});
  k.launch.work = {1, 0};
  k.launch.block = cfg.planThreads;
  Emitter &e = k.e;
  Value ids = k.view(0, layer.info(op.getExpertIds()));
  Value counts = k.view(1, layer.info(op.getTokensPerExpert()));
  Value offsets = k.view(2, layer.info(op.getExpertOffsets()));
  Value rows = k.view(3, layer.info(op.getRows()));
  Type i32 = e.b.getI32Type();
  Value count = k.workgroupBuffer({experts}, i32);
  Value cursor = k.workgroupBuffer({experts}, i32);
  Value tid = k.threadId();
  Value choices = e.imul(k.linear(cfg.tokens), topK);
  auto isLocal = [&](Value id) {
    return e.andi(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                  e.icmp(arith::CmpIPredicate::slt, id, e.i32(experts)));
  };
  auto at = [&](Value p) -> SmallVector<Value> {
    return {e.divUI(p, topK), e.remUI(p, topK)};
  };
  auto increment = [&](Value buffer, Value id) {
    return memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi,
                                       e.i32(1), buffer,
                                       ValueRange{e.toIndex(id)})
        .getResult();
  };
  e.forEach(
      tid, e.index(experts), [&](Value x) { e.storeRaw(e.i32(0), count, {x}); },
      e.index(cfg.planThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  e.forEach(
      tid, choices,
      [&](Value p) {
        Value id = e.loadRaw(ids, at(p));
        e.ifThen(isLocal(id), [&] { increment(count, id); });
      },
      e.index(cfg.planThreads));
  layOutFromCounts(e, tid, experts, cfg.align, count, offsets, counts, cursor);
  e.forEach(
      tid, choices,
      [&](Value p) {
        Value id = e.loadRaw(ids, at(p));
        Value local = isLocal(id);
        auto row = scf::IfOp::create(e.b, e.loc, TypeRange{i32}, local,
                                     /*withElse=*/true);
        OpBuilder::InsertionGuard guard(e.b);
        e.b.setInsertionPointToStart(&row.getThenRegion().front());
        scf::YieldOp::create(e.b, e.loc, increment(cursor, id));
        e.b.setInsertionPointToStart(&row.getElseRegion().front());
        scf::YieldOp::create(e.b, e.loc, e.i32(-1));
        e.b.setInsertionPointAfter(row);
        e.storeRaw(row.getResult(0), rows, at(p));
      },
      e.index(cfg.planThreads));
  return k.finish(op);
}

namespace {
/// The scatter kernel's body: a block per token copies its row to each
/// chosen slot, bf16 or quantized on the way.
class ScatterEmitter {
public:
  ScatterEmitter(LayerKernels &layer, DispatchOp op, const DispatchConfig &cfg,
                 Kernel &k, ArrayRef<Value> buffers);
  void emitCopies();
  void emitQuantizedCopies();

private:
  Value scaled(Value v, Value j);

  DispatchOp op;
  const DispatchConfig &cfg;
  Emitter &e;
  Value hidden, rows, dispatched, scale, scales, tokenCodes, tokenScales;
  Value t, tid;
  Type bf16, f32;
  VectorType vecType, f32Vec;
};
} // namespace

ScatterEmitter::ScatterEmitter(LayerKernels &layer, DispatchOp op,
                               const DispatchConfig &cfg, Kernel &k,
                               ArrayRef<Value> buffers)
    : op(op), cfg(cfg), e(k.e) {
  hidden = k.view(0, layer.info(op.getHiddenStates()));
  rows = k.view(1, layer.info(op.getRows()));
  dispatched = k.view(2, layer.info(op.getDispatched()));
  scale = op.getScale() ? k.view(3, layer.info(op.getScale())) : Value();
  auto view = [&](Value tensor) {
    return k.view(llvm::find(buffers, tensor) - buffers.begin(),
                  layer.info(tensor));
  };
  scales = cfg.quantBlock ? view(op.getDispatchedScales()) : Value();
  tokenCodes = op.getTokens() ? view(op.getTokens()) : Value();
  tokenScales = op.getTokens() ? view(op.getTokenScales()) : Value();
  t = k.blockId(gpu::Dimension::x), tid = k.threadId();
  k.onlyIf(e.ult(t, k.linear(cfg.tokens)));
  bf16 = e.b.getBF16Type(), f32 = e.b.getF32Type();
  vecType = VectorType::get({cfg.width}, bf16);
  f32Vec = VectorType::get({cfg.width}, f32);
}

/// Row t of `hidden` times `scale`[t, j] (when given), rounded to bf16.
static Value scaledRow(Emitter &e, Value v, Value scale, Value t, Value j) {
  if (!scale)
    return v;
  auto vecType = cast<VectorType>(v.getType());
  auto f32Vec = VectorType::get(vecType.getShape(), e.b.getF32Type());
  Value splat =
      vector::BroadcastOp::create(e.b, e.loc, f32Vec, e.loadRaw(scale, {t, j}));
  return arith::TruncFOp::create(
             e.b, e.loc, vecType,
             e.mul(arith::ExtFOp::create(e.b, e.loc, f32Vec, v), splat))
      .getResult();
}

/// Block t copies token t of `hidden` to each of its rows in `out` (those
/// >= 0), `threads` threads of `width`-element vectors.
static void copyToRows(Emitter &e, Value hidden, Value rows, Value out,
                       Value scale, Value t, Value tid, int64_t topK, int64_t h,
                       int64_t width, int64_t threads) {
  Type bf16 = e.b.getBF16Type();
  auto vecType = VectorType::get({width}, bf16);
  e.forEach(e.index(0), e.index(topK), [&](Value j) {
    Value row = e.loadRaw(rows, {t, j});
    e.ifThen(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)), [&] {
      Value r = e.toIndex(row);
      e.forEach(
          e.imul(tid, width), e.index(h),
          [&](Value c) {
            Value v =
                vector::LoadOp::create(e.b, e.loc, vecType, hidden, {t, c},
                                       false, vectorAlign(width, bf16));
            vector::StoreOp::create(e.b, e.loc, scaledRow(e, v, scale, t, j),
                                    out, {r, c}, false,
                                    vectorAlign(width, bf16));
          },
          e.index(threads * width));
    });
  });
}

Value ScatterEmitter::scaled(Value v, Value j) {
  return scaledRow(e, v, scale, t, j);
}

void ScatterEmitter::emitCopies() {
  copyToRows(e, hidden, rows, dispatched, scale, t, tid, cfg.topK, cfg.hidden,
             cfg.width, cfg.scatterThreads);
}

void ScatterEmitter::emitQuantizedCopies() {
  // A block of `bs` columns is bs / width consecutive threads' vectors,
  // which combine their statistics by shuffles. Every thread runs every
  // chunk (past H with zeros), so the shuffles see whole warps; a row
  // shared by all choices (no scale) is quantized once.
  QuantAttr quant = op.getQuantAttr();
  int64_t bs = cfg.quantBlock, lanes = cfg.lanes, width = cfg.width;
  int64_t h = cfg.hidden, step = cfg.scatterThreads * width;
  Type i8 = e.b.getI8Type();
  e.forEach(
      e.index(0), e.index(llvm::divideCeil(h, step) * step),
      [&](Value chunk) {
        Value c = e.iadd(chunk, e.imul(tid, width));
        Value valid = e.ult(c, e.index(h));
        Value safe = e.minUI(c, e.index(h - width));
        Value loaded =
            vector::LoadOp::create(e.b, e.loc, vecType, hidden, {t, safe},
                                   false, vectorAlign(width, bf16));
        Value zeros = arith::ConstantOp::create(
            e.b, e.loc, DenseElementsAttr::get(vecType, e.b.getZeroAttr(bf16)));
        Value v = e.select(valid, loaded, zeros);
        // The codes and scale of the (scaled) row's block.
        auto quantize = [&](Value row) {
          return quantizeVector(e, quant, row, lanes);
        };
        auto store = [&](Value data, Value blockScales, Value r, Value codes,
                         Value stored) {
          e.ifThen(valid, [&] {
            vector::StoreOp::create(e.b, e.loc, codes, data, {r, c}, false,
                                    vectorAlign(width, i8));
            e.ifThen(e.eq(e.remUI(tid, lanes), e.index(0)), [&] {
              e.storeRaw(stored, blockScales, {r, e.divUI(c, bs)});
            });
          });
        };
        std::pair<Value, Value> shared;
        if (!scale)
          shared = quantize(v);
        // The token's own quantized row, for the shared experts.
        if (tokenCodes)
          store(tokenCodes, tokenScales, t, shared.first, shared.second);
        e.forEach(e.index(0), e.index(cfg.topK), [&](Value j) {
          Value row = e.loadRaw(rows, {t, j});
          // Uniform across the block: every thread reads the same row.
          e.ifThen(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)), [&] {
            auto [codes, stored] = scale ? quantize(scaled(v, j)) : shared;
            store(dispatched, scales, e.toIndex(row), codes, stored);
          });
        });
      },
      e.index(step));
}

/// The scatter: a block per token copies its row to each chosen slot.
static LogicalResult buildDispatchScatter(LayerKernels &layer, DispatchOp op,
                                          const DispatchConfig &cfg) {
  SmallVector<Value> buffers = {op.getHiddenStates(), op.getRows(),
                                op.getDispatched()};
  if (op.getScale())
    buffers.push_back(op.getScale());
  if (cfg.quantBlock)
    buffers.push_back(op.getDispatchedScales());
  if (op.getTokens())
    buffers.append({op.getTokens(), op.getTokenScales()});
  Kernel k = layer.kernel(op, "dispatch_scatter", buffers);
  k.launch.work = cfg.tokens;
  k.launch.block = cfg.scatterThreads;
  ScatterEmitter scatter(layer, op, cfg, k, buffers);
  if (!cfg.quantBlock) {
    scatter.emitCopies();
    return k.finish(op);
  }
  if (cfg.width != 8)
    return op->emitOpError()
           << "quantizes rows of hidden size " << cfg.hidden
           << " on sm_90a, which reads them in 8-element vectors: the hidden "
              "size must be a multiple of 8";
  scatter.emitQuantizedCopies();
  return k.finish(op);
}

LogicalResult nvidia::buildDispatch(LayerKernels &layer, DispatchOp op) {
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  DispatchConfig cfg = configureDispatch(op, tokens);
  // A fused step's threads share a block with a matmul's registers.
  if (layer.fused)
    cfg.planThreads = LayerKernels::kFusedStepThreads;
  layer.define(op.getTokensPerExpert(), {});
  layer.define(op.getExpertOffsets(), {});
  layer.define(op.getRows(), tokens);
  layer.define(op.getDispatched(), cfg.dispatchedRows);
  if (cfg.quantBlock)
    layer.define(op.getDispatchedScales(), cfg.dispatchedRows);
  if (op.getTokens()) {
    layer.define(op.getTokens(), tokens);
    layer.define(op.getTokenScales(), tokens);
  }
  if (failed(buildDispatchPlan(layer, op, cfg)))
    return failure();
  return buildDispatchScatter(layer, op, cfg);
}

LogicalResult nvidia::buildScatter(LayerKernels &layer, ScatterOp op) {
  // Rows between experts would need zeros that no choice writes.
  if (op.getAlign() != 1)
    return op.emitOpError()
           << "aligns expert rows to " << op.getAlign()
           << ", which sm_90a's scatter does not take: it writes only the "
              "rows the choices name, so an aligned layout's padding would "
              "be left unwritten";
  TokenLinear tokens = layer.info(op.getSource()).rows;
  auto rowsType = cast<RankedTensorType>(op.getRows().getType());
  int64_t topK = rowsType.getDimSize(1);
  int64_t h = cast<RankedTensorType>(op.getSource().getType()).getDimSize(1);
  layer.define(op.getOut(), tokens * topK);
  if (op.getRowWeights())
    layer.define(op.getRowWeights(), tokens * topK);
  SmallVector<Value> buffers = {op.getSource(), op.getRows(), op.getOut()};
  for (Value v : {op.getScale(), op.getWeights(), op.getRowWeights()})
    if (v)
      buffers.push_back(v);
  DispatchConfig cfg;
  Kernel k = layer.kernel(op, "scatter", buffers);
  k.launch.work = tokens;
  k.launch.block = cfg.scatterThreads;
  Emitter &e = k.e;
  Value source = k.view(0, layer.info(op.getSource()));
  Value rows = k.view(1, layer.info(op.getRows()));
  Value out = k.view(2, layer.info(op.getOut()));
  auto view = [&](Value v) {
    return v ? k.view(llvm::find(buffers, v) - buffers.begin(), layer.info(v))
             : Value();
  };
  Value scale = view(op.getScale());
  Value t = k.blockId(gpu::Dimension::x);
  k.onlyIf(e.ult(t, k.linear(tokens)));
  copyToRows(e, source, rows, out, scale, t, k.threadId(), topK, h,
             vectorWidth(h), cfg.scatterThreads);
  // Each choice's weight at its row, a thread a choice.
  if (Value rowWeights = view(op.getRowWeights())) {
    Value weights = view(op.getWeights());
    Value j = k.threadId();
    e.ifThen(e.ult(j, e.index(topK)), [&] {
      Value r = e.loadRaw(rows, {t, j});
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, r, e.i32(0)), [&] {
        e.storeRaw(e.loadRaw(weights, {t, j}), rowWeights, {e.toIndex(r)});
      });
    });
  }
  return k.finish(op);
}
