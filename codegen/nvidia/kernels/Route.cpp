//===- Route.cpp - the routing kernels ------------------------------------===//
//
// moe.route. A router of bf16 rows takes its product on tensor cores, spread
// over the GPU at any count: for a bucket of few tokens a warp a chunk of
// columns of 16 experts' rows (the chunks' sums go through the workspace),
// else a block sharing each step's rows, a warp all of 16 experts' columns
// for its tokens, adding the same chunk sums in the same order, so both
// choose the same experts with the same weights, bit for bit, whatever the
// bucket or the rank. A warp a token
// then scores and chooses with the selection code the CPU backend runs
// (codegen/common/Numerics.h), its lanes splitting each search (where the
// parts are several and the experts more than 32, a block of warps sums a
// token's parts, a stripe of experts each, before its first warp chooses).
// Other routers compute their logits on CUDA cores (each load of a weight
// serves every token of the block, each load of a token every expert of a
// pass): for many tokens one kernel does both, a block per kRouteTokens
// tokens; a bucket of few tokens spreads the experts over blocks and writes
// the scores to the workspace for the choosing kernel. Both compute each
// logit with the same lanes in the same order.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"
#include "codegen/nvidia/support/Hopper.h"
#include "codegen/nvidia/support/Ring.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

namespace {
constexpr int64_t kRouteWarps = RouteConfig::kWarps,
                  kRouteTokens = RouteConfig::kTokens;

/// The index of the largest `key` among the `eligible` in [lb, ub), ties
/// and NaN keys to the lowest index, -1 if none: Emitter::argmax's contract,
/// with the indices split across the lanes of a warp, every lane of which
/// must run it and gets the result.
Value warpArgmax(Emitter &e, Value lane, Value lb, Value ub,
                 function_ref<Value(Value)> key,
                 function_ref<Value(Value)> eligible) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value none = e.i32(-1);
  // Per lane: its first eligible index, and its best one among eligible
  // non-NaN keys (the first of equal keys).
  auto lanes = e.reduce(
      e.iadd(lb, lane), ub, {none, none, e.f32(0.0)},
      [&](Value x, ValueRange acc) -> SmallVector<Value> {
        Value ok = eligible(x), v = key(x);
        Value x32 = e.toI32(x);
        Value noFirst = e.icmp(arith::CmpIPredicate::slt, acc[0], e.i32(0));
        Value first = e.select(e.andi(ok, noFirst), x32, acc[0]);
        Value isNumber =
            arith::CmpFOp::create(b, loc, arith::CmpFPredicate::ORD, v, v);
        Value noBest = e.icmp(arith::CmpIPredicate::slt, acc[1], e.i32(0));
        Value better =
            e.andi(e.andi(ok, isNumber), e.ori(noBest, e.fgt(v, acc[2])));
        return {first, e.select(better, x32, acc[1]),
                e.select(better, v, acc[2])};
      },
      e.index(32));
  Value first = lanes[0], best = lanes[1], value = lanes[2];
  // Across the lanes, three redux.sync instead of a shuffle tree: the
  // lowest first index (-1 is the largest unsigned), the largest key as an
  // order-preserving integer (-0 added to +0 first, so equal keys are equal
  // integers; 0 is below every key), then the lowest index holding it.
  auto redux = [&](Value v, NVVM::ReduxKind kind) {
    return NVVM::ReduxOp::create(b, loc, v.getType(), v, kind, e.i32(-1))
        .getResult();
  };
  first = redux(first, NVVM::ReduxKind::UMIN);
  Type i32 = b.getI32Type();
  Value bits = arith::BitcastOp::create(b, loc, i32, e.add(value, e.f32(0.0)));
  Value sign = arith::ShRSIOp::create(b, loc, bits, e.i32(31));
  Value order =
      e.xori(bits, e.ori(sign, e.i32(static_cast<int32_t>(0x80000000u))));
  Value has = e.icmp(arith::CmpIPredicate::sge, best, e.i32(0));
  order = e.select(has, order, e.i32(0));
  Value top = redux(order, NVVM::ReduxKind::UMAX);
  best = redux(e.select(e.andi(has, e.eq(order, top)), best, none),
               NVVM::ReduxKind::UMIN);
  // A sequential search keeps a NaN it met first; otherwise it ends on the
  // first of the largest keys.
  Value anyFirst = e.icmp(arith::CmpIPredicate::sge, first, e.i32(0));
  Value firstKey = key(e.toIndex(e.select(anyFirst, first, e.toI32(lb))));
  Value firstIsNaN = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNO,
                                           firstKey, firstKey);
  return e.select(anyFirst, e.select(firstIsNaN, first, best), none);
}

/// term(x) of every expert x in [0, experts), each lane on its stripe,
/// folded by a sum or a maximum (exact in any order) across the warp;
/// every lane gets the result.
Value warpFold(Emitter &e, Value lane, int64_t experts, Value init,
               function_ref<Value(Value)> term, bool isMax) {
  Value v = e.reduce(
      lane, e.index(experts), {init},
      [&](Value x, ValueRange acc) -> SmallVector<Value> {
        Value t = term(x);
        return {isMax ? e.maxf(acc[0], t) : e.add(acc[0], t)};
      },
      e.index(32))[0];
  return warpButterfly(e, v, [&](Value x, Value y) {
    return isMax ? e.maxf(x, y) : e.add(x, y);
  });
}

/// The pieces both route forms share.
struct Router {
  Kernel &k;
  Emitter &e;
  RouterAttr router;
  int64_t experts, h, topK, unroll;

  Router(Kernel &k, RouterAttr router, const RouteConfig &cfg, int64_t unroll)
      : k(k), e(k.e), router(router), experts(cfg.experts), h(cfg.hidden),
        topK(cfg.topK), unroll(unroll) {}

