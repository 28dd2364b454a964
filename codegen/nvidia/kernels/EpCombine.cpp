//===- EpCombine.cpp - returning expert outputs to their tokens' ranks ----===//
//
// moe.ep_combine_send and moe.ep_combine_recv on sm_90a: the rows a rank's
// experts computed go back, over NVLink, into the states of the ranks whose
// tokens they serve (runtime/EpLayout.h), at the return rows the dispatch
// gave them. As in EpDispatch.cpp, the last block of the send raises each
// peer's flag after system-scope fences, and the receiver spins on it with
// a time limit.
//
//  send  every output row to its token's rank, blocks striding over rows.
//  wait  one block: a thread per rank waits for its flag.
//
//===----------------------------------------------------------------------===//

#include "codegen/nvidia/kernels/EpExchange.h"
#include "codegen/nvidia/kernels/Kernels.h"

#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;
using namespace mlir::moe::nvidia::ep;

LogicalResult nvidia::buildEpCombineSend(LayerKernels &layer,
                                         EpCombineSendOp op) {
  auto outType = cast<RankedTensorType>(op.getExpertOut().getType());
  int64_t ranks = cast<RankedTensorType>(op.getSent().getType()).getDimSize(0);
  int64_t hidden = outType.getDimSize(1);
  if (failed(checkEpShape(op, hidden, outType.getElementType(), ranks)))
    return failure();
  auto recv = op.getOrigin().getDefiningOp<EpDispatchRecvOp>();
  auto send = recv ? recv.getSent().getDefiningOp<EpDispatchSendOp>()
                   : EpDispatchSendOp();
  if (!send)
    return op.emitOpError() << "must return rows that a moe.ep_dispatch_recv "
                               "of the same function gave";
  int64_t topK = cast<RankedTensorType>(send.getRows().getType()).getDimSize(1);
  EpShape shape(ranks, topK, hidden, send.getLocalExperts(), layer.epMaxTokens);
  layer.define(op.getSent(), {});
  unsigned state = layer.epState();
  // Each row to its token's rank, blocks striding over the rows that
  // arrived; the last block done raises every rank's flag.
  SmallVector<unsigned> buffers = {layer.info(op.getExpertOut()).buffer,
                                   layer.info(op.getOrigin()).buffer,
                                   layer.info(recv.getExpertOffsets()).buffer,
                                   layer.info(op.getSent()).buffer, state};
  if (op.getValues())
    buffers.push_back(layer.info(op.getValues()).buffer);
  Kernel k = layer.kernelOn(op, "ep_combine_send", buffers);
  k.launch.work = {kStrideBlocks, 0};
  k.launch.block = kCopyThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value out = k.view(0, layer.info(op.getExpertOut()));
  Value origin = k.view(1, layer.info(op.getOrigin()));
  Value offsets = k.view(2, layer.info(recv.getExpertOffsets()));
  Value sent = k.view(3, layer.info(op.getSent()));
  Value st = k.func.getArgument(4);
  Value values =
      op.getValues() ? k.view(5, layer.info(op.getValues())) : Value();
  Type i32 = e.b.getI32Type();
  Value tid = k.threadId();
  Value seq = r.load(i32, r.at(st, EpDeviceLayout::kSeq));
  Value rows = e.toIndex(e.loadRaw(offsets, {e.index(send.getLocalExperts())}));
  strideRows(
      r, k.blockId(gpu::Dimension::x), rows, kLoadsInFlight,
      [&](ArrayRef<Value> items, ArrayRef<Value> in) {
        SmallVector<Value> dsts, sending;
        int64_t valuesAt =
            int64_t(EpDeviceLayout::kRecv + shape.recv().combineValuesOffset());
        for (auto [row, inRange] : llvm::zip_equal(items, in)) {
          Value q = e.loadRaw(origin, {row, e.index(0)});
          Value back = e.loadRaw(origin, {row, e.index(1)});
          // The row came from q's record: a return row or rank outside the
          // combine area (a corrupt record) is dropped, never written.
          Value inBounds = e.andi(
              e.andi(e.icmp(arith::CmpIPredicate::sge, back, e.i32(0)),
                     e.icmp(arith::CmpIPredicate::slt, back,
                            e.i32(shape.maxTokens * topK))),
              e.andi(e.icmp(arith::CmpIPredicate::sge, q, e.i32(0)),
                     e.icmp(arith::CmpIPredicate::slt, q, e.i32(ranks))));
          // A row no record of this forward filled (its source's counts
          // claimed more than its records) has a stale origin: not sent.
          Value fresh = e.eq(r.load(i32, shape.rowStamp(r, st, row)), seq);
          inBounds = e.andi(e.andi(inRange, fresh), inBounds);
          Value qi = e.select(inBounds, q, e.i32(0));
          Value backi = e.select(inBounds, back, e.i32(0));
          dsts.push_back(
              r.at(r.peer(st, qi), r.add(r.c64(shape.combineRows()),
                                         r.mul(r.to64(backi), 2 * hidden))));
          sending.push_back(inBounds);
          // The row's value (its routing weight's gradient) beside it.
          if (values)
            e.ifThen(e.andi(inBounds, e.eq(tid, e.index(0))), [&] {
              r.store(e.loadRaw(values, {row, e.index(0)}),
                      r.at(r.peer(st, qi),
                           r.add(r.c64(valuesAt), r.mul(r.to64(backi), 4))));
            });
        }
        // Every row's loads first, then the stores.
        copyRow(
            r, tid, hidden, r.b.getBF16Type(), [&](Value c, VectorType vec) {
              SmallVector<Value> values;
              for (auto [row, ok] : llvm::zip_equal(items, sending))
                values.push_back(e.valueIf(ok, vec, [&] {
                  return vector::LoadOp::create(
                             e.b, e.loc, vec, out, {row, c}, false,
                             vectorAlign(8, vec.getElementType()))
                      .getResult();
                }));
              for (auto [v, dst, ok] : llvm::zip_equal(values, dsts, sending))
                e.ifThen(ok, [&] {
                  r.store(v, r.at(dst, r.mul(r.to64(c), 2)), 16);
                });
            });
      });
  r.fenceSystem();
  gpu::BarrierOp::create(e.b, e.loc);
  e.ifThen(e.eq(tid, e.index(0)), [&] {
    Value done = r.atomicAdd(r.at(st, EpDeviceLayout::kTicket2), e.i32(1));
    e.ifThen(e.eq(done, e.i32(kStrideBlocks - 1)), [&] {
      r.store(e.i32(0), r.at(st, EpDeviceLayout::kTicket2));
      Value self = r.load(i32, r.at(st, EpDeviceLayout::kRank));
      // A backward whose rows were not computed (its step failed here)
      // raises no flag: its peers then fail too, naming this rank, rather
      // than take its rows. Decided before the checks below, whose
      // refusal the peers find beside the flag.
      Value raise =
          arith::ConstantOp::create(e.b, e.loc, e.b.getBoolAttr(true));
      if (layer.skipAfterEpFailure)
        raise = e.eq(r.load(i32, r.at(st, EpDeviceLayout::kError)), e.i32(0));
      // Each rank's rows as its counts claimed them: every one filled once
      // and none of its choices left without a row, else this rank refuses
      // them (and fails) and tells it so beside its flag.
      for (int64_t q = 0; q < ranks; ++q) {
        Value claimed =
            r.load(i32, EpShape::perRank(r, st, EpDeviceLayout::kReturnRows,
                                         r.c64(q)));
        Value filledAt = shape.rowCheck(r, st, 0, r.c64(q));
        Value droppedAt = shape.rowCheck(r, st, 1, r.c64(q));
        Value filled = r.load(i32, filledAt);
        Value bad = e.ori(e.ne(filled, claimed),
                          e.ne(r.load(i32, droppedAt), e.i32(0)));
        e.ifThen(bad, [&] {
          r.recordError(st, EpDeviceLayout::kRowsMismatch, r.c64(q), [&] {
            r.store(claimed, r.at(st, EpDeviceLayout::kErrorTokens));
            r.store(filled, r.at(st, EpDeviceLayout::kErrorOwn));
          });
        });
        r.store(arith::ExtUIOp::create(e.b, e.loc, i32, bad),
                r.at(shape.combineFlag(r, r.peer(st, r.c64(q)), self), 8));
      }
      r.fenceSystem();
      for (int64_t q = 0; q < ranks; ++q) {
        // The rows this rank returned to q (the unpack counted them).
        e.storeRaw(
            r.load(i32, EpShape::perRank(r, st, EpDeviceLayout::kReturnRows,
                                         r.c64(q))),
            sent, {e.index(q)});
        e.ifThen(raise, [&] {
          r.storeVolatile(seq,
                          shape.combineFlag(r, r.peer(st, r.c64(q)), self));
        });
      }
    });
  });
  return k.finish(op);
}

