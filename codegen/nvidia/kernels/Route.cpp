//===- Route.cpp - the routing kernels ------------------------------------===//
//
// moe.route: warps compute router logits (each load of a weight serves
// every token of the block, each load of a token every expert of a pass)
// and reduce them across lanes with shuffles; then a warp per token chooses
// its experts with the selection code the CPU backend runs
// (codegen/common/Numerics.h), its lanes splitting each search.
// For many tokens one kernel does both, a block per kRouteTokens tokens.
// A bucket of few tokens cannot fill the GPU that way (one block would read
// the whole router), so its logits kernel spreads the experts over blocks
// and writes the scores to the workspace, and a second kernel chooses.
// Both compute each logit with the same lanes in the same order, so they
// choose the same experts with the same weights, bit for bit.
//
//===----------------------------------------------------------------------===//

#include "codegen/common/Numerics.h"
#include "codegen/nvidia/kernels/KernelConfigs.h"
#include "codegen/nvidia/kernels/Kernels.h"

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
  auto shuffle = [&](Value v, int64_t offset) {
    return gpu::ShuffleOp::create(b, loc, v, offset, 32, gpu::ShuffleMode::XOR)
        .getShuffleResult();
  };
  for (int64_t offset = 16; offset > 0; offset /= 2) {
    Value otherFirst = shuffle(first, offset);
    Value otherBest = shuffle(best, offset),
          otherValue = shuffle(value, offset);
    // The lowest first index (-1 is none).
    Value takeFirst =
        e.andi(e.icmp(arith::CmpIPredicate::sge, otherFirst, e.i32(0)),
               e.ori(e.icmp(arith::CmpIPredicate::slt, first, e.i32(0)),
                     e.icmp(arith::CmpIPredicate::slt, otherFirst, first)));
    first = e.select(takeFirst, otherFirst, first);
    // The larger key, the lower index on a tie.
    Value otherHas = e.icmp(arith::CmpIPredicate::sge, otherBest, e.i32(0));
    Value mineNone = e.icmp(arith::CmpIPredicate::slt, best, e.i32(0));
    Value equal = arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OEQ,
                                        otherValue, value);
    Value takeBest = e.andi(
        otherHas,
        e.ori(mineNone, e.ori(e.fgt(otherValue, value),
                              e.andi(equal, e.icmp(arith::CmpIPredicate::slt,
                                                   otherBest, best)))));
    best = e.select(takeBest, otherBest, best);
    value = e.select(takeBest, otherValue, value);
  }
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
    common::selectExperts(e, router, experts, topK, scratch, ids, weights, t,
                          {argmax, single, softmax});
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
                                int64_t experts) {
  Type f32 = k.b.getF32Type(), i8 = k.b.getI8Type();
  common::RouteScratch all;
  all.score = k.workgroupBuffer({tokens, experts}, f32);
  all.choice = k.workgroupBuffer({tokens, experts}, f32);
  all.taken = k.workgroupBuffer({tokens, experts}, i8);
  if (router.getNGroup() > 1) {
    all.groupScore = k.workgroupBuffer({tokens, router.getNGroup()}, f32);
    all.groupTaken = k.workgroupBuffer({tokens, router.getNGroup()}, i8);
  }
  return all;
}

common::RouteScratch rowsOf(Emitter &e, const common::RouteScratch &all,
                            Value r) {
  return {rowOf(e, all.score, r), rowOf(e, all.choice, r),
          rowOf(e, all.taken, r), rowOf(e, all.groupScore, r),
          rowOf(e, all.groupTaken, r)};
}
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
  c.unroll = c.experts % (kRouteWarps * 2) == 0 ? 2 : 1;
  c.logitBlocks = llvm::divideCeil(c.experts, kRouteWarps);
  int64_t scratchBytes = c.experts * 9 + op.getRouter().getNGroup() * 5 + 64;
  c.selectWarps = std::clamp<int64_t>(sm90a::kSharedWithoutOptIn / scratchBytes,
                                      1, kRouteWarps);
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
  common::RouteScratch all = scratchFor(k, router, kRouteTokens, experts);
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
  common::RouteScratch all = scratchFor(k, op.getRouter(), warps, cfg.experts);
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

LogicalResult nvidia::buildRoute(LayerKernels &layer, RouteOp op) {
  TokenLinear tokens = layer.info(op.getHiddenStates()).rows;
  RouteConfig cfg =
      configureRoute(op, tokens, layer.maxTokens, layer.expertParallel);
  layer.define(op.getExpertIds(), tokens);
  layer.define(op.getWeights(), tokens);
  if (op.getLogits())
    layer.define(op.getLogits(), tokens);
  if (!cfg.split)
    return buildFusedRoute(layer, op, cfg);

  // Few tokens: scores and choice keys go through the workspace.
  auto f32 = Float32Type::get(op.getContext());
  MemRefType scoreType =
      MemRefType::get({ShapedType::kDynamic, cfg.experts}, f32);
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