  /// The logits of experts [first, first + unroll) for the tokens of
  /// `rows` (loads clamped into the call's tokens), reduced over the lanes
  /// of a warp; lane 0 gets `emit(p, expert, logit)`. Each logit is summed
  /// in the same order whichever warp, block or kernel computes it.
  void logits(Value hidden, Value weight, ArrayRef<Value> rows, Value first,
              Value lane, function_ref<void(int64_t, Value, Value)> emit) {
    int64_t width = vectorWidth(h);
    Type f32 = e.b.getF32Type();
    auto f32Vec = VectorType::get({width}, f32);
    Value zero = arith::ConstantOp::create(
        e.b, e.loc, DenseElementsAttr::get(f32Vec, e.b.getF32FloatAttr(0)));
    int64_t tokens = rows.size();
    SmallVector<Value> xs, init(tokens * unroll, zero);
    for (int64_t u = 0; u < unroll; ++u)
      xs.push_back(e.iadd(first, e.index(u)));
    // A fixed trip count (lanes past h add zeros), so the loads of
    // several steps can be in flight at once.
    int64_t step = 32 * width;
    int64_t steps = llvm::divideCeil(h, step);
    bool ragged = h % step != 0;
    SmallVector<Value> lanes = e.reduce(
        e.index(0), e.index(steps), init,
        [&](Value s, ValueRange acc) -> SmallVector<Value> {
          Value c = e.iadd(e.imul(s, step), e.imul(lane, width));
          Value inside = ragged ? e.ult(c, e.index(h)) : Value();
          Value at = ragged ? e.minUI(c, e.index(h - width)) : c;
          auto load = [&](Value buffer, Value row) {
            Value v = loadF32Vector(e, buffer, {row, at}, width);
            return inside ? e.select(inside, v, zero) : v;
          };
          SmallVector<Value> w, next;
          for (int64_t u = 0; u < unroll; ++u)
            w.push_back(load(weight, xs[u]));
          for (int64_t p = 0; p < tokens; ++p) {
            Value x = load(hidden, rows[p]);
            for (int64_t u = 0; u < unroll; ++u)
              next.push_back(e.add(acc[p * unroll + u], e.mul(x, w[u])));
          }
          return next;
        });
    for (int64_t p = 0; p < tokens; ++p)
      for (int64_t u = 0; u < unroll; ++u) {
        Value partial = vector::ReductionOp::create(
            e.b, e.loc, vector::CombiningKind::ADD, lanes[p * unroll + u]);
        partial = warpButterfly(e, partial,
                                [&](Value x, Value y) { return e.add(x, y); });
        e.ifThen(e.eq(lane, e.index(0)), [&] { emit(p, xs[u], partial); });
      }
  }

  /// Stores token firstToken + p's logit for expert x into `logits` (the
  /// route's optional result), if that token is the call's.
  void storeLogit(Value logits, Value firstToken, int64_t p, Value count,
                  Value x, Value logit, Value bias) {
    Value t = e.iadd(firstToken, e.index(p));
    e.ifThen(e.ult(t, count), [&] {
      e.storeRaw(common::routerLogit(e, router.getKind(), logit, bias), logits,
                 {t, x});
    });
  }

  /// The warp of `lane` chooses token `t`'s experts from its scratch row.
  void choose(const common::RouteScratch &scratch, Value ids, Value weights,
              Value t, Value lane) {
    auto argmax = [&](Value lb, Value ub, function_ref<Value(Value)> key,
                      function_ref<Value(Value)> eligible) {
      return warpArgmax(e, lane, lb, ub, key, eligible);
    };
    auto single = [&](function_ref<void()> step) {
      e.ifThen(e.eq(lane, e.index(0)), step);
      NVVM::SyncWarpOp::create(e.b, e.loc, e.i32(-1));
    };
    // Softmax over the experts with each lane on its stripe: the maximum
    // is exact in any order, the sum a shuffle tree.
    auto softmax = [&] {
      Value max = warpFold(
          e, lane, experts, e.f32(-INFINITY),
          [&](Value x) { return e.loadRaw(scratch.score, {x}); },
          /*isMax=*/true);
      Value sum = warpFold(
          e, lane, experts, e.f32(0.0),
          [&](Value x) {
            Value p = e.exp(e.sub(e.loadRaw(scratch.score, {x}), max));
            e.storeRaw(p, scratch.score, {x});
            return p;
          },
          /*isMax=*/false);
      e.forEach(
          lane, e.index(experts),
          [&](Value x) {
            Value p = e.div(e.loadRaw(scratch.score, {x}), sum);
            e.storeRaw(p, scratch.score, {x});
            e.storeRaw(p, scratch.choice, {x});
          },
          e.index(32));
      NVVM::SyncWarpOp::create(e.b, e.loc, e.i32(-1));
    };
    auto forExperts = [&](function_ref<void(Value)> body) {
      e.forEach(lane, e.index(experts), body, e.index(32));
      NVVM::SyncWarpOp::create(e.b, e.loc, e.i32(-1));
    };
    common::selectExperts(e, router, experts, topK, scratch, ids, weights, t,
                          {argmax, single, softmax, forExperts});
  }

  /// What a block of kRouteTokens tokens (blocks along x) works on.
  struct TokenBlock {
    Value count, firstToken, warp, lane;
    /// Token rows firstToken + p, clamped into the call's tokens.
    SmallVector<Value> rows;
  };
  /// The block's tokens; a block past the call's tokens exits.
  TokenBlock tokenBlock(TokenLinear tokens) {
    TokenBlock t;
    t.count = k.linear(tokens);
    t.firstToken = e.imul(k.blockId(gpu::Dimension::x), kRouteTokens);
    k.onlyIf(e.ult(t.firstToken, t.count));
    Value last = e.isub(t.count, e.index(1));
    for (int64_t p = 0; p < kRouteTokens; ++p)
      t.rows.push_back(e.minUI(e.iadd(t.firstToken, e.index(p)), last));
    Value tid = k.threadId();
    t.warp = e.divUI(tid, 32);
    t.lane = e.remUI(tid, 32);
    return t;
  }
};

/// Row `r` of a rank-2 buffer as a rank-1 view.
Value rowOf(Emitter &e, Value buffer, Value r) {
  if (!buffer)
    return buffer;
  auto type = cast<MemRefType>(buffer.getType());
  int64_t n = type.getDimSize(1);
  SmallVector<OpFoldResult> offsets = {r, e.b.getIndexAttr(0)};
  SmallVector<OpFoldResult> sizes = {e.b.getIndexAttr(1), e.b.getIndexAttr(n)};
  SmallVector<OpFoldResult> strides = {e.b.getIndexAttr(1),
                                       e.b.getIndexAttr(1)};
  MemRefType rowType = memref::SubViewOp::inferRankReducedResultType(
      {n}, type, offsets, sizes, strides);
  return memref::SubViewOp::create(e.b, e.loc, rowType, buffer, offsets, sizes,
                                   strides);
}

/// Shared scratch for `tokens` tokens' selections.
common::RouteScratch scratchFor(Kernel &k, RouterAttr router, int64_t tokens,
                                int64_t experts, int64_t topK) {
  Type f32 = k.b.getF32Type(), i8 = k.b.getI8Type();
  common::RouteScratch all;
  all.score = k.workgroupBuffer({tokens, experts}, f32);
  all.choice = k.workgroupBuffer({tokens, experts}, f32);
  all.taken = k.workgroupBuffer({tokens, experts}, i8);
  if (router.getNGroup() > 1) {
    all.groupScore = k.workgroupBuffer({tokens, router.getNGroup()}, f32);
    all.groupTaken = k.workgroupBuffer({tokens, router.getNGroup()}, i8);
  }
  all.chosen = k.workgroupBuffer({tokens, topK}, f32);
  return all;
}

common::RouteScratch rowsOf(Emitter &e, const common::RouteScratch &all,
                            Value r) {
  return {rowOf(e, all.score, r),      rowOf(e, all.choice, r),
          rowOf(e, all.taken, r),      rowOf(e, all.groupScore, r),
          rowOf(e, all.groupTaken, r), rowOf(e, all.chosen, r)};
}

