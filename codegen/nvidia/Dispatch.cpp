//===- Dispatch.cpp - the dispatch kernels --------------------------------===//
//
// moe.dispatch in two kernels. The plan kernel, one block, counts each
// expert's choices with shared-memory atomics, lays the experts out (the
// same code as the CPU backend), and gives each choice the next row of its
// expert, all on the device: the host never waits for the counts. The
// scatter kernel copies each token's row to its chosen rows with 16-byte
// vectors, scaled on the way for Llama-4's routers, and with `quant`
// quantizes it on the way (the token's own codes too, when asked).
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
// One block plans every choice; experts beyond the thread count take turns.
constexpr int64_t kPlanThreads = 1024;
} // namespace

LogicalResult nvidia::buildDispatch(LayerKernels &layer, DispatchOp op) {
  auto countsType = cast<RankedTensorType>(op.getTokensPerExpert().getType());
  int64_t experts = countsType.getDimSize(0);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  int64_t h =
      cast<RankedTensorType>(op.getHiddenStates().getType()).getDimSize(1);
  int64_t align = op.getAlign();
  layer.define(op.getTokensPerExpert(), {});
  layer.define(op.getExpertOffsets(), {});
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  layer.define(op.getRows(), tokens);
  // Rows for every choice, plus each expert's alignment padding.
  TokenLinear dispatchedRows = {tokens.fixed * topK + experts * (align - 1),
                                tokens.perToken * topK};
  layer.define(op.getDispatched(), dispatchedRows);
  QuantAttr quant = op.getQuantAttr();
  if (quant)
    layer.define(op.getDispatchedScales(), dispatchedRows);
  if (op.getTokens()) {
    layer.define(op.getTokens(), tokens);
    layer.define(op.getTokenScales(), tokens);
  }

  {
    // The plan, in one block: counts by shared-memory atomics, offsets by one
    // thread, then each choice takes the next row of its expert. Rows within
    // an expert are in no particular order; each row's result depends only
    // on its token, so the layer's output does not change.
    Kernel k = layer.kernel(op, "dispatch_plan",
                            {op.getExpertIds(), op.getTokensPerExpert(),
                             op.getExpertOffsets(), op.getRows()});
    k.launch.work = {1, 0};
    k.launch.block = kPlanThreads;
    Emitter &e = k.e;
    Value ids = k.view(0, layer.info(op.getExpertIds()));
    Value counts = k.view(1, layer.info(op.getTokensPerExpert()));
    Value offsets = k.view(2, layer.info(op.getExpertOffsets()));
    Value rows = k.view(3, layer.info(op.getRows()));
    Type i32 = e.b.getI32Type();
    Value count = k.workgroupBuffer({experts}, i32);
    Value cursor = k.workgroupBuffer({experts}, i32);
    Value tid = k.threadId();
    Value choices = e.imul(k.linear(tokens), topK);
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
        tid, e.index(experts),
        [&](Value x) { e.storeRaw(e.i32(0), count, {x}); },
        e.index(kPlanThreads));
    gpu::BarrierOp::create(e.b, e.loc);
    e.forEach(
        tid, choices,
        [&](Value p) {
          Value id = e.loadRaw(ids, at(p));
          e.ifThen(isLocal(id), [&] { increment(count, id); });
        },
        e.index(kPlanThreads));
    gpu::BarrierOp::create(e.b, e.loc);
    e.ifThen(e.eq(tid, e.index(0)), [&] {
      common::layOutExperts(
          e, experts, align, offsets,
          [&](Value x) { return e.loadRaw(count, {x}); },
          [&](Value x, Value offset, Value c) {
            e.storeRaw(c, counts, {x});
            e.storeRaw(offset, cursor, {x});
          });
    });
    gpu::BarrierOp::create(e.b, e.loc);
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
        e.index(kPlanThreads));
    if (failed(k.finish(op)))
      return failure();
  }
  // The scatter: a block per token copies its row to each chosen slot.
  SmallVector<Value> buffers = {op.getHiddenStates(), op.getRows(),
                                op.getDispatched()};
  if (op.getScale())
    buffers.push_back(op.getScale());
  if (quant)
    buffers.push_back(op.getDispatchedScales());
  if (op.getTokens())
    buffers.append({op.getTokens(), op.getTokenScales()});
  Kernel k = layer.kernel(op, "dispatch_scatter", buffers);
  k.launch.work = tokens;
  k.launch.block = 128;
  Emitter &e = k.e;
  Value hidden = k.view(0, layer.info(op.getHiddenStates()));
  Value rows = k.view(1, layer.info(op.getRows()));
  Value dispatched = k.view(2, layer.info(op.getDispatched()));
  Value scale = op.getScale() ? k.view(3, layer.info(op.getScale())) : Value();
  auto view = [&](Value tensor) {
    return k.view(llvm::find(buffers, tensor) - buffers.begin(),
                  layer.info(tensor));
  };
  Value scales = quant ? view(op.getDispatchedScales()) : Value();
  Value tokenCodes = op.getTokens() ? view(op.getTokens()) : Value();
  Value tokenScales = op.getTokens() ? view(op.getTokenScales()) : Value();
  Value t = k.blockId(gpu::Dimension::x), tid = k.threadId();
  k.onlyIf(e.ult(t, k.linear(tokens)));
  int64_t width = vectorWidth(h);
  Type bf16 = e.b.getBF16Type(), f32 = e.b.getF32Type();
  auto vecType = VectorType::get({width}, bf16);
  auto f32Vec = VectorType::get({width}, f32);
  // The token's weight for choice j, as the row's multiplier.
  auto scaled = [&](Value v, Value j) {
    if (!scale)
      return v;
    Value splat = vector::BroadcastOp::create(e.b, e.loc, f32Vec,
                                              e.loadRaw(scale, {t, j}));
    return arith::TruncFOp::create(
               e.b, e.loc, vecType,
               e.mul(arith::ExtFOp::create(e.b, e.loc, f32Vec, v), splat))
        .getResult();
  };
  if (!quant) {
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
              vector::StoreOp::create(e.b, e.loc, scaled(v, j), dispatched,
                                      {r, c}, false, vectorAlign(width, bf16));
            },
            e.index(128 * width));
      });
    });
    return k.finish(op);
  }

  // Quantized on the way: a block of `bs` columns is bs / width consecutive
  // threads' vectors, which combine their statistics by shuffles. Every
  // thread runs every chunk (past H with zeros), so the shuffles see whole
  // warps; a row shared by all choices (no scale) is quantized once.
  int64_t bs = quant.getBlockSize();
  int64_t lanes = bs / width;
  if (width != 8)
    return op->emitOpError()
           << "quantizes rows of hidden size " << h
           << " on sm_90a, which reads them in 8-element vectors: the hidden "
              "size must be a multiple of 8";
  Type i8 = e.b.getI8Type();
  e.forEach(
      e.index(0), e.index(llvm::divideCeil(h, 128 * width) * 128 * width),
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
        e.forEach(e.index(0), e.index(topK), [&](Value j) {
          Value row = e.loadRaw(rows, {t, j});
          // Uniform across the block: every thread reads the same row.
          e.ifThen(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)), [&] {
            auto [codes, stored] = scale ? quantize(scaled(v, j)) : shared;
            store(dispatched, scales, e.toIndex(row), codes, stored);
          });
        });
      },
      e.index(128 * width));
  return k.finish(op);
}
