//===- ProxyTurn.cpp - the proxy routine of an expert-parallel GPU layer --===//
//
// Generated per layer, so the offsets and sizes of its buffers are
// constants: the runtime's proxy thread (runtime/) calls it in a loop when
// ranks exchange through host memory instead of NVLink.
//
//===----------------------------------------------------------------------===//

#include "codegen/host/Host.h"
#include "codegen/host/HostBuilder.h"

#include "runtime/EpLayout.h"

using namespace mlir;
using namespace mlir::moe;
using host::HostBuilder;

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
///   int32_t moe_ep_proxy_turn(moe_transport_t *transport,
///       uint8_t *state, uint8_t *staging, int32_t self,
///       uint64_t *progress, int32_t timeout_ms)
/// One pass over the peers: what the kernels staged for a peer (its flag
/// raised) is posted to it with RMA writes, and a peer's flag is raised in
/// the state once lib/transport has counted its writes in. `progress`
/// holds six counters per peer between passes. Returns 0 when there was
/// nothing to do, 1 when it did something, 2 when a write failed. The
/// runtime's proxy thread (runtime/EpCudaGroup.cpp) calls it in a loop.
/// With `combineValues` (a layer that trains), a combine also moves the
/// value beside each row (EpLayout::combineValuesOffset): two writes.
LLVM::LLVMFuncOp host::addProxyTurn(ModuleOp module, ExpertParallelAttr ep,
                                    bool combineValues) {
  using ::moe::rt::EpDeviceLayout;
  EpDeviceLayout layout{::moe::rt::EpLayout{ep.getHidden(), ep.getTopK(),
                                            ep.getExperts(), ep.getRanks(),
                                            ep.getMaxTokens()}};
  Location loc = module.getLoc();
  OpBuilder b = OpBuilder::atBlockEnd(module.getBody());
  HostBuilder h(b, loc);
  Type ptr = h.ptr, i64 = h.i64, i32 = h.i32;
  // Internal: the runtime gets its address from init.
  auto turn = LLVM::LLVMFuncOp::create(
      b, loc, "moe_ep_proxy_turn",
      LLVM::LLVMFunctionType::get(i32, {ptr, ptr, ptr, i32, ptr, i32}),
      LLVM::Linkage::Internal);
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
  int64_t values = EpDeviceLayout::kRecv + int64_t(l.combineValuesOffset());
  // Payload writes of a combine that moves rows.
  int64_t combineWrites = combineValues ? 2 : 1;
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
    h.check(h.call(
        RuntimeImport::moe_transport_write,
        {transport, h.c32(q), src, length, dst, h.c32(counterId), timeout}));
  };
  auto arrivals = [&](int64_t q, int64_t counterId) {
    return h.call(RuntimeImport::moe_transport_arrivals,
                  {transport, h.c32(q), h.c32(counterId)});
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
        // The region with its head (the choices per expert; with no
        // records the receiver takes none).
        Value region = add(h.c64(regions), mul(self64, l.regionBytes()));
        ifThen(h, cmp(LLVM::ICmpPredicate::ne, records, h.c64(0)), [&] {
          write(q, add(h.c64(q * stateBytes), region),
                add(h.c64(int64_t(l.recordsOffset())), mul(records, stride)),
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
        // q's base is q's word: its rows must lie in its combine area. A
        // base that does not fit fails this rank (naming q) and sends q
        // nothing, so q's wait fails too rather than take stale rows.
        Value fits = cmp(LLVM::ICmpPredicate::ule, add(base, owed),
                         h.c64(l.maxTokens * l.topK));
        ifThen(h, LLVM::XOrOp::create(b, loc, fits, h.c1(true)), [&] {
          auto claim = LLVM::AtomicCmpXchgOp::create(
              b, loc, h.offset(state, h.c64(EpDeviceLayout::kError)), h.c32(0),
              h.c32(EpDeviceLayout::kBadReturn), LLVM::AtomicOrdering::acq_rel,
              LLVM::AtomicOrdering::monotonic);
          ifThen(h, LLVM::ExtractValueOp::create(b, loc, claim.getResult(), 1),
                 [&] {
                   store32(h.c32(q), state, h.c64(EpDeviceLayout::kErrorPeer));
                   store32(LLVM::TruncOp::create(b, loc, i32, base), state,
                           h.c64(EpDeviceLayout::kErrorTokens));
                   store32(LLVM::TruncOp::create(b, loc, i32, owed), state,
                           h.c64(EpDeviceLayout::kErrorOwn));
                 });
        });
        ifThen(h, fits, [&] {
          Value at = add(h.c64(rows), mul(base, rowBytes));
          ifThen(h, cmp(LLVM::ICmpPredicate::ne, owed, h.c64(0)), [&] {
            write(q, add(h.c64(q * stateBytes), at), mul(owed, rowBytes), at,
                  combinePayload);
            if (combineValues) {
              Value from = add(h.c64(values), mul(base, 4));
              write(q, add(h.c64(q * stateBytes), from), mul(owed, 4), from,
                    combinePayload);
            }
          });
          // The count, then the refused word the combine send staged.
          Value countAt = add(myFlag, h.c64(4));
          store32(LLVM::TruncOp::create(b, loc, i32, owed), stage, countAt);
          write(q, add(h.c64(q * stateBytes), countAt), h.c64(8), countAt,
                combineCount);
        });
        LLVM::StoreOp::create(b, loc, done, counter(1, q), 8);
        markDone();
      });
      // Receive: raise q's flags once its writes are all in.
      auto raise = [&](int64_t countId, int64_t payloadId, int64_t got,
                       int64_t gotPayload, int64_t countOffset,
                       int64_t flagOffset, int64_t writes) {
        Value seen = LLVM::LoadOp::create(b, loc, i64, counter(got, q), 8);
        ifThen(
            h, cmp(LLVM::ICmpPredicate::ugt, arrivals(q, countId), seen), [&] {
              Value n = load32(state, h.c64(countOffset));
              Value any = cmp(LLVM::ICmpPredicate::ne, n, h.c32(0));
              Value payloads =
                  LLVM::LoadOp::create(b, loc, i64, counter(gotPayload, q), 8);
              Value arrived =
                  cmp(LLVM::ICmpPredicate::uge, arrivals(q, payloadId),
                      add(payloads, h.c64(writes)));
              Value complete = LLVM::OrOp::create(
                  b, loc, LLVM::XOrOp::create(b, loc, any, h.c1(true)),
                  arrived);
              ifThen(h, complete, [&] {
                LLVM::StoreOp::create(
                    b, loc,
                    add(payloads,
                        mul(LLVM::ZExtOp::create(b, loc, i64, any), writes)),
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
            slots + 16 * q + 12, 1);
      raise(combineCount, combinePayload, 4, 5, flags + 16 * q + 4,
            flags + 16 * q, combineWrites);
    });
  }
  LLVM::ReturnOp::create(b, loc,
                         LLVM::LoadOp::create(b, loc, i32, did, 4).getResult());
  return turn;
}
