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
//  plan    a thread per token: record indices, return rows and each
//          choice's place among the rank's choices of its expert.
//  send    a block per token; the last block also sends each rank its
//          choices per expert, so the receiver knows every row at once.
//  wait    one block: a thread per rank spins on its flag.
//  unpack  every block lays out the experts' rows from the counts and fans
//          records out into them.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/EpExchange.h"
#include "codegen/nvidia/kernels/Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;
using namespace mlir::moe::nvidia::ep;

/// Copies row `row` of the block scales `scales` to raw bytes at `at`, one
/// element per thread and step.
static void copyScalesToRecord(Raw &r, Value tid, Value scales, Value row,
                               Value at) {
  auto type = cast<MemRefType>(scales.getType());
  int64_t bytes = type.getElementType().getIntOrFloatBitWidth() / 8;
  r.e.forEach(
      tid, r.e.index(type.getDimSize(1)),
      [&](Value s) {
        r.store(r.e.loadRaw(scales, {row, s}),
                r.at(at, r.mul(r.to64(s), bytes)), bytes);
      },
      r.e.index(kCopyThreads));
}

/// An inclusive sum, in place, of the first `n` entries of the shared
/// `buffer`, by a block of at least `n` threads.
static void scanInPlace(Kernel &k, Value buffer, int64_t n) {
  Emitter &e = k.e;
  Value tid = k.threadId();
  Value in = e.ult(tid, e.index(n));
  Value at = e.select(in, tid, e.index(0));
  for (int64_t d = 1; d < n; d *= 2) {
    Value has = e.andi(in, e.icmp(arith::CmpIPredicate::uge, tid, e.index(d)));
    Value from = e.select(has, e.isub(at, e.index(d)), e.index(0));
    Value v = e.iadd(e.loadRaw(buffer, {at}),
                     e.select(has, e.loadRaw(buffer, {from}), e.i32(0)));
    gpu::BarrierOp::create(e.b, e.loc);
    e.ifThen(in, [&] { e.storeRaw(v, buffer, {at}); });
    gpu::BarrierOp::create(e.b, e.loc);
  }
}

/// `amount` added to shared `buffer[at]` where `cond` holds: its old value,
/// else 0.
static Value addIf(Emitter &e, Value cond, Value buffer, Value at,
                   Value amount) {
  return e.valueIf(cond, e.b.getI32Type(), [&] {
    return memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi,
                                       amount, buffer, ValueRange{at})
        .getResult();
  });
}