/// The router product on tensor cores (mma.sync m16n8k16, bf16 operands,
/// f32 sums): a warp multiplies 16 router rows (A, experts) by 8-token
/// tiles (B) over one chunk of kChunk columns, 32 columns a step. Each lane
/// copies 16 contiguous bytes of a row a step, so the columns a step's two
/// instructions see are a permutation of the step's 32, the same for A and
/// B (a dot product is the same sum in any column order fed the same way).
/// The copies are cp.async into rings `stages` steps deep (loads into
/// registers would be issued just before their products, each step waiting
/// out the memory's latency in turn): a warp's own, where a lane reads back
/// only what it copied, or a block's, shared behind a barrier a step.
struct RouterProduct {
  Emitter &e;
  int64_t experts, h;
  Value tokenCount;
  /// Lane (group g = lane / 4, t = lane % 4).
  Value lane, g, t;
  /// The kernel's pointers to the hidden states and the router weights.
  Value hiddenBase, weightBase;
  AlignedShared &shared;
  /// Where the warp's ring starts in the shared memory, and its depth.
  Value ringOffset;
  int64_t stages;

  /// Ring bytes of a warp taking `tiles` token tiles `stages` deep.
  static int64_t ringBytes(int64_t tiles, int64_t stages) {
    return stages * (2 + tiles) * 32 * 16;
  }

  /// The shared byte offset of row r's slot of step i.
  Value slot(int64_t i, int64_t r, int64_t rows) {
    return e.iadd(ringOffset, e.iadd(e.index(((i % stages) * rows + r) * 512),
                                     e.imul(lane, 16)));
  }

  /// One 16-byte copy of `row` of the buffer at `base` from column k to
  /// shared byte `to`; columns past the row's end are zero (a copy of no
  /// source bytes from a clamped address).
  void copy(Value to, Value base, Value row, Value k) {
    bool ragged = h % RouteConfig::kChunk != 0;
    Value at = ragged ? e.minUI(k, e.index(h - 8)) : k;
    Value size = ragged ? e.select(e.ult(k, e.index(h)), e.i32(16), e.i32(0))
                        : e.i32(16);
    Value offset = arith::IndexCastOp::create(
        e.b, e.loc, e.b.getI64Type(), e.imul(e.iadd(e.imul(row, h), at), 2));
    Value from = LLVM::GEPOp::create(e.b, e.loc, base.getType(),
                                     e.b.getI8Type(), base, ValueRange{offset});
    inlinePtx(e.b, e.loc, {}, {shared.address(to), from, size},
              "cp.async.cg.shared.global [$0], [$1], 16, $2;", "l,l,r");
  }
  void commit() { inlinePtx(e.b, e.loc, {}, {}, "cp.async.commit_group;", ""); }
  void waitFor(int64_t later) {
    inlinePtx(e.b, e.loc, {}, {},
              "cp.async.wait_group " + std::to_string(later) + ";", "");
  }
  /// The four words at shared byte `offset`.
  SmallVector<Value> read(Value offset) {
    Type i32 = e.b.getI32Type();
    Value v = vector::LoadOp::create(e.b, e.loc, VectorType::get({4}, i32),
                                     shared.view(sharedType({4}, i32), offset),
                                     {e.index(0)});
    SmallVector<Value> words;
    for (int64_t j = 0; j < 4; ++j)
      words.push_back(vector::ExtractOp::create(e.b, e.loc, v, j));
    return words;
  }

  /// Step i of a chain of `chunks` chunks: the products of its words `w`
  /// (A's two rows, then each token tile's) into the tiles' fragments,
  /// started from zero at a chunk's first step, and at its last the
  /// chunk's sums added to `sums` in order.
  void step(int64_t i, ArrayRef<SmallVector<Value>> w,
            SmallVector<Value> &frags, SmallVector<Value> &sums) {
    MLIRContext *ctx = e.b.getContext();
    Type f32 = e.b.getF32Type();
    auto fragment = LLVM::LLVMStructType::getLiteral(ctx, {f32, f32, f32, f32});
    std::array<NVVM::MMATypes, 2> types = {NVVM::MMATypes::bf16,
                                           NVVM::MMATypes::bf16};
    std::array<NVVM::MMALayout, 2> layouts = {NVVM::MMALayout::row,
                                              NVVM::MMALayout::col};
    int64_t steps = RouteConfig::kChunk / 32;
    int64_t tiles = frags.size();
    if (i % steps == 0)
      for (int64_t n = 0; n < tiles; ++n)
        frags[n] = zeroFragment(e.b, e.loc, fragment);
    for (int64_t half = 0; half < 2; ++half) {
      SmallVector<Value> a = {w[0][2 * half], w[1][2 * half],
                              w[0][2 * half + 1], w[1][2 * half + 1]};
      for (int64_t n = 0; n < tiles; ++n) {
        SmallVector<Value> b = {w[2 + n][2 * half], w[2 + n][2 * half + 1]};
        SmallVector<Value> c;
        for (int64_t j = 0; j < 4; ++j)
          c.push_back(LLVM::ExtractValueOp::create(e.b, e.loc, frags[n],
                                                   ArrayRef<int64_t>{j}));
        frags[n] =
            NVVM::MmaOp::create(e.b, e.loc, fragment, a, b, c, {16, 8, 16},
                                std::nullopt, std::nullopt, types, layouts);
      }
    }
    if (i % steps != steps - 1)
      return;
    for (int64_t n = 0; n < tiles; ++n)
      for (int64_t j = 0; j < 4; ++j) {
        Value v = LLVM::ExtractValueOp::create(e.b, e.loc, frags[n],
                                               ArrayRef<int64_t>{j});
        if (i < steps)
          sums.push_back(v);
        else
          sums[n * 4 + j] = e.add(sums[n * 4 + j], v);
      }
  }

  /// The column of step i's 16 bytes for a lane of group position t.
  Value stepColumn(Value chunk, int64_t i, Value t) {
    int64_t steps = RouteConfig::kChunk / 32;
    return e.iadd(e.imul(chunk, RouteConfig::kChunk),
                  e.iadd(e.imul(t, 8), e.index(i % steps * 32)));
  }

