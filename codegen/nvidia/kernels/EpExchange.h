//===- EpExchange.h - what the expert-parallel kernels share ----*- C++ -*-===//
//
// The expert-parallel exchange kernels (EpDispatch.cpp, EpCombine.cpp)
// address raw device memory: their own state and the peers' states
// (runtime/EpLayout.h). Raw emits that addressing and the few PTX
// instructions the protocol needs; EpShape is a layer's exchange
// configuration and where its records and rows lie in a state.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_KERNELS_EPEXCHANGE_H
#define MOE_CODEGEN_NVIDIA_KERNELS_EPEXCHANGE_H

#include "codegen/nvidia/support/KernelBuilder.h"
#include "runtime/EpLayout.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::moe::nvidia::ep {

using ::moe::rt::EpDeviceLayout;
using ::moe::rt::EpLayout;

// Tokens (a thread each) of a dispatch plan block.
constexpr int64_t kPlanThreads = 256;
constexpr int64_t kCopyThreads = 512;
// Blocks of the grid-stride kernels; the combine send counts them done.
constexpr int64_t kStrideBlocks = sm90a::kTwoBlocksEach;
// 16-byte loads a thread of a copy kernel has in flight (one row a block
// at a time left the loads latency-bound).
constexpr int64_t kLoadsInFlight = 4;
// Records an unpack block loads at once, at most (small rows).
constexpr int64_t kMaxUnroll = 8;

/// Byte addressing of raw pointers (the state, the peers' states) inside a
/// kernel, and the few PTX instructions the protocol needs.
struct Raw {
  Kernel &k;
  OpBuilder &b;
  Emitter &e;
  Location loc;
  Type ptr, i8, i32, i64;
  explicit Raw(Kernel &k)
      : k(k), b(k.b), e(k.e), loc(k.e.loc),
        ptr(LLVM::LLVMPointerType::get(k.b.getContext())), i8(k.b.getI8Type()),
        i32(k.b.getI32Type()), i64(k.b.getI64Type()) {}