/// The plan, a thread per token: each token's record index per rank, each
/// choice's return row (relative to its rank's first; the send adds that)
/// and its place among this rank's choices of its expert, which the
/// receiver turns into a row. Blocks count in shared memory, then claim
/// their share of the state's counters, so the numbering is in no
/// particular order: rows within an expert are computed alike wherever
/// they lie.
static LogicalResult buildEpDispatchPlan(LayerKernels &layer,
                                         EpDispatchSendOp op,
                                         const EpShape &shape, unsigned state) {
  int64_t ranks = shape.ranks, topK = shape.topK, local = shape.localExperts;
  int64_t experts = ranks * local;
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  Kernel k = layer.kernelOn(op, "ep_dispatch_plan",
                            {layer.info(op.getExpertIds()).buffer,
                             layer.info(op.getRows()).buffer, state});
  // One block at least: the plan also counts the forward.
  k.launch.work = {tokens.fixed + 1, tokens.perToken};
  k.launch.perBlock = kPlanThreads;
  k.launch.block = kPlanThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value ids = k.view(0, layer.info(op.getExpertIds()));
  Value rows = k.view(1, layer.info(op.getRows()));
  Value st = k.func.getArgument(2);
  Type i32 = e.b.getI32Type();
  Value tid = k.threadId(), block = k.blockId(gpu::Dimension::x);
  Value t = e.iadd(e.imul(block, e.index(kPlanThreads)), tid);
  Value valid = e.ult(t, k.tokens);
  Value records = k.workgroupBuffer({ranks}, i32);
  Value choices = k.workgroupBuffer({ranks}, i32);
  Value placed = k.workgroupBuffer({experts}, i32);
  e.ifThen(e.andi(e.eq(block, e.index(0)), e.eq(tid, e.index(0))), [&] {
    Value seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
    r.store(e.iadd(seq, e.i32(1)), r.at(st, EpDeviceLayout::kSeq));
  });
  // The receive's per-rank fill and drop counts start each forward at 0
  // (the last forward's combine send has checked them).
  e.ifThen(e.eq(block, e.index(0)), [&] {
    e.forEach(
        tid, e.index(2 * ranks),
        [&](Value x) { r.store(e.i32(0), shape.rowCheck(r, st, 0, x)); },
        e.index(kPlanThreads));
  });
  e.forEach(
      tid, e.index(ranks),
      [&](Value x) {
        e.storeRaw(e.i32(0), records, {x});
        e.storeRaw(e.i32(0), choices, {x});
      },
      e.index(kPlanThreads));
  e.forEach(
      tid, e.index(experts),
      [&](Value x) { e.storeRaw(e.i32(0), placed, {x}); },
      e.index(kPlanThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  // The token's choices in one vector load (none past the count: a rank
  // may bring no tokens at all).
  auto vec = VectorType::get({topK}, i32);
  int64_t rowBytes = 4 * topK;
  Value v = e.valueIf(valid, vec, [&] {
    return vector::LoadOp::create(
               e.b, e.loc, vec, ids, {t, e.index(0)}, false,
               llvm::Align(std::min<int64_t>(16, rowBytes & -rowBytes)))
        .getResult();
  });
  // Each choice's expert and rank (-1: none), and both as indices into
  // the counters (0 for none).
  SmallVector<Value> id, owner, ok, idAt, ownerAt;
  for (int64_t j = 0; j < topK; ++j) {
    id.push_back(vector::ExtractOp::create(e.b, e.loc, v, j));
    ok.push_back(e.andi(
        valid,
        e.andi(e.icmp(arith::CmpIPredicate::sge, id[j], e.i32(0)),
               e.icmp(arith::CmpIPredicate::slt, id[j], e.i32(experts)))));
    owner.push_back(
        e.select(ok[j], arith::DivUIOp::create(e.b, e.loc, id[j], e.i32(local)),
                 e.i32(-1)));
    idAt.push_back(e.toIndex(e.select(ok[j], id[j], e.i32(0))));
    ownerAt.push_back(e.toIndex(e.select(ok[j], owner[j], e.i32(0))));
  }
  // Per choice: the token's choices of the same rank, and those before it;
  // the first of them claims the token's record and choices there.
  SmallVector<Value> before, first, recordHere, choiceHere, position;
  for (int64_t j = 0; j < topK; ++j) {
    Value same = e.i32(0), earlier = e.i32(0);
    for (int64_t j2 = 0; j2 < topK; ++j2) {
      Value is = arith::ExtUIOp::create(
          e.b, e.loc, i32, e.andi(ok[j2], e.eq(owner[j2], owner[j])));
      same = e.iadd(same, is);
      if (j2 < j)
        earlier = e.iadd(earlier, is);
    }
    before.push_back(earlier);
    first.push_back(e.andi(ok[j], e.eq(earlier, e.i32(0))));
    recordHere.push_back(addIf(e, first[j], records, ownerAt[j], e.i32(1)));
    choiceHere.push_back(addIf(e, first[j], choices, ownerAt[j], same));
    position.push_back(addIf(e, ok[j], placed, idAt[j], e.i32(1)));
  }
  // No record for the ranks the token does not go to.
  e.ifThen(valid, [&] {
    e.forEach(e.index(0), e.index(ranks), [&](Value q) {
      r.store(e.i32(-1), shape.recordIndexSlot(r, st, t, q));
    });
  });
  gpu::BarrierOp::create(e.b, e.loc);
  // The block's share of each counter.
  e.forEach(
      tid, e.index(ranks),
      [&](Value q) {
        for (auto [counts, offset] :
             {std::pair{records, EpDeviceLayout::kSentCounts},
              std::pair{choices, EpDeviceLayout::kSentChoices}})
          e.storeRaw(r.atomicAddRelaxed(EpShape::perRank(r, st, offset, q),
                                        e.loadRaw(counts, {q})),
                     counts, {q});
      },
      e.index(kPlanThreads));
  e.forEach(
      tid, e.index(experts),
      [&](Value x) {
        Value n = e.loadRaw(placed, {x});
        e.ifThen(e.icmp(arith::CmpIPredicate::ne, n, e.i32(0)), [&] {
          e.storeRaw(r.atomicAddRelaxed(shape.expertChoices(r, st, x), n),
                     placed, {x});
        });
      },
      e.index(kPlanThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(valid, [&] {
    for (int64_t j = 0; j < topK; ++j) {
      Value q = ownerAt[j];
      e.ifThen(first[j], [&] {
        r.store(e.iadd(e.loadRaw(records, {q}), recordHere[j]),
                shape.recordIndexSlot(r, st, t, owner[j]));
      });
      // The first choice of each rank holds the token's base there.
      Value base = e.i32(0);
      for (int64_t j2 = 0; j2 <= j; ++j2)
        base = e.select(e.andi(first[j2], e.eq(owner[j2], owner[j])),
                        choiceHere[j2], base);
      Value back = e.iadd(e.loadRaw(choices, {q}), e.iadd(base, before[j]));
      e.storeRaw(e.select(ok[j], back, e.i32(-1)), rows, {t, e.index(j)});
      r.store(e.select(ok[j], e.iadd(e.loadRaw(placed, {idAt[j]}), position[j]),
                       e.i32(-1)),
              shape.positionSlot(r, st, t, e.index(j)));
    }
  });
  return k.finish(op);
}

/// A training step's places, in one block after the plan: each choice's
/// place among this rank's choices of its expert in token order
/// (OrderedChoices), as one rank's ordered dispatch numbers them. Its
/// receiver then lays each expert's rows out in rank and token order, the
/// same in the forward that saves them and the backward that reads them,
/// and the weight gradients sum them in the one rank's order.
static LogicalResult buildEpDispatchOrder(LayerKernels &layer,
                                          EpDispatchSendOp op,
                                          const EpShape &shape,
                                          unsigned state) {
  int64_t experts = shape.ranks * shape.localExperts, topK = shape.topK;
  // As many warps as keep their table in 32 KiB of shared memory.
  int64_t warps = std::clamp<int64_t>(8192 / experts, 1, 32);
  if (warps * experts * 4 > 32 * 1024)
    return op.emitOpError() << "has " << experts
                            << " experts; an expert-parallel training step "
                               "on sm_90a numbers at most 8192";
  Kernel k = layer.kernelOn(op, "ep_dispatch_order",
                            {layer.info(op.getExpertIds()).buffer, state});
  k.launch.work = {1, 0};
  k.launch.block = warps * 32;
  Emitter &e = k.e;
  Raw r(k);
  Type i32 = e.b.getI32Type();
  Value st = k.func.getArgument(1);
  OrderedChoices ordered(k, k.view(0, layer.info(op.getExpertIds())),
                         e.imul(k.tokens, e.index(topK)), experts, topK, warps,
                         k.workgroupBuffer({warps, experts}, i32));
  ordered.count(Value());
  gpu::BarrierOp::create(e.b, e.loc);
  ordered.startWarps([&](Value) { return e.i32(0); });
  ordered.place([&](Value p, Value number) {
    SmallVector<Value> tj = ordered.at(p);
    r.store(number, shape.positionSlot(r, st, tj[0], tj[1]));
  });
  return k.finish(op);
}

/// The send's end: every block fences its writes and counts itself done;
/// the last one writes, into each peer, this rank's choices per expert, its
/// count slot (records, the return base `baseOf` gives, tokens) and, after
/// another fence, the forward's number.
static void finishDispatchSend(Kernel &k, Raw &r, const EpShape &shape,
                               Value st, Value self, Value sent,
                               function_ref<Value(Value)> baseOf) {
  Emitter &e = k.e;
  Type i32 = e.b.getI32Type();
  Value tid = k.threadId();
  int64_t ranks = shape.ranks, local = shape.localExperts;
  r.fenceSystem();
  Value last = k.workgroupBuffer({1}, i32);
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Value done = r.atomicAdd(r.at(st, EpDeviceLayout::kTicket), e.i32(1));
    // The last of the grid's blocks: a bucket's grid may hold more blocks
    // than tokens.
    Value lastBlock = e.isub(
        gpu::GridDimOp::create(e.b, e.loc, gpu::Dimension::x), e.index(1));
    e.storeRaw(arith::ExtUIOp::create(e.b, e.loc, i32,
                                      e.eq(r.to64(done), r.to64(lastBlock))),
               last, {e.index(0)});
  });
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(
      e.icmp(arith::CmpIPredicate::ne, e.loadRaw(last, {e.index(0)}), e.i32(0)),
      [&] {
        // Each rank's choices per expert, at the head of this rank's
        // region there; the counters start the next forward at zero.
        e.forEach(
            tid, e.index(ranks * local),
            [&](Value x) {
              Value q = e.divUI(x, local), ql = e.remUI(x, local);
              Value counter = shape.expertChoices(r, st, x);
              // The test hook's extra choices go to each peer's first
              // expert.
              Value extra = e.select(
                  e.andi(e.eq(ql, e.index(0)), e.ne(e.toI32(q), self)),
                  r.load(i32, r.at(st, EpDeviceLayout::kTestExtraChoice)),
                  e.i32(0));
              r.store(e.iadd(r.load(i32, counter), extra),
                      r.at(shape.region(r, r.peer(st, q), self),
                           r.mul(r.to64(ql), 4)));
              r.store(e.i32(0), counter);
            },
            e.index(kCopyThreads));
        e.forEach(
            tid, e.index(ranks),
            [&](Value q) {
              Value count =
                  EpShape::perRank(r, st, EpDeviceLayout::kSentCounts, q);
              Value slot = shape.countSlot(r, r.peer(st, q), self);
              Value records = r.load(i32, count);
              r.store(records, slot);
              // The test hook's return base (word + 1; 0: none) for peers.
              Value hook =
                  r.load(i32, r.at(st, EpDeviceLayout::kTestReturnBase));
              r.store(
                  e.select(e.andi(e.ne(hook, e.i32(0)), e.ne(e.toI32(q), self)),
                           e.isub(hook, e.i32(1)), baseOf(q)),
                  r.at(slot, 4));
              r.store(e.toI32(k.tokens), r.at(slot, 8));
              e.storeRaw(records, sent, {q});
              r.store(e.i32(0), count);
              r.store(e.i32(0),
                      EpShape::perRank(r, st, EpDeviceLayout::kSentChoices, q));
            },
            e.index(kCopyThreads));
        r.fenceSystem();
        gpu::BarrierOp::create(e.b, e.loc);
        e.ifThen(e.eq(tid, e.index(0)), [&] {
          r.store(e.i32(0), r.at(st, EpDeviceLayout::kTicket));
          r.fenceSystem();
          Value seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
          for (int64_t q = 0; q < ranks; ++q)
            r.storeVolatile(
                seq, r.at(shape.countSlot(r, r.peer(st, r.c64(q)), self), 12));
        });
      });
}

/// The send: each token's record into each rank that holds one of its
/// experts (a block a token in a small bucket, else blocks walking tokens);
/// the last block to finish gives each rank its counts, then raises the
/// flags.
static LogicalResult buildEpDispatchRecords(LayerKernels &layer,
                                            EpDispatchSendOp op,
                                            const EpShape &shape,
                                            unsigned state) {
  int64_t ranks = shape.ranks, topK = shape.topK, hidden = shape.hidden,
          local = shape.localExperts;
  const EpLayout &l = shape.recv();
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  bool quantized = !op.getQuantized().empty();
  SmallVector<unsigned> sendBuffers = {layer.info(op.getHiddenStates()).buffer,
                                       layer.info(op.getExpertIds()).buffer,
                                       layer.info(op.getRows()).buffer,
                                       layer.info(op.getSent()).buffer, state};
  if (quantized)
    sendBuffers.append({layer.info(op.getQuantized()[0]).buffer,
                        layer.info(op.getQuantized()[1]).buffer});
  bool weighted = static_cast<bool>(op.getScale());
  if (weighted)
    sendBuffers.push_back(layer.info(op.getScale()).buffer);
  Kernel k = layer.kernelOn(op, "ep_dispatch_send", sendBuffers);
  // A bucket of few tokens: a block a token and one more (the last block
  // to finish raises the flags, tokens or not). More tokens: two blocks a
  // multiprocessor, each walking tokens, so each block fences its writes
  // once rather than once a token (H200, DeepSeek-V3 EP2 at 4096 tokens: a
  // block a token spent twice its bytes' time on the link).
  bool strided = layer.maxTokens <= 0 || layer.maxTokens > kStrideBlocks;
  if (strided) {
    k.launch.work = {kStrideBlocks, 0};
  } else {
    k.launch.work = tokens;
    k.launch.extraBlocks = 1;
  }
  k.launch.block = kCopyThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value hiddenView = k.view(0, layer.info(op.getHiddenStates()));
  Value ids = k.view(1, layer.info(op.getExpertIds()));
  Value rows = k.view(2, layer.info(op.getRows()));
  Value sent = k.view(3, layer.info(op.getSent()));
  Value st = k.func.getArgument(4);
  Value codes =
      quantized ? k.view(5, layer.info(op.getQuantized()[0])) : Value();
  Value codeScales =
      quantized ? k.view(6, layer.info(op.getQuantized()[1])) : Value();
  Value weights =
      weighted ? k.view(sendBuffers.size() - 1, layer.info(op.getScale()))
               : Value();
  Type i32 = e.b.getI32Type();
  Value block = k.blockId(gpu::Dimension::x), tid = k.threadId();
  Value self = r.load(i32, r.at(st, EpDeviceLayout::kRank));
  // Where each rank's return rows end, then start: the plan counted every
  // choice.
  Value sentTo = k.workgroupBuffer({ranks}, i32);
  Value ends = k.workgroupBuffer({ranks}, i32);
  e.ifThen(e.ult(tid, e.index(ranks)), [&] {
    Value n =
        r.load(i32, EpShape::perRank(r, st, EpDeviceLayout::kSentChoices, tid));
    e.storeRaw(n, sentTo, {tid});
    e.storeRaw(n, ends, {tid});
  });
  gpu::BarrierOp::create(e.b, e.loc);
  scanInPlace(k, ends, ranks);
  auto baseOf = [&](Value q) {
    return e.isub(e.loadRaw(ends, {q}), e.loadRaw(sentTo, {q}));
  };
  // Token t's records to the ranks holding its experts.
  auto sendToken = [&](Value t) {
    // Thread j < topK: choice j's return row, made whole, and its place.
    Value header = e.ult(tid, e.index(topK));
    Value id = e.valueIf(header, i32, [&] { return e.loadRaw(ids, {t, tid}); });
    Value relative = e.valueIf(header, i32, [&] {
      return e.loadRaw(rows, {t, tid});
    });
    Value mine =
        e.andi(header, e.icmp(arith::CmpIPredicate::sge, relative, e.i32(0)));
    Value owner = e.select(
        mine, arith::DivUIOp::create(e.b, e.loc, id, e.i32(local)), e.i32(-1));
    Value back = e.valueIf(
        mine, i32, [&] { return e.iadd(relative, baseOf(e.toIndex(owner))); });
    back = e.select(mine, back, e.i32(-1));
    Value position = e.valueIf(header, i32, [&] {
      return r.load(i32, shape.positionSlot(r, st, t, tid));
    });
    Type f32 = e.b.getF32Type();
    Value weight = weighted ? e.valueIf(header, f32,
                                        [&] {
                                          return e.loadRaw(weights, {t, tid});
                                        })
                            : Value();
    e.ifThen(header, [&] { e.storeRaw(back, rows, {t, tid}); });
    for (int64_t q = 0; q < ranks; ++q) {
      Value index = r.load(i32, shape.recordIndexSlot(r, st, t, q));
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, index, e.i32(0)), [&] {
        Value record = shape.record(r, r.peer(st, r.c64(q)), self, index);
        e.ifThen(e.ult(tid, e.index(topK)), [&] {
          Value mineQ = e.eq(owner, e.i32(q));
          Value localId =
              e.select(mineQ, e.isub(id, e.i32(q * local)), e.i32(-1));
          Value j4 = r.mul(r.to64(tid), 4);
          r.store(localId, r.at(record, r.add(r.c64(l.localIdOffset(0)), j4)));
          r.store(e.select(mineQ, back, e.i32(-1)),
                  r.at(record, r.add(r.c64(l.returnOffset(0)), j4)));
          r.store(e.select(mineQ, position, e.i32(-1)),
                  r.at(record, r.add(r.c64(l.positionOffset(0)), j4)));
          if (weighted)
            r.store(e.select(mineQ, weight, e.f32(0)),
                    r.at(record, r.add(r.c64(l.weightOffset(0)), j4)));
        });
        e.ifThen(e.eq(tid, e.index(0)), [&] { r.store(e.toI32(t), record); });
        Value payload = r.at(record, shape.header());
        if (quantized) {
          copyRow(
              r, tid, hidden, r.b.getI8Type(), [&](Value c, VectorType vec) {
                int64_t bytes = vec.getNumElements();
                Value v = vector::LoadOp::create(e.b, e.loc, vec, codes, {t, c},
                                                 false, llvm::Align(bytes));
                r.store(v, r.at(payload, c), bytes);
              });
          copyScalesToRecord(r, tid, codeScales, t, r.at(payload, hidden));
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
  };
  if (strided)
    e.forEach(block, k.tokens, sendToken, e.index(kStrideBlocks));
  else
    e.ifThen(e.ult(block, k.tokens), [&] { sendToken(block); });
  finishDispatchSend(k, r, shape, st, self, sent, baseOf);
  return k.finish(op);
}

LogicalResult nvidia::buildEpDispatchSend(LayerKernels &layer,
                                          EpDispatchSendOp op) {
  auto hiddenType = cast<RankedTensorType>(op.getHiddenStates().getType());
  int64_t ranks = cast<RankedTensorType>(op.getSent().getType()).getDimSize(0);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  int64_t hidden = hiddenType.getDimSize(1);
  int64_t local = op.getLocalExperts();
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
  if (failed(buildEpDispatchPlan(layer, op, shape, state)) ||
      (isTrainingStep(op) &&
       failed(buildEpDispatchOrder(layer, op, shape, state))))
    return failure();
  return buildEpDispatchRecords(layer, op, shape, state);
}

/// The wait, one block: a thread per rank spins on its flag (with the
/// time limit) and leaves its record count, or -1 for a rank that ran out
/// of time or sent more than the capacity. Apart from the unpack, so that
/// ranks sharing a GPU (MPS) never find it holding every multiprocessor
/// while the sends it waits for have yet to run.
static LogicalResult buildEpDispatchWait(LayerKernels &layer,
                                         EpDispatchRecvOp op,
                                         const EpShape &shape, unsigned state) {
  Kernel k = layer.kernelOn(op, "ep_dispatch_wait", {state});
  Value st = k.func.getArgument(0);
  Emitter &e = k.e;
  // A training step's saved rows are sized for every rank passing this
  // rank's count: a rank that passed another one is refused by all alike
  // (each sees every rank's count).
  bool step = isTrainingStep(op);
  waitForRanks(
      k, st, shape.ranks,
      [&](Raw &r, Value q) { return r.at(shape.countSlot(r, st, q), 12); },
      [&](Raw &r, Value q, Value late) {
        Value n =
            e.select(late, e.i32(-1), r.load(r.i32, shape.countSlot(r, st, q)));
        if (step) {
          Value theirs = r.load(r.i32, r.at(shape.countSlot(r, st, q), 8));
          Value ours = e.toI32(k.tokens);
          Value uneven = e.andi(e.negate(late), e.ne(theirs, ours));
          e.ifThen(uneven, [&] {
            r.recordError(st, EpDeviceLayout::kUnevenStep, q, [&] {
              r.store(theirs, r.at(st, EpDeviceLayout::kErrorTokens));
              r.store(ours, r.at(st, EpDeviceLayout::kErrorOwn));
            });
          });
          n = e.select(uneven, e.i32(-1), n);
        }
        // More records than the capacity: none is taken, and the rank is
        // named (its counts and records cannot agree).
        Value over =
            e.icmp(arith::CmpIPredicate::sgt, n, e.i32(shape.maxTokens));
        e.ifThen(over, [&] {
          r.recordError(st, EpDeviceLayout::kRowsMismatch, q, [&] {
            r.store(n, r.at(st, EpDeviceLayout::kErrorTokens));
            r.store(e.i32(0), r.at(st, EpDeviceLayout::kErrorOwn));
          });
        });
        n = e.select(over, e.i32(-1), n);
        r.store(n, EpShape::perRank(r, st, EpDeviceLayout::kRecvCounts, q));
      });
  return k.finish(op);
}

namespace {
/// The unpack, every block alike: lay out this rank's experts' rows from
/// the counts every rank sent (each block for itself, so none waits on
/// another), then fan each arrived record out into its rows. A rank that
/// ran out of time, or whose counts do not add up to at most its records'
/// choices, gives no rows.
struct UnpackEmitter {
  Kernel &k;
  Emitter &e;
  Raw r;
  const EpShape &shape;
  const EpLayout &l;
  int64_t ranks, topK, hidden, local, maxTokens;
  // Rows of E4M3 codes with their scales, or (the backward's) rows with
  // their choice's weight.
  bool quantized, weighted;
  // A training step (its rows are saved).
  bool step;
  Type i32;
  Value counts, offsets, dispatched, origin, st, rowScales, rowWeights, tid,
      block;
  // Shared: each rank's record count (-1: none) and choices claimed here,
  // its choices per expert, where they start, the experts' ends; the rows
  // its records filled and its choices that found none, in this block.
  Value arrived, claimed, chosen, bases, ends, filled, dropped;
  // Shared: where each rank's records start among all arrived records, then
  // their total; the last of them (0 with none).
  Value firsts, lastRecord;
  // This forward's number, which stamps each row filled.
  Value seq;

  UnpackEmitter(Kernel &k, LayerKernels &layer, EpDispatchRecvOp op,
                const EpShape &shape)
      : k(k), e(k.e), r(k), shape(shape), l(shape.recv()), ranks(shape.ranks),
        topK(shape.topK), hidden(shape.hidden), local(shape.localExperts),
        maxTokens(shape.maxTokens),
        quantized(!op.getQuantized().empty() && !op.getWeights()),
        weighted(op.getWeights()), step(isTrainingStep(op)),
        i32(k.b.getI32Type()) {
    counts = k.view(0, layer.info(op.getTokensPerExpert()));
    offsets = k.view(1, layer.info(op.getExpertOffsets()));
    dispatched = k.view(2, layer.info(op.getDispatched()));
    origin = k.view(3, layer.info(op.getOrigin()));
    st = k.func.getArgument(4);
    rowScales =
        quantized ? k.view(5, layer.info(op.getQuantized()[0])) : Value();
    rowWeights =
        weighted ? k.view(5, layer.info(op.getQuantized()[0])) : Value();
    tid = k.threadId();
    block = k.blockId(gpu::Dimension::x);
    arrived = k.workgroupBuffer({ranks}, i32);
    claimed = k.workgroupBuffer({ranks}, i32);
    chosen = k.workgroupBuffer({ranks * local}, i32);
    bases = k.workgroupBuffer({ranks * local}, i32);
    ends = k.workgroupBuffer({local}, i32);
    filled = k.workgroupBuffer({ranks}, i32);
    dropped = k.workgroupBuffer({ranks}, i32);
    firsts = k.workgroupBuffer({ranks + 1}, i32);
  }

  std::pair<Value, Value> splitSource(Value x) {
    return {e.divUI(x, local), e.remUI(x, local)};
  }
  Value countOf(Value q, Value ql) {
    return e.loadRaw(chosen, {e.iadd(e.imul(q, e.index(local)), ql)});
  }
  /// Where expert x's rows start: the end of the experts before it.
  Value startOf(Value x) {
    Value before = e.loadRaw(
        ends, {e.select(e.eq(x, e.index(0)), x, e.isub(x, e.index(1)))});
    return e.select(e.eq(x, e.index(0)), e.i32(0), before);
  }

  void loadCounts();
  void layOut();
  Value countRecords();
  std::tuple<Value, Value, Value> recordOf(Value nth, Value mine);
  void findRows(Value rowsHere, Value chunkStart, Value mine);
  void copyChunk(Value rowsHere, Value chunkStart, Value inChunk, Value mine);
  void countFills();
  void emit();
};
} // namespace

/// What the wait found, and each rank's choices per expert (head of its
/// region), checked against its record count: `chosen` and `claimed` hold
/// only what can be placed.
void UnpackEmitter::loadCounts() {
  e.ifThen(e.ult(tid, e.index(ranks)), [&] {
    e.storeRaw(
        r.load(i32, EpShape::perRank(r, st, EpDeviceLayout::kRecvCounts, tid)),
        arrived, {tid});
    e.storeRaw(e.i32(0), claimed, {tid});
    e.storeRaw(e.i32(0), filled, {tid});
    e.storeRaw(e.i32(0), dropped, {tid});
  });
  gpu::BarrierOp::create(e.b, e.loc);
  e.forEach(
      tid, e.index(ranks * local),
      [&](Value x) {
        auto [q, ql] = splitSource(x);
        Value n = e.loadRaw(arrived, {q});
        Value c =
            r.load(i32, r.at(shape.region(r, st, q), r.mul(r.to64(ql), 4)));
        // One choice of an expert a token at most.
        c = e.select(e.icmp(arith::CmpIPredicate::ugt, c, n), e.i32(0), c);
        c = e.select(e.icmp(arith::CmpIPredicate::slt, n, e.i32(0)), e.i32(0),
                     c);
        e.storeRaw(c, chosen, {x});
        memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi, c,
                                    claimed, ValueRange{q});
      },
      e.index(kCopyThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  // A rank claiming more than topK choices a record gives nothing: no
  // counts, no records.
  auto insane = [&](Value q) {
    Value n = e.loadRaw(arrived, {q});
    return e.icmp(
        arith::CmpIPredicate::ugt, e.loadRaw(claimed, {q}),
        e.imul(e.select(e.icmp(arith::CmpIPredicate::slt, n, e.i32(0)),
                        e.i32(0), n),
               e.i32(topK)));
  };
  e.forEach(
      tid, e.index(ranks * local),
      [&](Value x) {
        e.ifThen(insane(splitSource(x).first),
                 [&] { e.storeRaw(e.i32(0), chosen, {x}); });
      },
      e.index(kCopyThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.ult(tid, e.index(ranks)), [&] {
    e.ifThen(insane(tid), [&] {
      e.storeRaw(e.i32(-1), arrived, {tid});
      e.storeRaw(e.i32(0), claimed, {tid});
      // Its records find no rows: the combine send fails it.
      e.ifThen(e.eq(block, e.index(0)), [&] {
        r.atomicAddRelaxed(shape.rowCheck(r, st, 1, tid), e.i32(1));
      });
    });
  });
  gpu::BarrierOp::create(e.b, e.loc);
}

/// The experts' rows: expert x's are its ranks' choices in rank order.
/// Block 0 also gives the counts, offsets and rows owed each rank (for the
/// combine send and the proxy).
void UnpackEmitter::layOut() {
  loadCounts();
  // Per expert: each rank's place among its choices, and their total.
  e.forEach(
      tid, e.index(local),
      [&](Value x) {
        Value total = e.reduce(
            e.index(0), e.index(ranks), {e.i32(0)},
            [&](Value q, ValueRange acc) -> SmallVector<Value> {
              e.storeRaw(acc[0], bases, {e.iadd(e.imul(q, e.index(local)), x)});
              return {e.iadd(acc[0], countOf(q, x))};
            })[0];
        e.storeRaw(total, ends, {x});
      },
      e.index(kCopyThreads));
  gpu::BarrierOp::create(e.b, e.loc);
  scanInPlace(k, ends, local);
  e.forEach(
      tid, e.index(ranks * local),
      [&](Value x) {
        e.storeRaw(
            e.iadd(e.loadRaw(bases, {x}), startOf(splitSource(x).second)),
            bases, {x});
      },
      e.index(kCopyThreads));
  e.ifThen(e.eq(block, e.index(0)), [&] {
    e.forEach(
        tid, e.index(local),
        [&](Value x) {
          Value start = startOf(x);
          e.storeRaw(e.isub(e.loadRaw(ends, {x}), start), counts, {x});
          e.storeRaw(start, offsets, {x});
        },
        e.index(kCopyThreads));
    e.ifThen(e.eq(tid, e.index(0)), [&] {
      e.storeRaw(e.loadRaw(ends, {e.index(local - 1)}), offsets,
                 {e.index(local)});
    });
    e.forEach(
        tid, e.index(ranks),
        [&](Value q) {
          r.store(e.loadRaw(claimed, {q}),
                  EpShape::perRank(r, st, EpDeviceLayout::kReturnRows, q));
        },
        e.index(kCopyThreads));
  });
  gpu::BarrierOp::create(e.b, e.loc);
}

/// Where each rank's arrived records start among all of them (`firsts`),
/// and their total: the blocks stride over those alone, not over every
/// rank's capacity (a decode step's few records would leave most blocks
/// walking empty slots).
Value UnpackEmitter::countRecords() {
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Value running = e.i32(0);
    for (int64_t q = 0; q < ranks; ++q) {
      e.storeRaw(running, firsts, {e.index(q)});
      Value n = e.loadRaw(arrived, {e.index(q)});
      running = e.iadd(running,
                       e.select(e.icmp(arith::CmpIPredicate::sgt, n, e.i32(0)),
                                n, e.i32(0)));
    }
    e.storeRaw(running, firsts, {e.index(ranks)});
  });
  gpu::BarrierOp::create(e.b, e.loc);
  Value total = e.toIndex(e.loadRaw(firsts, {e.index(ranks)}));
  lastRecord =
      e.select(e.eq(total, e.index(0)), total, e.isub(total, e.index(1)));
  return total;
}

/// Record `nth` of the block's `mine` (block b takes arrived records b,
/// b + grid, ...; record p is the rank's whose records start last at or
/// before p): its source, its address and whether it is one.
std::tuple<Value, Value, Value> UnpackEmitter::recordOf(Value nth, Value mine) {
  Value p = e.toI32(
      e.minUI(e.iadd(block, e.imul(nth, e.index(kStrideBlocks))), lastRecord));
  // The last rank whose records start at or before p (a rank with none
  // starts where the next one does).
  Value q = e.index(0);
  for (int64_t step = llvm::PowerOf2Ceil(ranks) / 2; step >= 1; step /= 2) {
    Value next = e.iadd(q, e.index(step));
    Value in = e.ult(next, e.index(ranks));
    Value start = e.loadRaw(firsts, {e.select(in, next, q)});
    q = e.select(e.andi(in, e.icmp(arith::CmpIPredicate::sle, start, p)), next,
                 q);
  }
  Value i = e.toIndex(e.isub(p, e.loadRaw(firsts, {q})));
  return {q, shape.record(r, st, q, i), e.ult(nth, mine)};
}

/// A thread per record of the chunk and choice: the choice's row here
/// (-1: none) into `rowsHere`, and where its output returns to `origin`.
void UnpackEmitter::findRows(Value rowsHere, Value chunkStart, Value mine) {
  // A training step's rows are its saved tensors', sized for every rank
  // passing this rank's count.
  Value capacity = step ? e.toI32(e.imul(k.tokens, e.index(ranks * topK)))
                        : e.i32(ranks * maxTokens * topK);
  // A chunk is kCopyThreads / topK records: threads past its entries
  // (topK not dividing the block) find nothing.
  auto [q, record, came] =
      recordOf(e.iadd(chunkStart, e.divUI(tid, topK)), mine);
  Value inChunk = e.ult(tid, e.index(kCopyThreads / topK * topK));
  Value here = e.andi(inChunk, came);
  Value j4 = r.mul(r.to64(e.remUI(tid, topK)), 4);
  Value x = r.loadIf(here, i32,
                     r.at(record, r.add(r.c64(l.localIdOffset(0)), j4)), 4);
  Value pos = r.loadIf(here, i32,
                       r.at(record, r.add(r.c64(l.positionOffset(0)), j4)), 4);
  Value xOk =
      e.andi(here, e.andi(e.icmp(arith::CmpIPredicate::sge, x, e.i32(0)),
                          e.icmp(arith::CmpIPredicate::slt, x, e.i32(local))));
  Value xi = e.toIndex(e.select(xOk, x, e.i32(0)));
  Value ok = e.andi(
      xOk, e.andi(e.icmp(arith::CmpIPredicate::sge, pos, e.i32(0)),
                  e.icmp(arith::CmpIPredicate::slt, pos, countOf(q, xi))));
  Value row =
      e.iadd(e.loadRaw(bases, {e.iadd(e.imul(q, e.index(local)), xi)}), pos);
  ok = e.andi(ok, e.icmp(arith::CmpIPredicate::ult, row, capacity));
  e.ifThen(inChunk,
           [&] { e.storeRaw(e.select(ok, row, e.i32(-1)), rowsHere, {tid}); });
  e.ifThen(ok, [&] {
    Value at = e.toIndex(row);
    e.storeRaw(e.toI32(q), origin, {at, e.index(0)});
    e.storeRaw(r.load(i32, r.at(record, r.add(r.c64(l.returnOffset(0)), j4))),
               origin, {at, e.index(1)});
    if (weighted)
      e.storeRaw(r.load(e.b.getF32Type(),
                        r.at(record, r.add(r.c64(l.weightOffset(0)), j4))),
                 rowWeights, {at, e.index(0)});
    // A row counts once however many records name it.
    Value before = r.exchangeRelaxed(shape.rowStamp(r, st, at), seq);
    e.ifThen(e.ne(before, seq), [&] {
      memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi,
                                  e.i32(1), filled, ValueRange{q});
    });
  });
  e.ifThen(e.andi(xOk, e.negate(ok)), [&] {
    memref::AtomicRMWOp::create(e.b, e.loc, arith::AtomicRMWKind::addi,
                                e.i32(1), dropped, ValueRange{q});
  });
}

/// The block's fills and drops into the state's per-rank totals, which
/// the combine send checks against the rows each rank's counts claimed.
void UnpackEmitter::countFills() {
  e.ifThen(e.ult(tid, e.index(ranks)), [&] {
    for (auto [which, counts] : {std::pair{0, filled}, std::pair{1, dropped}}) {
      Value n = e.loadRaw(counts, {tid});
      e.ifThen(e.ne(n, e.i32(0)), [&] {
        r.atomicAddRelaxed(shape.rowCheck(r, st, which, tid), n);
      });
    }
  });
}

/// The chunk's records into their rows: with no barrier between records,
/// each thread loads its vectors of a few records before storing any.
void UnpackEmitter::copyChunk(Value rowsHere, Value chunkStart, Value inChunk,
                              Value mine) {
  Type element = quantized ? Type(e.b.getI8Type()) : Type(e.b.getBF16Type());
  int64_t elementBytes = quantized ? 1 : 2;
  int64_t width = copyWidth(hidden, element);
  int64_t vectors = hidden / width;
  int64_t unroll = std::clamp<int64_t>(kLoadsInFlight * kCopyThreads / vectors,
                                       1, kMaxUnroll);
  int64_t perThread = llvm::divideCeil(unroll * vectors, kCopyThreads);
  unsigned bytes = width * elementBytes;
  auto vec = VectorType::get({width}, element);
  // Record `rec`'s row for choice j (-1: none), `rec` within the chunk.
  auto eachRow = [&](Value rec, function_ref<void(Value)> body) {
    for (int64_t j = 0; j < topK; ++j) {
      Value row =
          e.loadRaw(rowsHere, {e.iadd(e.imul(rec, e.index(topK)), e.index(j))});
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)),
               [&] { body(e.toIndex(row)); });
    }
  };
  e.forEach(
      e.index(0), inChunk,
      [&](Value k0) {
        // Vector n of these records' is record k0 + n / vectors's, at
        // element (n % vectors) * width.
        SmallVector<Value> ks, cs, loaded, values;
        for (int64_t m = 0; m < perThread; ++m) {
          Value n = e.iadd(tid, e.index(m * kCopyThreads));
          Value rec =
              e.iadd(k0, e.minUI(e.divUI(n, vectors), e.index(unroll - 1)));
          auto [q, record, here] = recordOf(e.iadd(chunkStart, rec), mine);
          Value c = e.imul(e.remUI(n, vectors), e.index(width));
          Value load = e.andi(
              e.andi(e.ult(n, e.index(unroll * vectors)), e.ult(rec, inChunk)),
              here);
          ks.push_back(rec);
          cs.push_back(c);
          loaded.push_back(load);
          values.push_back(r.loadIf(load, vec,
                                    r.at(r.at(record, shape.header()),
                                         r.mul(r.to64(c), elementBytes)),
                                    bytes));
        }
        for (int64_t m = 0; m < perThread; ++m)
          e.ifThen(loaded[m], [&] {
            eachRow(ks[m], [&](Value at) {
              vector::StoreOp::create(e.b, e.loc, values[m], dispatched,
                                      {at, cs[m]}, false, llvm::Align(bytes));
            });
          });
      },
      e.index(unroll));
  if (!quantized)
    return;
  // Each record's scales to each of its rows, a thread per scale.
  auto type = cast<MemRefType>(rowScales.getType());
  Type scale = type.getElementType();
  int64_t scaleBytes = scale.getIntOrFloatBitWidth() / 8;
  int64_t scales = type.getDimSize(1);
  e.forEach(
      tid, e.imul(inChunk, e.index(scales)),
      [&](Value n) {
        Value rec = e.divUI(n, scales), sc = e.remUI(n, scales);
        auto [q, record, here] = recordOf(e.iadd(chunkStart, rec), mine);
        Value v = r.loadIf(here, scale,
                           r.at(r.at(record, shape.header() + hidden),
                                r.mul(r.to64(sc), scaleBytes)),
                           scaleBytes);
        eachRow(rec, [&](Value at) { e.storeRaw(v, rowScales, {at, sc}); });
      },
      e.index(kCopyThreads));
}