  /// The sums of experts [expert0, expert0 + 16) and `tiles` tiles of 8
  /// tokens from token0 (4 f32 a tile, its C fragment) over chunk `s`, the
  /// warp copying its own rows into its own ring.
  SmallVector<Value> warpProduct(Value s, Value expert0, Value token0,
                                 int64_t tiles) {
    Value lastExpert = e.index(experts - 1);
    Value lastToken = e.isub(tokenCount, e.index(1));
    // Row r of a step: A's two rows (experts g and g + 8), then each token
    // tile's (token g of it); rows past the end clamped to the last.
    SmallVector<std::pair<Value, Value>> rows = {
        {weightBase, e.minUI(e.iadd(expert0, g), lastExpert)},
        {weightBase,
         e.minUI(e.iadd(expert0, e.iadd(g, e.index(8))), lastExpert)}};
    for (int64_t n = 0; n < tiles; ++n)
      rows.push_back(
          {hiddenBase,
           e.minUI(e.iadd(token0, e.iadd(g, e.index(8 * n))), lastToken)});
    int64_t rowCount = rows.size();
    int64_t total = RouteConfig::kChunk / 32;
    auto issue = [&](int64_t i) {
      for (auto [r, row] : llvm::enumerate(rows))
        copy(slot(i, r, rowCount), row.first, row.second, stepColumn(s, i, t));
      commit();
    };
    for (int64_t i = 0; i < std::min(stages, total); ++i)
      issue(i);
    SmallVector<Value> sums, frags(tiles);
    for (int64_t i = 0; i < total; ++i) {
      waitFor(std::min(stages - 1, total - 1 - i));
      SmallVector<SmallVector<Value>> w;
      for (int64_t r = 0; r < rowCount; ++r)
        w.push_back(read(slot(i, r, rowCount)));
      step(i, w, frags, sums);
      // The slot is free once its words are in registers (the products
      // above read them).
      if (i + stages < total)
        issue(i + stages);
    }
    return sums;
  }

  /// The block's product, every chunk in order: its 8 warps take
  /// `expertWarps` tiles of 16 experts from expert0 by `tiles` tiles of 8
  /// tokens a warp from token0; each step's rows are copied
  /// once for the block into a ring of `stages` shared by all, `tid` copying
  /// its share. Returns the warp's sums (its experts and tokens below).
  SmallVector<Value> blockProduct(int64_t chunks, Value expert0, Value token0,
                                  int64_t expertWarps, int64_t tiles,
                                  Value warp, Value tid) {
    int64_t tokenWarps = 8 / expertWarps;
    int64_t rowsA = expertWarps * 16, rowCount = rowsA + tokenWarps * 8 * tiles;
    int64_t stageBytes = rowCount * 64;
    int64_t steps = RouteConfig::kChunk / 32, total = chunks * steps;
    Value lastExpert = e.index(experts - 1);
    Value lastToken = e.isub(tokenCount, e.index(1));
    int64_t copies = rowCount * 4, perThread = llvm::divideCeil(copies, 256);
    // Step `i` of chunk `chunk` into ring slot i mod stages.
    auto issue = [&](Value chunk, int64_t i) {
      for (int64_t c = 0; c < perThread; ++c) {
        Value item = e.iadd(tid, e.index(c * 256));
        Value r = e.divUI(item, 4), seg = e.remUI(item, 4);
        Value to =
            e.iadd(ringOffset, e.iadd(e.index(i % stages * stageBytes),
                                      e.iadd(e.imul(r, 64), e.imul(seg, 16))));
        Value k = stepColumn(chunk, i, seg);
        auto both = [&] {
          Value isA = e.ult(r, e.index(rowsA));
          e.ifThen(isA, [&] {
            copy(to, weightBase, e.minUI(e.iadd(expert0, r), lastExpert), k);
          });
          e.ifThen(e.icmp(arith::CmpIPredicate::uge, r, e.index(rowsA)), [&] {
            copy(to, hiddenBase,
                 e.minUI(e.iadd(token0, e.isub(r, e.index(rowsA))), lastToken),
                 k);
          });
        };
        if ((c + 1) * 256 <= copies)
          both();
        else
          e.ifThen(e.ult(item, e.index(copies)), both);
      }
      commit();
    };
    assert(stages <= steps && "a step's copies run at most a chunk ahead");
    for (int64_t i = 0; i < std::min(stages - 1, total); ++i)
      issue(e.index(i / steps), i % steps);
    Value expertWarp = e.remUI(warp, expertWarps);
    Value tokenWarp = e.divUI(warp, expertWarps);
    SmallVector<Value> rows = {
        e.iadd(e.imul(expertWarp, 16), g),
        e.iadd(e.imul(expertWarp, 16), e.iadd(g, e.index(8)))};
    for (int64_t n = 0; n < tiles; ++n)
      rows.push_back(e.iadd(e.index(rowsA), e.iadd(e.imul(tokenWarp, 8 * tiles),
                                                   e.iadd(e.index(8 * n), g))));
    // Chunk `chunk`'s steps (global steps chunk * steps + i): the first
    // chunk starts the sums, a middle one (in a loop, so the kernel does
    // not grow with K) adds to them, the last waits for fewer copies.
    auto emitChunk = [&](Value chunk, int64_t first, bool middle,
                         SmallVector<Value> &sums) {
      SmallVector<Value> frags(tiles);
      for (int64_t i = 0; i < steps; ++i) {
        int64_t at = first + i;
        // A middle chunk's steps are never among the last stages - 2.
        int64_t later =
            middle ? stages - 2 : std::min(stages - 2, total - 1 - at);
        waitFor(later);
        // Every copy of this step has landed, and every warp is done with
        // the slot of the step before, which the next copies fill.
        gpu::BarrierOp::create(e.b, e.loc);
        int64_t ahead = i + stages - 1;
        if (middle || at + stages - 1 < total)
          issue(e.iadd(chunk, e.index(ahead / steps)), ahead % steps);
        SmallVector<SmallVector<Value>> w;
        for (Value row : rows)
          w.push_back(read(e.iadd(
              ringOffset, e.iadd(e.index(i % stages * stageBytes),
                                 e.iadd(e.imul(row, 64), e.imul(t, 16))))));
        step(first == 0 ? i : steps + i, w, frags, sums);
      }
    };
    SmallVector<Value> sums;
    emitChunk(e.index(0), 0, false, sums);
    if (chunks > 2) {
      auto loop = scf::ForOp::create(e.b, e.loc, e.index(1),
                                     e.index(chunks - 1), e.index(1), sums);
      OpBuilder::InsertionGuard guard(e.b);
      e.b.setInsertionPointToStart(loop.getBody());
      SmallVector<Value> carried(loop.getRegionIterArgs());
      emitChunk(loop.getInductionVar(), steps, true, carried);
      scf::YieldOp::create(e.b, e.loc, carried);
      e.b.setInsertionPointAfter(loop);
      sums.assign(loop.getResults().begin(), loop.getResults().end());
    }
    if (chunks > 1)
      emitChunk(e.index(chunks - 1), (chunks - 1) * steps, false, sums);
    return sums;
  }