  Value c64(int64_t v) {
    return arith::ConstantOp::create(b, loc, b.getI64IntegerAttr(v));
  }
  Value c32(int64_t v) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(v));
  }
  Value to64(Value v) {
    if (v.getType().isIndex())
      return arith::IndexCastOp::create(b, loc, i64, v);
    if (v.getType() == i32)
      return arith::ExtSIOp::create(b, loc, i64, v);
    return v;
  }
  Value toIndex(Value v) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), v);
  }
  Value at(Value base, Value bytes) {
    return LLVM::GEPOp::create(b, loc, ptr, i8, base, ValueRange{to64(bytes)});
  }
  Value at(Value base, int64_t bytes) { return at(base, c64(bytes)); }
  Value load(Type type, Value p, unsigned align = 4) {
    return LLVM::LoadOp::create(b, loc, type, p, align);
  }
  /// A load where `cond` holds, else zero.
  Value loadIf(Value cond, Type type, Value p, unsigned align) {
    return e.valueIf(cond, type, [&] { return load(type, p, align); });
  }
  Value loadVolatile(Value p) {
    return LLVM::LoadOp::create(b, loc, i32, p, 4, /*isVolatile=*/true);
  }
  void store(Value v, Value p, unsigned align = 4) {
    LLVM::StoreOp::create(b, loc, v, p, align);
  }
  void storeVolatile(Value v, Value p) {
    LLVM::StoreOp::create(b, loc, v, p, 4, /*isVolatile=*/true);
  }
  void ptx(StringRef text) {
    LLVM::InlineAsmOp::create(b, loc, TypeRange{}, ValueRange{}, text,
                              "~{memory}", /*has_side_effects=*/true,
                              /*is_align_stack=*/false,
                              LLVM::tailcallkind::TailCallKind::None,
                              LLVM::AsmDialectAttr(), ArrayAttr());
  }
  /// Orders this thread's earlier stores (to peers too) before its later
  /// ones, as every thread of the system sees them.
  void fenceSystem() { ptx("fence.sc.sys;"); }
  /// Nanoseconds of the global timer.
  Value now() {
    return LLVM::InlineAsmOp::create(b, loc, TypeRange{i64}, ValueRange{},
                                     "mov.u64 $0, %globaltimer;", "=l",
                                     /*has_side_effects=*/true,
                                     /*is_align_stack=*/false,
                                     LLVM::tailcallkind::TailCallKind::None,
                                     LLVM::AsmDialectAttr(), ArrayAttr())
        .getResult(0);
  }
  Value atomicAdd(Value p, Value v) {
    return LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::add, p, v,
                                     LLVM::AtomicOrdering::acq_rel)
        .getResult();
  }
  /// A counter's old value; what it orders is left to the kernel boundary.
  Value atomicAddRelaxed(Value p, Value v) {
    return LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::add, p, v,
                                     LLVM::AtomicOrdering::monotonic)
        .getResult();
  }
  /// The old value at `p`, `v` now there; ordering as atomicAddRelaxed.
  Value exchangeRelaxed(Value p, Value v) {
    return LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::xchg, p, v,
                                     LLVM::AtomicOrdering::monotonic)
        .getResult();
  }
  /// The state of rank `q` (an i64 or index value), as this process maps it.
  Value peer(Value state, Value q) {
    Value slot = at(state, arith::AddIOp::create(
                               b, loc, c64(EpDeviceLayout::kPeers),
                               arith::MulIOp::create(b, loc, to64(q), c64(8))));
    return LLVM::IntToPtrOp::create(b, loc, ptr, load(i64, slot, 8));
  }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value mul(Value x, int64_t y) {
    return mul(x, x.getType() == i32 ? c32(y) : c64(y));
  }
  Value cmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }

  /// Spins until the i32 at `flag` equals `expected` or `limitNs` passed;
  /// true when it ran out of time.
  Value spinUntil(Value flag, Value expected, Value limitNs) {
    Value start = now();
    Type i1 = b.getI1Type();
    auto loop = scf::WhileOp::create(
        b, loc, TypeRange{i1},
        ValueRange{arith::ConstantOp::create(b, loc, b.getBoolAttr(false))});
    {
      Block *before = b.createBlock(&loop.getBefore(), {}, {i1}, {loc});
      b.setInsertionPointToStart(before);
      Value arrived =
          cmp(arith::CmpIPredicate::eq, loadVolatile(flag), expected);
      Value late = cmp(arith::CmpIPredicate::ugt,
                       arith::SubIOp::create(b, loc, now(), start), limitNs);
      Value notArrived = arith::XOrIOp::create(
          b, loc, arrived,
          arith::ConstantOp::create(b, loc, b.getBoolAttr(true)));
      Value again = arith::AndIOp::create(
          b, loc, notArrived,
          arith::XOrIOp::create(
              b, loc, late,
              arith::ConstantOp::create(b, loc, b.getBoolAttr(true))));
      Value timedOut = arith::AndIOp::create(b, loc, late, notArrived);
      scf::ConditionOp::create(b, loc, again, ValueRange{timedOut});
    }
    {
      Block *after = b.createBlock(&loop.getAfter(), {}, {i1}, {loc});
      b.setInsertionPointToStart(after);
      scf::YieldOp::create(b, loc, after->getArguments());
    }
    b.setInsertionPointAfter(loop);
    return loop.getResult(0);
  }
  /// The wait limit: none once a wait has run out of time (the group is
  /// broken, and every later forward should fail fast, not wait again).
  Value waitLimit(Value state) {
    Value limit = load(i64, at(state, EpDeviceLayout::kTimeoutNs), 8);
    Value broken = cmp(arith::CmpIPredicate::ne,
                       load(i32, at(state, EpDeviceLayout::kError)), c32(0));
    return arith::SelectOp::create(b, loc, broken, c64(0), limit);
  }
  /// Records that a wait for rank `q` ran out of time, unless a failure
  /// was recorded before (that one names the rank that failed first).
  void recordTimeout(Value state, Value q) {
    recordError(state, EpDeviceLayout::kTimedOut, q);
  }
  /// Records failure `kind` concerning rank `q` unless one was recorded
  /// before; `body` then adds its details.
  void recordError(Value state, EpDeviceLayout::ErrorKind kind, Value q,
                   function_ref<void()> body = {}) {
    // The thread that claims the word writes the details.
    auto claim = LLVM::AtomicCmpXchgOp::create(
        b, loc, at(state, EpDeviceLayout::kError), c32(0), c32(kind),
        LLVM::AtomicOrdering::acq_rel, LLVM::AtomicOrdering::monotonic);
    Value first = LLVM::ExtractValueOp::create(b, loc, claim.getResult(), 1);
    e.ifThen(first, [&] {
      store(arith::TruncIOp::create(b, loc, i32, to64(q)),
            at(state, EpDeviceLayout::kErrorPeer));
      if (body)
        body();
    });
  }
};

