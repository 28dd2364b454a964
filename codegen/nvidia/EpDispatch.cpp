//===- EpDispatch.cpp - sending tokens to the ranks of their experts ------===//
//
// moe.ep_dispatch_send and moe.ep_dispatch_recv on sm_90a, for ranks whose
// GPUs share a host. Each rank owns one device allocation, its state
// (runtime/EpLayout.h), whose address every peer mapped at init (CUDA IPC).
// The send stores each token's record straight into the states of the
// ranks that hold its experts over NVLink, then raises a flag there: every
// block fences at system scope and counts itself done; the last one writes
// the counts and, after another fence, the forward's sequence number. The
// receiver spins on that number (with a time limit, past which it records
// which rank it waited for and goes on with nothing from it), so no kernel
// waits on the host and a forward can be captured in a graph.
//
//  plan    one block: each token's record index per rank, each choice's
//          return row, by block-wide scans, so both are in token order.
//  send    a block per token.
//  wait    one block: counts, the rank's experts' rows.
//  unpack  records fanned out into rows.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/EpExchange.h"
#include "codegen/nvidia/KernelBuilder.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;
using namespace mlir::moe::nvidia::ep;

/// Copies row `row` of the block scales `scales` to raw bytes at `at`
/// (toRecord), or those bytes to each row of `rows` whose `valid` holds;
/// one element per thread and step.
static void copyScales(Raw &r, Value tid, Value scales, Value at,
                       ArrayRef<Value> rows, ArrayRef<Value> valid,
                       bool toRecord) {
  auto type = cast<MemRefType>(scales.getType());
  Type element = type.getElementType();
  int64_t bytes = element.getIntOrFloatBitWidth() / 8;
  r.e.forEach(
      tid, r.e.index(type.getDimSize(1)),
      [&](Value s) {
        Value p = r.at(at, r.mul(r.to64(s), bytes));
        if (toRecord) {
          r.store(r.e.loadRaw(scales, {rows[0], s}), p, bytes);
          return;
        }
        Value v = r.load(element, p, bytes);
        for (auto [row, ok] : llvm::zip_equal(rows, valid))
          r.e.ifThen(ok, [&] { r.e.storeRaw(v, scales, {row, s}); });
      },
      r.e.index(kCopyThreads));
}

/// An inclusive sum over the block's threads of `a` and `b` (one each per
/// thread), through shared `sa` and `sb` of kPlanThreads entries.
static std::pair<Value, Value> blockScan(Kernel &k, Value sa, Value sb, Value a,
                                         Value b) {
  Emitter &e = k.e;
  Value tid = k.threadId();
  e.storeRaw(a, sa, {tid});
  e.storeRaw(b, sb, {tid});
  gpu::BarrierOp::create(e.b, e.loc);
  for (int64_t d = 1; d < kPlanThreads; d *= 2) {
    Value has = e.icmp(arith::CmpIPredicate::uge, tid, e.index(d));
    Value from = e.select(has, e.isub(tid, e.index(d)), e.index(0));
    Value zero = e.i32(0);
    Value na = e.iadd(e.loadRaw(sa, {tid}),
                      e.select(has, e.loadRaw(sa, {from}), zero));
    Value nb = e.iadd(e.loadRaw(sb, {tid}),
                      e.select(has, e.loadRaw(sb, {from}), zero));
    gpu::BarrierOp::create(e.b, e.loc);
    e.storeRaw(na, sa, {tid});
    e.storeRaw(nb, sb, {tid});
    gpu::BarrierOp::create(e.b, e.loc);
  }
  return {e.loadRaw(sa, {tid}), e.loadRaw(sb, {tid})};
}