  /// Stores the C fragments `acc` of experts [expert0, +16) and `tiles`
  /// token tiles from token0 with store(token, expert, value), skipping
  /// those past the experts and the call's tokens.
  void store(ArrayRef<Value> acc, Value expert0, Value token0, int64_t tiles,
             function_ref<void(Value, Value, Value)> store) {
    for (int64_t n = 0; n < tiles; ++n)
      for (int64_t i = 0; i < 4; ++i) {
        Value x = e.iadd(expert0, e.iadd(g, e.index(8 * (i / 2))));
        Value tok =
            e.iadd(token0, e.iadd(e.imul(t, 2), e.index(8 * n + i % 2)));
        e.ifThen(e.andi(e.ult(x, e.index(experts)), e.ult(tok, tokenCount)),
                 [&] { store(tok, x, acc[n * 4 + i]); });
      }
  }
};
} // namespace

RouteConfig nvidia::configureRoute(RouteOp op, TokenLinear tokens,
                                   int64_t maxTokens, bool expertParallel) {
  RouteConfig c;
  auto weightType = cast<RankedTensorType>(op.getRouterWeight().getType());
  c.experts = weightType.getDimSize(0), c.hidden = weightType.getDimSize(1);
  c.topK = cast<RankedTensorType>(op.getExpertIds().getType()).getDimSize(1);
  c.tokens = tokens;
  // Without buckets an expert-parallel layer's decode call would route on
  // one block reading the whole router; spread, it costs many tokens only
  // the scores' round trip through the workspace. Its buckets spread until
  // the one kernel's blocks of four tokens fill the GPU (DeepSeek-V3 EP2 on
  // H100, a rank's 128 tokens: 79 us spread, 273 us in one kernel; 4096
  // tokens: 2513 us spread, 1365 in one; bench/RESULTS.md).
  int64_t splitTokens =
      expertParallel ? RouteConfig::kSplitTokensEp : RouteConfig::kSplitTokens;
  c.split = maxTokens > 0 ? maxTokens <= splitTokens : expertParallel;
  auto hiddenType = cast<RankedTensorType>(op.getHiddenStates().getType());
  c.tensorCores = weightType.getElementType().isBF16() &&
                  hiddenType.getElementType().isBF16() && c.hidden % 8 == 0;
  if (c.tensorCores) {
    c.chunks = llvm::divideCeil(c.hidden, RouteConfig::kChunk);
    // The split form's partial sums (chunks x experts f32 a token) stay
    // within 64 MiB of workspace and its grid within 65535 blocks on y.
    int64_t gridY =
        llvm::divideCeil(c.experts, 16) * llvm::divideCeil(c.chunks, 4);
    c.split = maxTokens > 0 && maxTokens <= RouteConfig::kProductSplitTokens &&
              maxTokens * c.chunks * c.experts * 4 <= (int64_t(64) << 20) &&
              gridY <= 65535;
  }
  c.unroll = c.experts % (kRouteWarps * 2) == 0 ? 2 : 1;
  c.logitBlocks = llvm::divideCeil(c.experts, kRouteWarps);
  int64_t scratchBytes =
      c.experts * 9 + op.getRouter().getNGroup() * 5 + c.topK * 4 + 64;
  c.selectWarps = std::clamp<int64_t>(sm90a::kSharedWithoutOptIn / scratchBytes,
                                      1, kRouteWarps);
  int64_t stripes = llvm::divideCeil(c.experts, 32);
  if (c.tensorCores && c.split && c.chunks > 1)
    c.sumWarps = std::min<int64_t>(RouteConfig::kWarps, stripes);
  return c;
}

/// Many tokens: one kernel, kRouteTokens tokens a block sharing each load
/// of the router weights.
static LogicalResult buildFusedRoute(LayerKernels &layer, RouteOp op,
                                     const RouteConfig &cfg) {
  RouterAttr router = op.getRouter();
  Value bias = op.getBias();
  int64_t experts = cfg.experts;
  SmallVector<Value> buffers = {op.getHiddenStates(), op.getRouterWeight()};
  if (bias)
    buffers.push_back(bias);
  buffers.append({op.getExpertIds(), op.getWeights()});
  if (op.getLogits())
    buffers.push_back(op.getLogits());
  Kernel k = layer.kernel(op, "route", buffers);
  k.launch.work = cfg.tokens;
  k.launch.perBlock = kRouteTokens;
  k.launch.block = kRouteWarps * 32;
  Emitter &e = k.e;
  SmallVector<Value> views;
  for (auto [i, v] : llvm::enumerate(buffers))
    views.push_back(k.view(i, layer.info(v)));
  Value hidden = views[0], weight = views[1];
  Value biasView = bias ? views[2] : Value();
  unsigned at = bias ? 3 : 2;
  Value ids = views[at], weights = views[at + 1];
  Value logitsView = op.getLogits() ? views[at + 2] : Value();
  Router route(k, op.getRouter(), cfg, cfg.unroll);
  common::RouteScratch all =
      scratchFor(k, router, kRouteTokens, experts, cfg.topK);
  Router::TokenBlock block = route.tokenBlock(cfg.tokens);
  Value count = block.count, firstToken = block.firstToken;
  Value warp = block.warp, lane = block.lane;
  SmallVector<Value> &rows = block.rows;
  // Each warp takes `unroll` experts at a time, every kRouteWarps-th
  // group.
  e.forEach(
      e.imul(warp, route.unroll), e.index(experts),
      [&](Value first) {
        route.logits(hidden, weight, rows, first, lane,
                     [&](int64_t p, Value x, Value logit) {
                       Value b = biasView ? e.load(biasView, {x}) : Value();
                       auto [s, choice] =
                           common::expertScore(e, router.getKind(), logit, b);
                       e.storeRaw(s, all.score, {e.index(p), x});
                       e.storeRaw(choice, all.choice, {e.index(p), x});
                       if (logitsView)
                         route.storeLogit(logitsView, firstToken, p, count, x,
                                          logit, b);
                     });
      },
      e.index(kRouteWarps * route.unroll));
  gpu::BarrierOp::create(e.b, e.loc);
  // Warp p chooses token p's experts.
  Value t = e.iadd(firstToken, warp);
  e.ifThen(e.andi(e.ult(warp, e.index(kRouteTokens)), e.ult(t, count)),
           [&] { route.choose(rowsOf(e, all, warp), ids, weights, t, lane); });
  return k.finish(op);
}