/// What the kernels of one layer's exchanges share.
struct EpShape {
  int64_t ranks, topK, hidden, localExperts, maxTokens;
  EpDeviceLayout layout;
  EpShape(int64_t ranks, int64_t topK, int64_t hidden, int64_t localExperts,
          int64_t maxTokens)
      : ranks(ranks), topK(topK), hidden(hidden), localExperts(localExperts),
        maxTokens(maxTokens), layout{EpLayout{hidden, topK,
                                              ranks * localExperts, ranks,
                                              maxTokens}} {}
  const EpLayout &recv() const { return layout.recvLayout; }
  int64_t stride() const { return int64_t(recv().maxRecordBytes()); }
  int64_t header() const { return int64_t(recv().headerBytes()); }
  /// Rank q's word of the per-rank control array at `offset` of `state`
  /// (EpDeviceLayout::kSentCounts and the like).
  static Value perRank(Raw &r, Value state, size_t offset, Value q) {
    return r.at(state, r.add(r.c64(int64_t(offset)), r.mul(r.to64(q), 4)));
  }
  /// Source `src`'s count slot in the state of its receiver `base`:
  /// records, first return row, the source's token count, the forward's
  /// number once all is in.
  Value countSlot(Raw &r, Value base, Value src) const {
    return r.at(base,
                r.add(r.c64(EpDeviceLayout::kRecv), r.mul(r.to64(src), 16)));
  }
  /// Where source `src`'s dispatch region starts in the state of its
  /// receiver `base`: the source's choices per local expert, then records.
  Value region(Raw &r, Value base, Value src) const {
    return r.at(base, r.add(r.c64(int64_t(EpDeviceLayout::kRecv +
                                          recv().dispatchOffset())),
                            r.mul(r.to64(src), int64_t(recv().regionBytes()))));
  }
  /// Where source `src`'s record `index` starts in the state of its
  /// receiver `base`.
  Value record(Raw &r, Value base, Value src, Value index) const {
    return r.at(region(r, base, src),
                r.add(r.c64(int64_t(recv().recordsOffset())),
                      r.mul(r.to64(index), stride())));
  }
  /// Where token `t`'s record index for rank `q` is kept in `state`.
  Value recordIndexSlot(Raw &r, Value state, Value t, Value q) const {
    Value index = r.add(r.mul(r.to64(t), ranks), r.to64(q));
    return r.at(state,
                r.add(r.c64(int64_t(layout.recordIndex())), r.mul(index, 4)));
  }
  Value recordIndexSlot(Raw &r, Value state, Value t, int64_t q) const {
    return recordIndexSlot(r, state, t, r.c64(q));
  }
  /// Where choice `j` of token `t` keeps its place among this rank's
  /// choices of the same expert.
  Value positionSlot(Raw &r, Value state, Value t, Value j) const {
    Value index = r.add(r.mul(r.to64(t), topK), r.to64(j));
    return r.at(
        state, r.add(r.c64(int64_t(layout.choicePosition())), r.mul(index, 4)));
  }
  /// This rank's count of its tokens' choices of expert `x` (of all).
  Value expertChoices(Raw &r, Value state, Value x) const {
    return r.at(state, r.add(r.c64(int64_t(layout.expertChoices())),
                             r.mul(r.to64(x), 4)));
  }
  int64_t combineRows() const {
    return int64_t(EpDeviceLayout::kRecv + recv().combineOffset());
  }
  /// The forward that last wrote receive row `row` of `state`.
  Value rowStamp(Raw &r, Value state, Value row) const {
    return r.at(state, r.add(r.c64(int64_t(layout.rowStamps())),
                             r.mul(r.to64(row), 4)));
  }
  /// Source `q`'s rows filled (`which` 0) or choices that found no row
  /// (1) this forward, in `state`.
  Value rowCheck(Raw &r, Value state, int64_t which, Value q) const {
    return r.at(state,
                r.add(r.c64(int64_t(layout.rowChecks()) + 4 * ranks * which),
                      r.mul(r.to64(q), 4)));
  }
  /// Rank `src`'s combine flag (16 bytes) in the state `base`.
  Value combineFlag(Raw &r, Value base, Value src) const {
    return r.at(base, r.add(r.c64(int64_t(layout.combineFlags())),
                            r.mul(r.to64(src), 16)));
  }
};