/// The plan: per rank, a scan over the tokens numbers the records and the
/// choices that rank gets, in token order.
static LogicalResult buildEpDispatchPlan(LayerKernels &layer,
                                         EpDispatchSendOp op,
                                         const EpShape &shape, unsigned state) {
  int64_t ranks = shape.ranks, topK = shape.topK;
  Kernel k = layer.kernelOn(op, "ep_dispatch_plan",
                            {layer.info(op.getExpertIds()).buffer,
                             layer.info(op.getRows()).buffer,
                             layer.info(op.getSent()).buffer, state});
  k.launch.work = {1, 0};
  k.launch.block = kPlanThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value ids = k.view(0, layer.info(op.getExpertIds()));
  Value rows = k.view(1, layer.info(op.getRows()));
  Value sent = k.view(2, layer.info(op.getSent()));
  Value st = k.func.getArgument(3);
  Type i32 = e.b.getI32Type();
  Value tid = k.threadId();
  Value scanA = k.workgroupBuffer({kPlanThreads}, i32);
  Value scanB = k.workgroupBuffer({kPlanThreads}, i32);
  Value bases = k.workgroupBuffer({ranks + 1}, i32);
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Value seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
    r.store(e.iadd(seq, e.i32(1)), r.at(st, EpDeviceLayout::kSeq));
    e.storeRaw(e.i32(0), bases, {e.index(0)});
  });
  Value count = e.imul(k.tokens, topK);
  e.forEach(
      tid, count,
      [&](Value p) {
        e.storeRaw(e.i32(-1), rows, {e.divUI(p, topK), e.remUI(p, topK)});
      },
      e.index(kPlanThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  // Each thread takes a contiguous run of tokens.
  Value chunk =
      e.divUI(e.iadd(k.tokens, e.index(kPlanThreads - 1)), kPlanThreads);
  Value first = e.minUI(e.imul(tid, chunk), k.tokens);
  Value last = e.minUI(e.iadd(first, chunk), k.tokens);
  // A token's choices in one vector load: a thread's tokens are a run, so
  // a warp's loads touch 32 lines each, and one load a choice kept the
  // block's L1 busy (4096 tokens: 143 us, L1 82%, its queue full).
  int64_t rowBytes = 4 * topK;
  auto vec = VectorType::get({topK}, i32);
  auto choicesOf = [&](Value t) {
    Value v = vector::LoadOp::create(
        e.b, e.loc, vec, ids, {t, e.index(0)}, false,
        llvm::Align(std::min<int64_t>(16, rowBytes & -rowBytes)));
    SmallVector<Value> out;
    for (int64_t j = 0; j < topK; ++j)
      out.push_back(vector::ExtractOp::create(e.b, e.loc, v, j));
    return out;
  };
  for (int64_t q = 0; q < ranks; ++q) {
    SmallVector<Value> mine = e.reduce(
        first, last, {e.i32(0), e.i32(0)},
        [&](Value t, ValueRange acc) -> SmallVector<Value> {
          Value hit =
              arith::ConstantOp::create(e.b, e.loc, e.b.getBoolAttr(false));
          Value choices = acc[1];
          SmallVector<Value> chosen = choicesOf(t);
          for (int64_t j = 0; j < topK; ++j) {
            Value is = shape.heldBy(e, chosen[j], q);
            hit = e.ori(hit, is);
            choices =
                e.iadd(choices, arith::ExtUIOp::create(e.b, e.loc, i32, is));
          }
          return {e.iadd(acc[0], arith::ExtUIOp::create(e.b, e.loc, i32, hit)),
                  choices};
        });
    auto [recordsUpTo, choicesUpTo] =
        blockScan(k, scanA, scanB, mine[0], mine[1]);
    Value base = e.loadRaw(bases, {e.index(q)});
    e.reduce(
        first, last,
        {e.isub(recordsUpTo, mine[0]), e.isub(choicesUpTo, mine[1])},
        [&](Value t, ValueRange acc) -> SmallVector<Value> {
          Value hit =
              arith::ConstantOp::create(e.b, e.loc, e.b.getBoolAttr(false));
          Value choice = acc[1];
          SmallVector<Value> chosen = choicesOf(t);
          for (int64_t j = 0; j < topK; ++j) {
            Value is = shape.heldBy(e, chosen[j], q);
            e.ifThen(is, [&] {
              e.storeRaw(e.iadd(base, choice), rows, {t, e.index(j)});
            });
            hit = e.ori(hit, is);
            choice =
                e.iadd(choice, arith::ExtUIOp::create(e.b, e.loc, i32, is));
          }
          r.store(e.select(hit, acc[0], e.i32(-1)),
                  shape.recordIndexSlot(r, st, t, q));
          return {e.iadd(acc[0], arith::ExtUIOp::create(e.b, e.loc, i32, hit)),
                  choice};
        });
    e.ifThen(e.eq(tid, e.index(0)), [&] {
      Value records = e.loadRaw(scanA, {e.index(kPlanThreads - 1)});
      Value choices = e.loadRaw(scanB, {e.index(kPlanThreads - 1)});
      e.storeRaw(records, sent, {e.index(q)});
      r.store(records, r.at(st, EpDeviceLayout::kSentCounts + 4 * q));
      r.store(base, r.at(st, EpDeviceLayout::kChoiceBase + 4 * q));
      e.storeRaw(e.iadd(base, choices), bases, {e.index(q + 1)});
    });
    gpu::BarrierOp::create(e.b, e.loc);
  }
  return k.finish(op);
}

/// The send: a block per token writes its record into each rank that holds
/// one of its experts; the last block to finish raises the flags.
static LogicalResult buildEpDispatchRecords(LayerKernels &layer,
                                            EpDispatchSendOp op,
                                            const EpShape &shape,
                                            unsigned state) {
  int64_t ranks = shape.ranks, topK = shape.topK, hidden = shape.hidden,
          local = shape.localExperts;
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  bool quantized = !op.getQuantized().empty();
  SmallVector<unsigned> sendBuffers = {layer.info(op.getHiddenStates()).buffer,
                                       layer.info(op.getExpertIds()).buffer,
                                       layer.info(op.getRows()).buffer, state};
  if (quantized)
    sendBuffers.append({layer.info(op.getQuantized()[0]).buffer,
                        layer.info(op.getQuantized()[1]).buffer});
  Kernel k = layer.kernelOn(op, "ep_dispatch_send", sendBuffers);
  k.launch.work = tokens;
  k.launch.extraBlocks = 1;
  k.launch.block = kCopyThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value hiddenView = k.view(0, layer.info(op.getHiddenStates()));
  Value ids = k.view(1, layer.info(op.getExpertIds()));
  Value rows = k.view(2, layer.info(op.getRows()));
  Value st = k.func.getArgument(3);
  Value codes =
      quantized ? k.view(4, layer.info(op.getQuantized()[0])) : Value();
  Value codeScales =
      quantized ? k.view(5, layer.info(op.getQuantized()[1])) : Value();
  Type i32 = e.b.getI32Type();
  Value t = k.blockId(gpu::Dimension::x), tid = k.threadId();
  Value self = r.load(i32, r.at(st, EpDeviceLayout::kRank));
  e.ifThen(e.ult(t, k.tokens), [&] {
    for (int64_t q = 0; q < ranks; ++q) {
      Value index = r.load(i32, shape.recordIndexSlot(r, st, t, q));
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, index, e.i32(0)), [&] {
        Value record = shape.record(r, r.peer(st, r.c64(q)), self, index);
        e.ifThen(e.ult(tid, e.index(topK)), [&] {
          Value id = e.loadRaw(ids, {t, tid});
          Value mineQ = shape.heldBy(e, id, q);
          Value localId =
              e.select(mineQ, e.isub(id, e.i32(q * local)), e.i32(-1));
          Value back = e.select(mineQ, e.loadRaw(rows, {t, tid}), e.i32(-1));
          Value j4 = r.mul(r.to64(tid), 4);
          r.store(localId, r.at(record, r.add(r.c64(4), j4)));
          r.store(arith::ConstantOp::create(e.b, e.loc, e.b.getF32FloatAttr(0)),
                  r.at(record, r.add(r.c64(4 + 4 * topK), j4)));
          r.store(back, r.at(record, r.add(r.c64(4 + 8 * topK), j4)));
        });
        e.ifThen(e.eq(tid, e.index(0)), [&] { r.store(e.toI32(t), record); });
        Value payload = r.at(record, shape.header());
        if (quantized) {
          copyRow(r, tid, hidden, r.b.getI8Type(),
                  [&](Value c, VectorType vec) {
                    Value v = vector::LoadOp::create(
                        e.b, e.loc, vec, codes, {t, c}, false, llvm::Align(8));
                    r.store(v, r.at(payload, c), 8);
                  });
          copyScales(r, tid, codeScales, r.at(payload, hidden), {t}, {},
                     /*toRecord=*/true);
          return;
        }
        copyRow(r, tid, hidden, r.b.getBF16Type(),
                [&](Value c, VectorType vec) {
                  Value v = vector::LoadOp::create(
                      e.b, e.loc, vec, hiddenView, {t, c}, false,
                      vectorAlign(8, vec.getElementType()));
                  r.store(v, r.at(payload, r.mul(r.to64(c), 2)), 16);
                });
      });
    }
  });
  r.fenceSystem();
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Value done = r.atomicAdd(r.at(st, EpDeviceLayout::kTicket), e.i32(1));
    // The last of the grid's blocks: a bucket's grid may hold more blocks
    // than tokens.
    Value last = e.isub(gpu::GridDimOp::create(e.b, e.loc, gpu::Dimension::x),
                        e.index(1));
    e.ifThen(e.eq(r.to64(done), r.to64(last)), [&] {
      r.store(e.i32(0), r.at(st, EpDeviceLayout::kTicket));
      r.fenceSystem();
      Value seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
      SmallVector<Value> slots;
      for (int64_t q = 0; q < ranks; ++q) {
        Value slot =
            r.at(r.peer(st, r.c64(q)),
                 r.add(r.c64(EpDeviceLayout::kRecv), r.mul(r.to64(self), 16)));
        r.store(r.load(i32, r.at(st, EpDeviceLayout::kSentCounts + 4 * q)),
                slot);
        r.store(r.load(i32, r.at(st, EpDeviceLayout::kChoiceBase + 4 * q)),
                r.at(slot, 4));
        r.store(e.i32(0), r.at(slot, 8));
        slots.push_back(slot);
      }
      r.fenceSystem();
      for (Value slot : slots)
        r.storeVolatile(seq, r.at(slot, 12));
    });
  });
  return k.finish(op);
}