/// Few tokens: the logits kernel takes kRouteWarps experts a block, on y,
/// and stores every token's scores and choice keys.
static LogicalResult buildRouteLogits(LayerKernels &layer, RouteOp op,
                                      const RouteConfig &cfg,
                                      const TensorInfo &scores,
                                      const TensorInfo &choices) {
  RouterAttr router = op.getRouter();
  Value bias = op.getBias();
  SmallVector<unsigned> logitBuffers = {
      layer.info(op.getHiddenStates()).buffer,
      layer.info(op.getRouterWeight()).buffer};
  if (bias)
    logitBuffers.push_back(layer.info(bias).buffer);
  logitBuffers.append({scores.buffer, choices.buffer});
  if (op.getLogits())
    logitBuffers.push_back(layer.info(op.getLogits()).buffer);
  Kernel k = layer.kernelOn(op, "route_logits", logitBuffers);
  k.launch.work = cfg.tokens;
  k.launch.perBlock = kRouteTokens;
  k.launch.block = kRouteWarps * 32;
  Emitter &e = k.e;
  // An expert a warp: the router spreads over twice the blocks (each
  // logit is summed the same way).
  Router route(k, op.getRouter(), cfg, /*unroll=*/1);
  k.launch.gridY = cfg.logitBlocks;
  Value hidden = k.view(0, layer.info(op.getHiddenStates()));
  Value weight = k.view(1, layer.info(op.getRouterWeight()));
  Value biasView = bias ? k.view(2, layer.info(bias)) : Value();
  unsigned next = bias ? 3 : 2;
  Value scoreView = k.view(next, scores);
  Value choiceView = k.view(next + 1, choices);
  Value logitsView =
      op.getLogits() ? k.view(next + 2, layer.info(op.getLogits())) : Value();
  Router::TokenBlock block = route.tokenBlock(cfg.tokens);
  Value count = block.count, firstToken = block.firstToken;
  Value warp = block.warp, lane = block.lane;
  SmallVector<Value> &rows = block.rows;
  Value first =
      e.iadd(e.imul(k.blockId(gpu::Dimension::y), kRouteWarps * route.unroll),
             e.imul(warp, route.unroll));
  e.ifThen(e.ult(first, e.index(cfg.experts)), [&] {
    route.logits(hidden, weight, rows, first, lane,
                 [&](int64_t p, Value x, Value logit) {
                   Value t = e.iadd(firstToken, e.index(p));
                   Value b = biasView ? e.load(biasView, {x}) : Value();
                   e.ifThen(e.ult(t, count), [&] {
                     auto [s, choice] =
                         common::expertScore(e, router.getKind(), logit, b);
                     e.storeRaw(s, scoreView, {t, x});
                     e.storeRaw(choice, choiceView, {t, x});
                   });
                   if (logitsView)
                     route.storeLogit(logitsView, firstToken, p, count, x,
                                      logit, b);
                 });
  });
  return k.finish(op);
}

/// Few tokens, then: the choosing kernel takes a token a warp.
static LogicalResult buildRouteSelect(LayerKernels &layer, RouteOp op,
                                      const RouteConfig &cfg,
                                      const TensorInfo &scores,
                                      const TensorInfo &choices) {
  Kernel k = layer.kernelOn(op, "route_select",
                            {scores.buffer, choices.buffer,
                             layer.info(op.getExpertIds()).buffer,
                             layer.info(op.getWeights()).buffer});
  int64_t warps = cfg.selectWarps;
  k.launch.work = cfg.tokens;
  k.launch.perBlock = warps;
  k.launch.block = warps * 32;
  Emitter &e = k.e;
  Router route(k, op.getRouter(), cfg, cfg.unroll);
  Value scoreView = k.view(0, scores), choiceView = k.view(1, choices);
  Value ids = k.view(2, layer.info(op.getExpertIds()));
  Value weights = k.view(3, layer.info(op.getWeights()));
  common::RouteScratch all =
      scratchFor(k, op.getRouter(), warps, cfg.experts, cfg.topK);
  Value tid = k.threadId();
  Value warp = e.divUI(tid, 32), lane = e.remUI(tid, 32);
  Value t = e.iadd(e.imul(k.blockId(gpu::Dimension::x), warps), warp);
  // Warp-uniform: a whole warp has a token or none.
  e.ifThen(e.ult(t, k.linear(cfg.tokens)), [&] {
    common::RouteScratch mine = rowsOf(e, all, warp);
    e.forEach(
        lane, e.index(cfg.experts),
        [&](Value x) {
          e.storeRaw(e.loadRaw(scoreView, {t, x}), mine.score, {x});
          e.storeRaw(e.loadRaw(choiceView, {t, x}), mine.choice, {x});
        },
        e.index(32));
    NVVM::SyncWarpOp::create(e.b, e.loc, e.i32(-1));
    route.choose(mine, ids, weights, t, lane);
  });
  return k.finish(op);
}

/// The block form's warps on experts and tiles of 8 tokens a warp: four
/// warps of 16 experts where there are as many, each warp then on 32 tokens
/// (a block of 64 x 64); fewer experts take a tile a warp, so that the
/// blocks stay many (32 experts at 4096 tokens: 128 blocks, not 32).
static std::pair<int64_t, int64_t> blockShape(int64_t expertTiles) {
  int64_t expertWarps = std::min<int64_t>(4, llvm::PowerOf2Ceil(expertTiles));
  return {expertWarps, expertWarps == 4 ? 4 : 1};
}

/// The router product on tensor cores into `partials` ([T x parts, E] f32,
/// token t's part p in row t * parts + p): with parts = chunks (the split
/// form) a warp takes one chunk of 16 experts for 8 tokens, four chunks a
/// block; with parts = 1 a warp sums every chunk of 16 experts for its
/// tokens (blockShape), in order, as the choosing kernel sums the split
/// form's parts.
static LogicalResult buildRouteProduct(LayerKernels &layer, RouteOp op,
                                       const RouteConfig &cfg,
                                       const TensorInfo &partials) {
  Kernel k = layer.kernelOn(op, "route_product",
                            {layer.info(op.getHiddenStates()).buffer,
                             layer.info(op.getRouterWeight()).buffer,
                             partials.buffer});
  Emitter &e = k.e;
  int64_t experts = cfg.experts, chunks = cfg.chunks;
  int64_t expertTiles = llvm::divideCeil(experts, 16);
  k.launch.work = cfg.tokens;
  if (cfg.split) {
    k.launch.perBlock = 8;
    k.launch.block = 128;
    k.launch.gridY = expertTiles * llvm::divideCeil(chunks, 4);
  } else {
    auto [expertWarps, tiles] = blockShape(expertTiles);
    k.launch.perBlock = 8 / expertWarps * 8 * tiles;
    k.launch.block = 256;
    k.launch.gridY = llvm::divideCeil(experts, expertWarps * 16);
  }
  Value count = k.linear(cfg.tokens);
  Value tid = k.threadId();
  Value warp = e.divUI(tid, 32), lane = e.remUI(tid, 32);
  // A warp's ring in the split form holds its whole chunk; the block's
  // ring in the other as many steps (a block of few copies a step needs
  // seven in flight to cover the memory's latency).
  auto [expertWarps, tiles] = blockShape(expertTiles);
  int64_t blockTokens = 8 / expertWarps * 8 * tiles;
  int64_t stages = RouteConfig::kChunk / 32;
  int64_t ring = cfg.split ? RouterProduct::ringBytes(1, stages)
                           : stages * (expertWarps * 16 + blockTokens) * 64;
  k.launch.sharedBytes =
      (cfg.split ? k.launch.block / 32 * ring : ring) + sm90a::kSwizzleAlign;
  AlignedShared shared(e);
  RouterProduct product{e,
                        experts,
                        cfg.hidden,
                        count,
                        lane,
                        e.divUI(lane, 4),
                        e.remUI(lane, 4),
                        k.func.getArgument(0),
                        k.func.getArgument(1),
                        shared,
                        cfg.split ? e.imul(warp, ring) : e.index(0),
                        stages};
  Value out = k.view(2, partials);
  Value bx = k.blockId(gpu::Dimension::x), by = k.blockId(gpu::Dimension::y);
  if (cfg.split) {
    Value token0 = e.imul(bx, 8);
    Value expert0 = e.imul(e.remUI(by, expertTiles), 16);
    Value s = e.iadd(e.imul(e.divUI(by, expertTiles), 4), warp);
    e.ifThen(e.andi(e.ult(s, e.index(chunks)), e.ult(token0, count)), [&] {
      SmallVector<Value> acc = product.warpProduct(s, expert0, token0, 1);
      product.store(acc, expert0, token0, 1, [&](Value tok, Value x, Value v) {
        e.storeRaw(v, out, {e.iadd(e.imul(tok, chunks), s), x});
      });
    });
    return k.finish(op);
  }
  // A block of tokens past the call's exits whole (its warps meet at
  // barriers).
  Value blockExpert0 = e.imul(by, expertWarps * 16);
  Value blockToken0 = e.imul(bx, blockTokens);
  k.onlyIf(e.ult(blockToken0, count));
  SmallVector<Value> total = product.blockProduct(
      chunks, blockExpert0, blockToken0, expertWarps, tiles, warp, tid);
  Value expert0 = e.iadd(blockExpert0, e.imul(e.remUI(warp, expertWarps), 16));
  Value token0 =
      e.iadd(blockToken0, e.imul(e.divUI(warp, expertWarps), 8 * tiles));
  product.store(total, expert0, token0, tiles,
                [&](Value tok, Value x, Value v) {
                  e.storeRaw(v, out, {tok, x});
                });
  return k.finish(op);
}