/// The values that came with the rows (a backward's routing weights'
/// gradients), laid out [T, k] by each choice's return row: a thread per
/// choice, 0 for a choice no expert took.
static LogicalResult buildCombineValues(LayerKernels &layer, EpCombineRecvOp op,
                                        const EpShape &shape) {
  int64_t topK = shape.topK;
  layer.define(op.getValues(), {0, 1});
  unsigned arrived = layer.epState(
      int64_t(EpDeviceLayout::kRecv + shape.recv().combineValuesOffset()));
  Kernel k = layer.kernelOn(op, "ep_combine_values",
                            {layer.info(op.getRows()).buffer,
                             layer.info(op.getValues()).buffer, arrived});
  k.launch.work = {0, topK};
  k.launch.perBlock = kCopyThreads;
  k.launch.block = kCopyThreads;
  Emitter &e = k.e;
  Raw r(k);
  Value rows = k.view(0, layer.info(op.getRows()));
  Value values = k.view(1, layer.info(op.getValues()));
  Value from = k.func.getArgument(2);
  Value n = e.iadd(e.imul(k.blockId(gpu::Dimension::x), e.index(kCopyThreads)),
                   k.threadId());
  e.ifThen(e.ult(n, e.imul(k.tokens, e.index(topK))), [&] {
    Value t = e.divUI(n, topK), j = e.remUI(n, topK);
    Value row = e.loadRaw(rows, {t, j});
    // The plan gave return rows among this call's choices; the bound keeps
    // a bad one inside them all the same.
    Value ok = e.andi(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)),
                      e.icmp(arith::CmpIPredicate::slt, row,
                             e.toI32(e.imul(k.tokens, e.index(topK)))));
    Value v =
        r.loadIf(ok, e.b.getF32Type(),
                 r.at(from, r.mul(r.to64(e.select(ok, row, e.i32(0))), 4)), 4);
    e.storeRaw(v, values, {t, j});
  });
  return k.finish(op);
}