/// The block's records a chunk at a time: a thread per record and choice
/// finds the rows (in shared memory), then the chunk is copied.
void UnpackEmitter::emit() {
  seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
  layOut();
  int64_t chunk = kCopyThreads / topK;
  Value rowsHere = k.workgroupBuffer({chunk * topK}, i32);
  // This block's records: ceil((arrived - block) / grid), none past them.
  Value total = countRecords();
  Value mine =
      e.select(e.ult(block, total),
               e.divUI(e.iadd(e.isub(total, block), e.index(kStrideBlocks - 1)),
                       e.index(kStrideBlocks)),
               e.index(0));
  e.forEach(
      e.index(0), mine,
      [&](Value chunkStart) {
        findRows(rowsHere, chunkStart, mine);
        gpu::BarrierOp::create(e.b, e.loc);
        copyChunk(rowsHere, chunkStart,
                  e.minUI(e.isub(mine, chunkStart), e.index(chunk)), mine);
        gpu::BarrierOp::create(e.b, e.loc);
      },
      e.index(chunk));
  countFills();
}

static LogicalResult buildEpDispatchUnpack(LayerKernels &layer,
                                           EpDispatchRecvOp op,
                                           const EpShape &shape,
                                           unsigned state) {
  SmallVector<unsigned> buffers = {layer.info(op.getTokensPerExpert()).buffer,
                                   layer.info(op.getExpertOffsets()).buffer,
                                   layer.info(op.getDispatched()).buffer,
                                   layer.info(op.getOrigin()).buffer, state};
  if (!op.getQuantized().empty())
    buffers.push_back(layer.info(op.getQuantized()[0]).buffer);
  Kernel k = layer.kernelOn(op, "ep_dispatch_unpack", buffers);
  k.launch.work = {kStrideBlocks, 0};
  k.launch.block = kCopyThreads;
  UnpackEmitter(k, layer, op, shape).emit();
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
  // Each receiving block lays out the rank's experts with one scan.
  if (local > kCopyThreads)
    return op.emitOpError()
           << "has " << local << " experts a rank; sm_90a layers take at most "
           << kCopyThreads << " a rank";
  EpShape shape(ranks, topK, hidden, local, maxTokens);
  // Every rank's tokens may choose this rank's experts. A training step's
  // rows are saved for its backward: every rank passes the same count.
  TokenLinear capacity = isTrainingStep(op)
                             ? TokenLinear{0, ranks * topK}
                             : TokenLinear{ranks * maxTokens * topK, 0};
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