/// Then a warp a token sums its parts in order, scores the experts and
/// chooses. With several parts and more than a stripe of 32 experts a
/// token takes a block of sumWarps warps, a stripe a warp (one warp's
/// lane would have stripes x parts loads in turn: 224 for DeepSeek-V3's
/// router, 12 us at one token), and its first warp chooses.
static LogicalResult buildRouteChoose(LayerKernels &layer, RouteOp op,
                                      const RouteConfig &cfg,
                                      const TensorInfo &partials,
                                      int64_t parts) {
  RouterAttr router = op.getRouter();
  Value bias = op.getBias();
  SmallVector<unsigned> buffers = {partials.buffer};
  if (bias)
    buffers.push_back(layer.info(bias).buffer);
  buffers.append({layer.info(op.getExpertIds()).buffer,
                  layer.info(op.getWeights()).buffer});
  if (op.getLogits())
    buffers.push_back(layer.info(op.getLogits()).buffer);
  Kernel k = layer.kernelOn(op, "route_select", buffers);
  int64_t stripes = llvm::divideCeil(cfg.experts, 32);
  int64_t sumWarps = cfg.sumWarps;
  // Warps a block and tokens a block.
  int64_t warps = sumWarps > 1 ? sumWarps : cfg.selectWarps;
  int64_t tokens = sumWarps > 1 ? 1 : warps;
  k.launch.work = cfg.tokens;
  k.launch.perBlock = tokens;
  k.launch.block = warps * 32;
  Emitter &e = k.e;
  Router route(k, router, cfg, 1);
  Value partView = k.view(0, partials);
  unsigned next = 1;
  Value biasView = bias ? k.view(next++, layer.info(bias)) : Value();
  Value ids = k.view(next++, layer.info(op.getExpertIds()));
  Value weights = k.view(next++, layer.info(op.getWeights()));
  Value logitsView =
      op.getLogits() ? k.view(next, layer.info(op.getLogits())) : Value();
  common::RouteScratch all =
      scratchFor(k, router, tokens, cfg.experts, cfg.topK);
  Value tid = k.threadId();
  Value warp = e.divUI(tid, 32), lane = e.remUI(tid, 32);
  Value slot = sumWarps > 1 ? e.index(0) : warp;
  Value t = e.iadd(e.imul(k.blockId(gpu::Dimension::x), tokens), slot);
  common::RouteScratch mine = rowsOf(e, all, slot);
  // The lane's experts: stripes first + sumWarps j, x = lane + 32 stripe.
  Value firstStripe = sumWarps > 1 ? warp : e.index(0);
  int64_t ownStripes = llvm::divideCeil(stripes, sumWarps);
  auto expertOf = [&](int64_t j) {
    return e.iadd(lane, e.imul(e.iadd(firstStripe, e.index(sumWarps * j)), 32));
  };
  // Warp-uniform: a whole warp has a token or none (a block's warps share
  // theirs).
  Value hasToken = e.ult(t, k.linear(cfg.tokens));
  e.ifThen(hasToken, [&] {
    Value row = e.imul(t, parts);
    // A group of the lane's experts at a time with a batch of parts' loads
    // issued before any sum (a loop would wait out each expert's loads in
    // turn; at most 64 loads in flight a lane), the parts added in order;
    // loads past the experts clamped to the last.
    int64_t batch = std::min<int64_t>(parts, 64);
    int64_t group = std::max<int64_t>(1, 64 / batch);
    for (int64_t first = 0; first < ownStripes; first += group) {
      int64_t last = std::min(ownStripes, first + group);
      SmallVector<Value> sums(last - first);
      for (int64_t from = 0; from < parts; from += batch) {
        int64_t to = std::min(parts, from + batch);
        SmallVector<SmallVector<Value>> loaded;
        for (int64_t j = first; j < last; ++j) {
          Value at = e.minUI(expertOf(j), e.index(cfg.experts - 1));
          loaded.emplace_back();
          for (int64_t p = from; p < to; ++p)
            loaded.back().push_back(
                e.loadRaw(partView, {e.iadd(row, e.index(p)), at}));
        }
        for (int64_t j = first; j < last; ++j)
          for (Value v : loaded[j - first])
            sums[j - first] = sums[j - first] ? e.add(sums[j - first], v) : v;
      }
      for (int64_t j = first; j < last; ++j) {
        Value x = expertOf(j);
        Value logit = sums[j - first];
        e.ifThen(e.ult(x, e.index(cfg.experts)), [&] {
          Value b = biasView ? e.load(biasView, {x}) : Value();
          auto [score, choice] =
              common::expertScore(e, router.getKind(), logit, b);
          e.storeRaw(score, mine.score, {x});
          e.storeRaw(choice, mine.choice, {x});
          if (logitsView)
            e.storeRaw(common::routerLogit(e, router.getKind(), logit, b),
                       logitsView, {t, x});
        });
      }
    }
  });
  if (sumWarps > 1)
    gpu::BarrierOp::create(e.b, e.loc);
  else
    NVVM::SyncWarpOp::create(e.b, e.loc, e.i32(-1));
  Value chooses =
      sumWarps > 1 ? e.andi(hasToken, e.eq(warp, e.index(0))) : hasToken;
  e.ifThen(chooses, [&] { route.choose(mine, ids, weights, t, lane); });
  return k.finish(op);
}