/// One block, a thread per rank: spins until rank q's flag (`flagOf(q)`,
/// an i32 in `state`) carries this forward's number or the time limit
/// passes, recording which rank it waited for; then `after(q, late)`.
inline void waitForRanks(Kernel &k, Value state, int64_t ranks,
                         function_ref<Value(Raw &, Value)> flagOf,
                         function_ref<void(Raw &, Value, Value)> after) {
  k.launch.work = {1, 0};
  k.launch.block = EpDeviceLayout::kMaxRanks;
  Raw r(k);
  Value tid = k.threadId();
  Value seq = r.load(r.i32, r.at(state, EpDeviceLayout::kSeq));
  Value limit = r.waitLimit(state);
  r.e.ifThen(r.e.ult(tid, r.e.index(ranks)), [&] {
    Value late = r.spinUntil(flagOf(r, tid), seq, limit);
    r.ptx("fence.acq_rel.sys;");
    r.e.ifThen(late, [&] { r.recordTimeout(state, tid); });
    if (after)
      after(r, tid, late);
  });
}

/// A training step's function (moe-differentiate's forward or backward),
/// whose ranks pass the same token count.
inline bool isTrainingStep(Operation *op) {
  auto func = op->getParentOfType<func::FuncOp>();
  return func && (func->hasAttr("moe.saved") || func->hasAttr("moe.gradients"));
}

/// Refuses rows the exchange cannot move: other elements than bf16 or
/// E4M3, rows not a whole number of 8 elements (bf16 moves in 16-byte
/// vectors, E4M3 in 16 or 8), too many ranks.
inline LogicalResult checkEpShape(Operation *op, int64_t hidden, Type element,
                                  int64_t ranks) {
  if (!element.isBF16() && !isa<Float8E4M3FNType>(element))
    return op->emitOpError() << "moves " << element
                             << " rows between ranks; sm_90a layers exchange "
                                "bf16 or E4M3 rows";
  if (hidden % 8 != 0)
    return op->emitOpError()
           << "moves rows of hidden size " << hidden
           << " between GPUs in 16-byte vectors: the hidden size must be a "
              "multiple of 8";
  if (ranks > EpDeviceLayout::kMaxRanks)
    return op->emitOpError() << "has " << ranks << " ranks; at most "
                             << EpDeviceLayout::kMaxRanks << " are supported";
  return success();
}

/// Elements of a copy step: a 16-byte vector where a row is whole ones.
inline int64_t copyWidth(int64_t hidden, Type element) {
  int64_t wide = 128 / element.getIntOrFloatBitWidth();
  return hidden % wide == 0 ? wide : 8;
}

/// Copies a row of `hidden` elements of `element` (bf16, or E4M3 codes as
/// i8) between a memref row and raw bytes, copyWidth elements per thread
/// and step.
inline void copyRow(Raw &r, Value tid, int64_t hidden, Type element,
                    function_ref<void(Value c, VectorType type)> body) {
  int64_t width = copyWidth(hidden, element);
  auto vec = VectorType::get({width}, element);
  r.e.forEach(
      r.e.imul(tid, width), r.e.index(hidden), [&](Value c) { body(c, vec); },
      r.e.index(kCopyThreads * width));
}

/// Blocks stride over items [0, end), `unroll` at a time: `body` gets each
/// item's index (clamped into range) and whether it is in range.
inline void
strideRows(Raw &r, Value block, Value end, int64_t unroll,
           function_ref<void(ArrayRef<Value>, ArrayRef<Value>)> body) {
  Emitter &e = r.e;
  Value grid = e.index(kStrideBlocks);
  e.forEach(
      block, end,
      [&](Value base) {
        SmallVector<Value> items, in;
        for (int64_t u = 0; u < unroll; ++u) {
          Value p = e.iadd(base, e.imul(grid, e.index(u)));
          in.push_back(e.ult(p, end));
          items.push_back(e.select(in.back(), p, base));
        }
        body(items, in);
      },
      e.index(kStrideBlocks * unroll));
}

} // namespace mlir::moe::nvidia::ep

#endif // MOE_CODEGEN_NVIDIA_KERNELS_EPEXCHANGE_H