LogicalResult nvidia::buildEpDispatchSend(LayerKernels &layer,
                                          EpDispatchSendOp op) {
  auto hiddenType = cast<RankedTensorType>(op.getHiddenStates().getType());
  int64_t ranks = cast<RankedTensorType>(op.getSent().getType()).getDimSize(0);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  int64_t hidden = hiddenType.getDimSize(1);
  int64_t local = op.getLocalExperts();
  if (op.getScale())
    return op.emitOpError() << "sends weighted tokens (Llama-4); sm_90a "
                               "layers exchange unweighted tokens so far";
  if (failed(checkEpShape(op, hidden, hiddenType.getElementType(), ranks)))
    return failure();
  EpShape shape(ranks, topK, hidden, local, layer.epMaxTokens);
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  // Quantized tokens travel as their codes and scales, quantized once here
  // (the shared experts read them too).
  bool quantized = !op.getQuantized().empty();
  if (quantized && failed(buildRowQuantize(
                       layer, op, op.getHiddenStates(), op.getQuantized()[0],
                       op.getQuantized()[1], op.getQuantAttr())))
    return failure();
  layer.define(op.getRows(), tokens);
  layer.define(op.getSent(), {});
  unsigned state = layer.epState();
  if (failed(buildEpDispatchPlan(layer, op, shape, state)))
    return failure();
  return buildEpDispatchRecords(layer, op, shape, state);
}