LogicalResult nvidia::buildEpCombineRecv(LayerKernels &layer,
                                         EpCombineRecvOp op) {
  int64_t ranks = cast<RankedTensorType>(op.getSent().getType()).getDimSize(0);
  auto rowsType = cast<RankedTensorType>(op.getRows().getType());
  int64_t topK = rowsType.getDimSize(1);
  auto gatheredType = cast<RankedTensorType>(op.getGathered().getType());
  int64_t hidden = gatheredType.getDimSize(1);
  auto send = op.getRows().getDefiningOp<EpDispatchSendOp>();
  if (!send)
    return op.emitOpError() << "must gather rows laid out by a "
                               "moe.ep_dispatch_send of the same function";
  EpShape shape(ranks, topK, hidden, send.getLocalExperts(), layer.epMaxTokens);
  // The rows stay where the peers wrote them.
  layer.bind(op.getGathered(), layer.epState(shape.combineRows()), {0, topK});
  unsigned state = layer.epState();
  Kernel k = layer.kernelOn(op, "ep_combine_wait", {state});
  Value st = k.func.getArgument(0);
  Emitter &e = k.e;
  waitForRanks(
      k, st, ranks,
      [&](Raw &r, Value q) { return shape.combineFlag(r, st, q); },
      [&](Raw &r, Value q, Value late) {
        // A rank that refused this rank's rows (their counts and records
        // disagreed there) says so beside its flag.
        Value refused =
            e.ne(r.load(r.i32, r.at(shape.combineFlag(r, st, q), 8)), e.i32(0));
        e.ifThen(e.andi(refused, e.negate(late)),
                 [&] { r.recordError(st, EpDeviceLayout::kRowsRefused, q); });
      });
  if (failed(k.finish(op)))
    return failure();
  return op.getValues() ? buildCombineValues(layer, op, shape) : success();
}