LogicalResult nvidia::buildRoute(LayerKernels &layer, RouteOp op) {
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  RouteConfig cfg =
      configureRoute(op, tokens, layer.maxTokens, layer.expertParallel);
  layer.define(op.getExpertIds(), tokens);
  layer.define(op.getWeights(), tokens);
  if (op.getLogits())
    layer.define(op.getLogits(), tokens);
  auto f32 = Float32Type::get(op.getContext());
  MemRefType scoreType =
      MemRefType::get({ShapedType::kDynamic, cfg.experts}, f32);
  if (cfg.tensorCores) {
    int64_t parts = cfg.split ? cfg.chunks : 1;
    TensorInfo partials{
        layer.plan.addWorkspace(tokens * (parts * cfg.experts * 4)), scoreType,
        tokens * parts};
    if (failed(buildRouteProduct(layer, op, cfg, partials)))
      return failure();
    return buildRouteChoose(layer, op, cfg, partials, parts);
  }
  if (!cfg.split)
    return buildFusedRoute(layer, op, cfg);

  // Few tokens: scores and choice keys go through the workspace.
  TensorInfo scores{layer.plan.addWorkspace(tokens * (cfg.experts * 4)),
                    scoreType, tokens};
  TensorInfo choices{layer.plan.addWorkspace(tokens * (cfg.experts * 4)),
                     scoreType, tokens};
  if (failed(buildRouteLogits(layer, op, cfg, scores, choices)))
    return failure();
  return buildRouteSelect(layer, op, cfg, scores, choices);
}

/// moe.route_grad: the forward's saved logits, or the logits as the fused
/// route computes them (a block of kRouteTokens tokens sharing each load
/// of the router weights), then a warp per token through
/// common::routeGrad, its lanes on stripes of experts.
LogicalResult nvidia::buildRouteGrad(LayerKernels &layer, RouteGradOp op) {
  RouterAttr router = op.getRouter();
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  auto weightType = cast<RankedTensorType>(op.getRouterWeight().getType());
  RouteConfig cfg;
  cfg.experts = weightType.getDimSize(0), cfg.hidden = weightType.getDimSize(1);
  cfg.topK = cast<RankedTensorType>(op.getExpertIds().getType()).getDimSize(1);
  cfg.tokens = tokens;
  cfg.unroll = cfg.experts % (kRouteWarps * 2) == 0 ? 2 : 1;
  int64_t experts = cfg.experts;
  // Two f32 rows a token in shared memory.
  if (kRouteTokens * experts * 8 > sm90a::kSharedWithoutOptIn)
    return op.emitOpError()
           << "has " << experts << " experts: sm_90a's route gradient keeps "
           << kRouteTokens * 8 << " bytes an expert in shared memory, at most "
           << sm90a::kSharedWithoutOptIn;
  layer.define(op.getLogitGrad(), tokens);
  Value saved = op.getLogits();
  SmallVector<Value> buffers;
  if (saved)
    buffers.push_back(saved);
  else
    buffers.append({op.getHiddenStates(), op.getRouterWeight()});
  if (op.getBias() && !saved)
    buffers.push_back(op.getBias());
  buffers.append({op.getExpertIds(), op.getWeightGrad(), op.getLogitGrad()});
  Kernel k = layer.kernel(op, "route_grad", buffers);
  k.launch.work = tokens;
  k.launch.perBlock = kRouteTokens;
  k.launch.block = kRouteWarps * 32;
  Emitter &e = k.e;
  auto view = [&](Value v) {
    return k.view(llvm::find(buffers, v) - buffers.begin(), layer.info(v));
  };
  Value ids = view(op.getExpertIds()), dw = view(op.getWeightGrad());
  Value dl = view(op.getLogitGrad());
  Type f32 = e.b.getF32Type();
  Value score = k.workgroupBuffer({kRouteTokens, experts}, f32);
  Value scoreGrad = k.workgroupBuffer({kRouteTokens, experts}, f32);
  Router route(k, router, cfg, cfg.unroll);
  Router::TokenBlock block = route.tokenBlock(tokens);
  Value lane = block.lane, warp = block.warp;
  if (saved) {
    // Warp p copies token p's row (each token's row is its warp's alone).
    Value logits = view(saved);
    Value p = e.minUI(warp, e.index(kRouteTokens - 1));
    Value row =
        e.minUI(e.iadd(block.firstToken, p), e.isub(block.count, e.index(1)));
    e.ifThen(e.ult(warp, e.index(kRouteTokens)), [&] {
      e.forEach(
          lane, e.index(experts),
          [&](Value x) {
            e.storeRaw(e.loadRaw(logits, {row, x}), score, {p, x});
          },
          e.index(32));
    });
  } else {
    Value hidden = view(op.getHiddenStates());
    Value weight = view(op.getRouterWeight());
    Value bias = op.getBias() ? view(op.getBias()) : Value();
    e.forEach(
        e.imul(warp, route.unroll), e.index(experts),
        [&](Value first) {
          route.logits(hidden, weight, block.rows, first, lane,
                       [&](int64_t p, Value x, Value logit) {
                         Value b = bias ? e.load(bias, {x}) : Value();
                         e.storeRaw(
                             common::routerLogit(e, router.getKind(), logit, b),
                             score, {e.index(p), x});
                       });
        },
        e.index(kRouteWarps * route.unroll));
  }
  gpu::BarrierOp::create(e.b, e.loc);
  auto syncWarp = [&] { NVVM::SyncWarpOp::create(e.b, e.loc, e.i32(-1)); };
  auto forExperts = [&](function_ref<void(Value)> body) {
    e.forEach(lane, e.index(experts), body, e.index(32));
    syncWarp();
  };
  auto reduce = [&](Value init, function_ref<Value(Value)> term, bool isMax) {
    return warpFold(e, lane, experts, init, term, isMax);
  };
  auto single = [&](function_ref<void()> step) {
    e.ifThen(e.eq(lane, e.index(0)), step);
    syncWarp();
  };
  // Warp p takes token p.
  Value t = e.iadd(block.firstToken, warp);
  e.ifThen(e.andi(e.ult(warp, e.index(kRouteTokens)), e.ult(t, block.count)),
           [&] {
             common::routeGrad(e, router, experts, cfg.topK,
                               rowOf(e, score, warp), rowOf(e, scoreGrad, warp),
                               ids, dw, dl, t, {forExperts, reduce, single});
           });
  return k.finish(op);
}