/// The wait: every rank's count, then a row for each arrived choice of
/// this rank's experts.
static LogicalResult buildEpDispatchWait(LayerKernels &layer,
                                         EpDispatchRecvOp op,
                                         const EpShape &shape, unsigned state) {
  int64_t ranks = shape.ranks, topK = shape.topK, local = shape.localExperts,
          maxTokens = shape.maxTokens;
  int64_t slotRows = int64_t(shape.layout.slotRow());
  Kernel k = layer.kernelOn(op, "ep_dispatch_wait",
                            {layer.info(op.getTokensPerExpert()).buffer,
                             layer.info(op.getExpertOffsets()).buffer, state});
  k.launch.work = {1, 0};
  k.launch.block = kPlanThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value counts = k.view(0, layer.info(op.getTokensPerExpert()));
  Value offsets = k.view(1, layer.info(op.getExpertOffsets()));
  Value st = k.func.getArgument(2);
  Type i32 = e.b.getI32Type();
  Value tid = k.threadId();
  Value arrived = k.workgroupBuffer({ranks}, i32);
  Value count = k.workgroupBuffer({local}, i32);
  Value cursor = k.workgroupBuffer({local}, i32);
  Value seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
  Value limit = r.waitLimit(st);
  e.ifThen(e.ult(tid, e.index(ranks)), [&] {
    Value slot =
        r.at(st, r.add(r.c64(EpDeviceLayout::kRecv), r.mul(r.to64(tid), 16)));
    Value late = r.spinUntil(r.at(slot, 12), seq, limit);
    r.ptx("fence.acq_rel.sys;");
    Value n = e.select(late, e.i32(0), r.load(i32, slot));
    n = e.select(e.icmp(arith::CmpIPredicate::ugt, n, e.i32(maxTokens)),
                 e.i32(0), n);
    e.ifThen(late, [&] { r.recordTimeout(st, tid); });
    e.storeRaw(n, arrived, {tid});
    r.store(n, r.at(st, r.add(r.c64(EpDeviceLayout::kRecvCounts),
                              r.mul(r.to64(tid), 4))));
  });
  e.forEach(
      tid, e.index(local), [&](Value x) { e.storeRaw(e.i32(0), count, {x}); },
      e.index(kPlanThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  auto eachChoice = [&](function_ref<void(Value, Value, int64_t)> body) {
    for (int64_t q = 0; q < ranks; ++q) {
      Value n = e.toIndex(e.loadRaw(arrived, {e.index(q)}));
      e.forEach(
          tid, e.imul(n, topK),
          [&](Value p) {
            Value i = e.divUI(p, topK), j = e.remUI(p, topK);
            Value record = shape.record(r, st, r.c64(q), i);
            Value id =
                r.load(i32, r.at(record, r.add(r.c64(4), r.mul(r.to64(j), 4))));
            Value valid =
                e.andi(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                       e.icmp(arith::CmpIPredicate::slt, id, e.i32(local)));
            Value slot = r.add(
                r.mul(r.add(r.c64(q * maxTokens), r.to64(i)), topK), r.to64(j));
            body(e.select(valid, id, e.i32(-1)), slot, q);
          },
          e.index(kPlanThreads));
    }
  };
  auto increment = [&](Value buffer, Value id) {
    return memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi,
                                       e.i32(1), buffer,
                                       ValueRange{e.toIndex(id)})
        .getResult();
  };
  // Rows returned to each source, for a proxy that forwards them.
  Value returned = k.workgroupBuffer({ranks}, i32);
  e.forEach(
      tid, e.index(ranks),
      [&](Value x) { e.storeRaw(e.i32(0), returned, {x}); },
      e.index(kPlanThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  eachChoice([&](Value id, Value, int64_t q) {
    e.ifThen(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)), [&] {
      increment(count, id);
      increment(returned, e.i32(q));
    });
  });
  gpu::BarrierOp::create(e.b, e.loc);
  e.forEach(
      tid, e.index(ranks),
      [&](Value x) {
        r.store(e.loadRaw(returned, {x}),
                r.at(st, r.add(r.c64(EpDeviceLayout::kReturnRows),
                               r.mul(r.to64(x), 4))));
      },
      e.index(kPlanThreads));
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    common::layOutExperts(
        e, local, 1, offsets, [&](Value x) { return e.loadRaw(count, {x}); },
        [&](Value x, Value offset, Value c) {
          e.storeRaw(c, counts, {x});
          e.storeRaw(offset, cursor, {x});
        });
  });
  gpu::BarrierOp::create(e.b, e.loc);
  eachChoice([&](Value id, Value slot, int64_t) {
    auto row =
        scf::IfOp::create(e.b, e.loc, TypeRange{i32},
                          e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                          /*withElse=*/true);
    {
      OpBuilder::InsertionGuard guard(e.b);
      e.b.setInsertionPointToStart(&row.getThenRegion().front());
      scf::YieldOp::create(e.b, e.loc, increment(cursor, id));
      e.b.setInsertionPointToStart(&row.getElseRegion().front());
      scf::YieldOp::create(e.b, e.loc, e.i32(-1));
    }
    r.store(row.getResult(0), r.at(st, r.add(r.c64(slotRows), r.mul(slot, 4))));
  });
  return k.finish(op);
}

/// Unpack: each arrived record's row to each of its rows here.
static LogicalResult buildEpDispatchUnpack(LayerKernels &layer,
                                           EpDispatchRecvOp op,
                                           const EpShape &shape,
                                           unsigned state) {
  int64_t ranks = shape.ranks, topK = shape.topK, hidden = shape.hidden,
          maxTokens = shape.maxTokens;
  int64_t slotRows = int64_t(shape.layout.slotRow());
  bool quantized = !op.getQuantized().empty();
  SmallVector<unsigned> unpackBuffers = {layer.info(op.getDispatched()).buffer,
                                         layer.info(op.getOrigin()).buffer,
                                         state};
  if (quantized)
    unpackBuffers.push_back(layer.info(op.getQuantized()[0]).buffer);
  Kernel k = layer.kernelOn(op, "ep_dispatch_unpack", unpackBuffers);
  k.launch.work = {kStrideBlocks, 0};
  k.launch.block = kCopyThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value dispatched = k.view(0, layer.info(op.getDispatched()));
  Value origin = k.view(1, layer.info(op.getOrigin()));
  Value st = k.func.getArgument(2);
  Value rowScales =
      quantized ? k.view(3, layer.info(op.getQuantized()[0])) : Value();
  Type i32 = e.b.getI32Type();
  Value tid = k.threadId();
  e.forEach(
      k.blockId(gpu::Dimension::x), e.index(ranks * maxTokens),
      [&](Value p) {
        Value q = e.divUI(p, maxTokens), i = e.remUI(p, maxTokens);
        Value n = r.load(i32, r.at(st, r.add(r.c64(EpDeviceLayout::kRecvCounts),
                                             r.mul(r.to64(q), 4))));
        e.ifThen(e.ult(i, e.toIndex(n)), [&] {
          Value record = shape.record(r, st, q, i);
          // The record's rows here, then its payload read once and stored
          // to each of them.
          SmallVector<Value> rowsHere, valid;
          for (int64_t j = 0; j < topK; ++j) {
            Value row = r.load(
                i32,
                r.at(st,
                     r.add(r.c64(slotRows),
                           r.mul(r.add(r.mul(r.to64(p), topK), r.c64(j)), 4))));
            valid.push_back(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)));
            rowsHere.push_back(
                e.toIndex(e.select(valid.back(), row, e.i32(0))));
          }
          e.ifThen(e.eq(tid, e.index(0)), [&] {
            for (int64_t j = 0; j < topK; ++j)
              e.ifThen(valid[j], [&] {
                e.storeRaw(e.toI32(q), origin, {rowsHere[j], e.index(0)});
                e.storeRaw(r.load(i32, r.at(record, 4 + 8 * topK + 4 * j)),
                           origin, {rowsHere[j], e.index(1)});
              });
          });
          Value payload = r.at(record, shape.header());
          auto fanOut = [&](Value dst, Value c, Value v,
                            llvm::MaybeAlign align) {
            for (int64_t j = 0; j < topK; ++j)
              e.ifThen(valid[j], [&] {
                vector::StoreOp::create(e.b, e.loc, v, dst, {rowsHere[j], c},
                                        false, align);
              });
          };
          if (quantized) {
            copyRow(r, tid, hidden, r.b.getI8Type(),
                    [&](Value c, VectorType vec) {
                      fanOut(dispatched, c, r.load(vec, r.at(payload, c), 8),
                             llvm::Align(8));
                    });
            copyScales(r, tid, rowScales, r.at(payload, hidden), rowsHere,
                       valid, /*toRecord=*/false);
            return;
          }
          copyRow(r, tid, hidden, r.b.getBF16Type(),
                  [&](Value c, VectorType vec) {
                    fanOut(dispatched, c,
                           r.load(vec, r.at(payload, r.mul(r.to64(c), 2)), 16),
                           vectorAlign(8, vec.getElementType()));
                  });
        });
      },
      e.index(kStrideBlocks));
  return k.finish(op);
}

LogicalResult nvidia::buildEpDispatchRecv(LayerKernels &layer,
                                          EpDispatchRecvOp op) {
  auto dispatchedType = cast<RankedTensorType>(op.getDispatched().getType());
  int64_t ranks = cast<RankedTensorType>(op.getSent().getType()).getDimSize(0);
  int64_t local =
      cast<RankedTensorType>(op.getTokensPerExpert().getType()).getDimSize(0);
  int64_t hidden = dispatchedType.getDimSize(1);
  if (op.getScaled())
    return op.emitOpError() << "receives weighted tokens (Llama-4); sm_90a "
                               "layers exchange unweighted tokens so far";
  bool quantized = !op.getQuantized().empty();
  if (failed(checkEpShape(op, hidden, dispatchedType.getElementType(), ranks)))
    return failure();
  // The top-k is the send's: the sent counts come from it.
  auto send = op.getSent().getDefiningOp<EpDispatchSendOp>();
  if (!send)
    return op.emitOpError() << "must receive what a moe.ep_dispatch_send of "
                               "the same function sent";
  int64_t topK = cast<RankedTensorType>(send.getRows().getType()).getDimSize(1);
  int64_t maxTokens = layer.epMaxTokens;
  EpShape shape(ranks, topK, hidden, local, maxTokens);
  // Every rank's tokens may choose this rank's experts.
  TokenLinear capacity = {ranks * maxTokens * topK, 0};
  layer.define(op.getTokensPerExpert(), {});
  layer.define(op.getExpertOffsets(), {});
  layer.define(op.getDispatched(), capacity);
  layer.define(op.getOrigin(), capacity);
  if (quantized)
    layer.define(op.getQuantized()[0], capacity);
  unsigned state = layer.epState();
  if (failed(buildEpDispatchWait(layer, op, shape, state)))
    return failure();
  return buildEpDispatchUnpack(layer, op, shape, state);
}
