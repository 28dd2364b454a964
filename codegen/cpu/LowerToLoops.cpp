//===- LowerToLoops.cpp - L1 moe ops to loops on buffers ------------------===//
//
// The CPU reference backend. Each L1 op becomes plain scalar loops, written
// for clarity rather than speed, in the arithmetic docs/numerics.md defines:
// f32 accumulation, router math in f32, bf16 rounding where a deployed kernel
// stores a value.
//
//===----------------------------------------------------------------------===//

#include "codegen/cpu/Passes.h"

#include "codegen/common/Emitter.h"
#include "codegen/common/FP8.h"
#include "codegen/common/Numerics.h"
#include "codegen/common/RuntimeImports.h"

#include "dialects/moe/MoeOps.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

namespace mlir::moe::cpu {
#define GEN_PASS_DEF_LOWERTOLOOPS
#include "codegen/cpu/Passes.h.inc"
} // namespace mlir::moe::cpu

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::common;

namespace {
/// Lowers the L1 ops of one function, in order, into a new function on
/// buffers.
class FunctionLowering {
public:
  explicit FunctionLowering(Emitter &emit) : e(emit) {}

  LogicalResult lower(Operation *op) {
    return TypeSwitch<Operation *, LogicalResult>(op)
        .Case([&](RouteOp route) { return lowerRoute(route); })
        .Case([&](DispatchOp dispatch) { return lowerDispatch(dispatch); })
        .Case([&](GroupedMatmulOp matmul) { return lowerMatmul(matmul); })
        .Case([&](CombineOp combine) { return lowerCombine(combine); })
        .Case([&](QuantizeOp quantize) { return lowerQuantize(quantize); })
        .Case([&](PadOp pad) { return lowerPad(pad); })
        .Case([&](TransposeOp o) { return lowerTranspose(o); })
        .Case([&](TiledAttentionOp o) { return lowerTiledAttention(o); })
        .Case([&](AttentionOp o) {
          return o.emitOpError()
                 << "must be split first (run moe-split-attention)";
        })
        .Case([&](DequantizeOp dequantize) {
          return lowerDequantize(dequantize);
        })
        .Case([&](ActivationOp o) { return lowerActivation(o); })
        .Case([&](ActivationGradOp o) { return lowerActivationGrad(o); })
        .Case([&](GroupedMatmulDgradOp o) { return lowerDgrad(o); })
        .Case([&](GroupedMatmulWgradOp o) { return lowerWgrad(o); })
        .Case([&](RouteGradOp o) { return lowerRouteGrad(o); })
        .Case([&](GatherDotOp o) { return lowerGatherDot(o); })
        .Case([&](ScatterOp o) { return lowerScatter(o); })
        .Case([&](EpDispatchSendOp o) { return lowerEpDispatchSend(o); })
        .Case([&](EpDispatchRecvOp o) { return lowerEpDispatchRecv(o); })
        .Case([&](EpCombineSendOp o) { return lowerEpCombineSend(o); })
        .Case([&](EpCombineRecvOp o) { return lowerEpCombineRecv(o); })
        .Case([&](LayerOp layer) {
          return layer.emitOpError()
                 << "must be decomposed first (run moe-decompose)";
        })
        .Default([&](Operation *other) {
          return other->emitOpError()
                 << "is not supported by the CPU reference backend";
        });
  }

  /// Buffers of values computed so far; results returned by the function
  /// are written straight into the caller's output buffers.
  IRMapping buffers;
  DenseMap<Value, Value> outputBuffers;

private:
  Value buffer(Value tensor) { return buffers.lookupOrNull(tensor); }

  /// The buffer a result goes into: the caller's, or a new one.
  Value resultBuffer(Value result, ValueRange dynamicSizes) {
    Value buffer = outputBuffers.lookup(result);
    MemRefType type = bufferType(result.getType());
    // A token count fixed in the type needs no size.
    if (!buffer)
      buffer =
          e.alloc(type, type.getNumDynamicDims() ? dynamicSizes : ValueRange());
    buffers.map(result, buffer);
    return buffer;
  }

  /// A bf16 scratch buffer for a result that the op quantizes on the way
  /// out (`quant`), else the result's own buffer.
  Value realResult(Value result, QuantAttr quant, ValueRange dynamicSizes) {
    if (!quant)
      return resultBuffer(result, dynamicSizes);
    auto type = cast<RankedTensorType>(result.getType());
    MemRefType real = MemRefType::get(type.getShape(), e.b.getBF16Type());
    return e.alloc(real,
                   real.getNumDynamicDims() ? dynamicSizes : ValueRange());
  }
  /// Quantizes the rank-2 bf16 `real` into `data` and `scales` (the fused
  /// results), one scale per row and block, as lowerQuantize does.
  void quantizeResult(Value real, Value data, Value scales, QuantAttr scheme,
                      Value rowCount) {
    Value codes = resultBuffer(data, {rowCount});
    Value blockScales = resultBuffer(scales, {rowCount});
    forEachBlock(real, 1, scheme.getBlockSize(),
                 [&](ArrayRef<Value> prefix, Value rb, Value kb, Value firstRow,
                     Value lastRow, Value firstCol, Value lastCol) {
                   quantizeBlock(e, scheme, real, codes, blockScales, prefix,
                                 rb, kb, firstRow, lastRow, firstCol, lastCol);
                 });
  }

  LogicalResult lowerRoute(RouteOp op);
  LogicalResult lowerDispatch(DispatchOp op);
  LogicalResult lowerMatmul(GroupedMatmulOp op);
  LogicalResult lowerCombine(CombineOp op);
  LogicalResult lowerQuantize(QuantizeOp op);
  LogicalResult lowerPad(PadOp op);
  LogicalResult lowerTranspose(TransposeOp op);
  LogicalResult lowerTiledAttention(TiledAttentionOp op);
  LogicalResult lowerDequantize(DequantizeOp op);
  // Training: the adjoints moe-differentiate builds a backward from.
  LogicalResult lowerActivation(ActivationOp op);
  LogicalResult lowerActivationGrad(ActivationGradOp op);
  LogicalResult lowerDgrad(GroupedMatmulDgradOp op);
  LogicalResult lowerWgrad(GroupedMatmulWgradOp op);
  LogicalResult lowerQuantizedWgrad(GroupedMatmulWgradOp op);
  /// Each column of `input`'s rows [first, last) quantized as one block:
  /// the values its codes stand for into `codes`, its scale into
  /// `scales`'s rows; `inputScales`, when given, dequantizes `input` first.
  void quantizeColumns(QuantAttr scheme, Value input, Value inputScales,
                       Value codes, Value scales, Value first, Value last);
  LogicalResult lowerRouteGrad(RouteGradOp op);
  LogicalResult lowerGatherDot(GatherDotOp op);
  LogicalResult lowerScatter(ScatterOp op);
  /// Calls body(first, last, expert) for the rows of each expert of
  /// `counts` and `offsets` (buffers), or once for rows [0, rows) with a
  /// null expert when they are null.
  void forEachGroup(Value counts, Value offsets, int64_t experts, Value rows,
                    function_ref<void(Value, Value, Value)> body);
  // Expert parallelism: the bytes move through the runtime's calls
  // (runtime/moe_ep.h) over lib/transport; the arithmetic stays here.
  /// `op`'s input (transposed first with `transpose`) quantized into the
  /// results `data` and `scales`.
  LogicalResult quantizeInto(QuantizeOp op, bool transpose, Value data,
                             Value scales);
  LogicalResult lowerEpDispatchSend(EpDispatchSendOp op);
  LogicalResult lowerEpDispatchRecv(EpDispatchRecvOp op);
  LogicalResult lowerEpCombineSend(EpCombineSendOp op);
  LogicalResult lowerEpCombineRecv(EpCombineRecvOp op);

  /// Calls the runtime's `fn` (codegen/common/RuntimeImports.def: i64
  /// values, pointers among them), declared on first use; returns its
  /// result, if any.
  Value callRuntime(RuntimeImport fn, ValueRange args) {
    auto module =
        e.b.getInsertionBlock()->getParentOp()->getParentOfType<ModuleOp>();
    StringRef name = getRuntimeSignature(fn).name;
    auto callee = module.lookupSymbol<func::FuncOp>(name);
    if (!callee) {
      OpBuilder top = OpBuilder::atBlockBegin(module.getBody());
      callee = func::FuncOp::create(
          top, e.loc, name,
          getRuntimeFunctionType(top.getContext(), fn, top.getI64Type()));
      callee.setPrivate();
    }
    auto call = func::CallOp::create(e.b, e.loc, callee, args);
    return call.getNumResults() ? call.getResult(0) : Value();
  }
  Value i64(int64_t v) {
    return arith::ConstantOp::create(e.b, e.loc, e.b.getI64IntegerAttr(v));
  }
  Value indexToI64(Value v) {
    return arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(), v);
  }
  /// A buffer's address as an i64 (0 for none).
  Value address(Value buffer) {
    if (!buffer)
      return i64(0);
    return indexToI64(
        memref::ExtractAlignedPointerAsIndexOp::create(e.b, e.loc, buffer));
  }
  /// Bytes of one row of a rank-2 buffer.
  int64_t rowBytes(Value buffer) {
    auto type = cast<MemRefType>(buffer.getType());
    return type.getDimSize(1) * type.getElementTypeBitWidth() / 8;
  }

  /// The dynamic sizes of `value`'s buffer type, read off `like`.
  SmallVector<Value> dynamicSizes(Value value, Value like) {
    SmallVector<Value> sizes;
    for (auto [i, size] :
         llvm::enumerate(cast<RankedTensorType>(value.getType()).getShape()))
      if (ShapedType::isDynamic(size))
        sizes.push_back(e.dim(like, i));
    return sizes;
  }
  /// Calls body(prefix, rowBlock, kBlockIndex, firstRow, lastRow, firstCol,
  /// lastCol) for every scale block of
  /// a rank-2 or rank-3 quantized buffer: `prefix` is the leading (expert)
  /// index, if any; `rowsPerBlock` is 1 or 128.
  void forEachBlock(Value data, int64_t rowsPerBlock, int64_t kBlock,
                    function_ref<void(ArrayRef<Value>, Value, Value, Value,
                                      Value, Value, Value)>
                        body);

  Emitter &e;
};
} // namespace

LogicalResult FunctionLowering::lowerRoute(RouteOp op) {
  RouterAttr router = op.getRouter();
  RouterKind kind = router.getKind();
  Value hidden = buffer(op.getHiddenStates());
  Value weight = buffer(op.getRouterWeight());
  Value bias = op.getBias() ? buffer(op.getBias()) : Value();
  auto weightType = cast<MemRefType>(weight.getType());
  int64_t experts = weightType.getDimSize(0), h = weightType.getDimSize(1);
  int64_t topK =
      cast<RankedTensorType>(op.getExpertIds().getType()).getDimSize(1);
  Value tokens = e.dim(hidden, 0);
  Value ids = resultBuffer(op.getExpertIds(), {tokens});
  Value weights = resultBuffer(op.getWeights(), {tokens});
  Value logits =
      op.getLogits() ? resultBuffer(op.getLogits(), {tokens}) : Value();

  // Per-token scratch: `score` gives the weights, `choice` ranks experts.
  Type f32 = e.b.getF32Type(), i8 = e.b.getI8Type();
  RouteScratch scratch;
  scratch.score = e.alloc(MemRefType::get({experts}, f32));
  scratch.choice = e.alloc(MemRefType::get({experts}, f32));
  scratch.taken = e.alloc(MemRefType::get({experts}, i8));
  int64_t nGroup = router.getNGroup();
  if (nGroup > 1) {
    scratch.groupScore = e.alloc(MemRefType::get({nGroup}, f32));
    scratch.groupTaken = e.alloc(MemRefType::get({nGroup}, i8));
  }
  e.forEach(e.index(0), tokens, [&](Value t) {
    e.forEach(e.index(0), e.index(experts), [&](Value x) {
      Value logit = e.dot(hidden, t, weight, {x}, h);
      Value b = bias ? e.load(bias, {x}) : Value();
      if (logits)
        e.storeRaw(routerLogit(e, kind, logit, b), logits, {t, x});
      auto [s, choice] = expertScore(e, kind, logit, b);
      e.storeRaw(s, scratch.score, {x});
      e.storeRaw(choice, scratch.choice, {x});
    });
    selectExperts(e, router, experts, topK, scratch, ids, weights, t);
  });
  return success();
}

LogicalResult FunctionLowering::lowerDispatch(DispatchOp op) {
  if (failed(op.checkOneRank()))
    return failure();
  Value hidden = buffer(op.getHiddenStates());
  Value ids = buffer(op.getExpertIds());
  Value scale = op.getScale() ? buffer(op.getScale()) : Value();
  int64_t experts =
      cast<RankedTensorType>(op.getTokensPerExpert().getType()).getDimSize(0);
  int64_t topK = cast<RankedTensorType>(op.getRows().getType()).getDimSize(1);
  int64_t h = cast<MemRefType>(hidden.getType()).getDimSize(1);
  int64_t align = op.getAlign();
  Value tokens = e.dim(hidden, 0);
  Value counts = resultBuffer(op.getTokensPerExpert(), {});
  Value offsets = resultBuffer(op.getExpertOffsets(), {});
  Value rows = resultBuffer(op.getRows(), {tokens});
  auto isLocal = [&](Value id) {
    return e.andi(e.icmp(arith::CmpIPredicate::sge, id, e.i32(0)),
                  e.icmp(arith::CmpIPredicate::slt, id, e.i32(experts)));
  };

  // Count, then lay experts out back to back, each start aligned.
  e.fill(counts, e.i32(0));
  e.forEach(e.index(0), tokens, [&](Value t) {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value id = e.loadRaw(ids, {t, j});
      e.ifThen(isLocal(id), [&] {
        Value x = e.toIndex(id);
        e.storeRaw(e.iadd(e.loadRaw(counts, {x}), e.i32(1)), counts, {x});
      });
    });
  });
  // `cursor` is each expert's next free row.
  Value cursor = e.alloc(MemRefType::get({experts}, e.b.getI32Type()));
  layOutExperts(
      e, experts, align, offsets,
      [&](Value x) { return e.loadRaw(counts, {x}); },
      [&](Value x, Value offset, Value) { e.storeRaw(offset, cursor, {x}); });
  Value total = e.loadRaw(offsets, {e.index(experts)});

  QuantAttr quant = op.getQuantAttr();
  Value dispatched = realResult(op.getDispatched(), quant, {e.toIndex(total)});
  e.fill(dispatched, arith::ConstantOp::create(
                         e.b, e.loc, e.b.getZeroAttr(e.b.getBF16Type())));
  // Fill each expert's rows in token order.
  e.forEach(e.index(0), tokens, [&](Value t) {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value id = e.loadRaw(ids, {t, j});
      e.storeRaw(e.i32(-1), rows, {t, j});
      e.ifThen(isLocal(id), [&] {
        Value x = e.toIndex(id);
        Value row = e.loadRaw(cursor, {x});
        e.storeRaw(e.iadd(row, e.i32(1)), cursor, {x});
        e.storeRaw(row, rows, {t, j});
        Value r = e.toIndex(row);
        e.forEach(e.index(0), e.index(h), [&](Value c) {
          if (!scale) {
            e.storeRaw(e.loadRaw(hidden, {t, c}), dispatched, {r, c});
            return;
          }
          e.store(e.mul(e.load(hidden, {t, c}), e.load(scale, {t, j})),
                  dispatched, {r, c});
        });
      });
    });
  });
  if (quant)
    quantizeResult(dispatched, op.getDispatched(), op.getDispatchedScales(),
                   quant, e.toIndex(total));
  if (op.getTokens())
    quantizeResult(hidden, op.getTokens(), op.getTokenScales(), quant, tokens);
  return success();
}

LogicalResult FunctionLowering::lowerMatmul(GroupedMatmulOp op) {
  if (op.isActivationGrad())
    return op.emitOpError()
           << "has an activation's backward as its epilogue, sm_90a's form "
              "(moe-legalize): the CPU backend takes moe.activation_grad";
  Value lhs = buffer(op.getLhs()), rhs = buffer(op.getRhs());
  Value bias = op.getBias() ? buffer(op.getBias()) : Value();
  bool grouped = static_cast<bool>(op.getTokensPerExpert());
  auto rhsType = cast<MemRefType>(rhs.getType());
  int64_t n = op.getN(), k = op.getK();
  bool transposed = op.getTransposeRhs();
  ActivationAttr activation = op.getActivationAttr();
  int64_t outN = activation ? n / 2 : n;
  Value rowCount = e.dim(lhs, 0);
  QuantAttr outQuant = op.getOutQuantAttr();
  Value out = realResult(op.getOut(), outQuant, {rowCount});
  Value lhsScale = op.getLhsScale() ? buffer(op.getLhsScale()) : Value();
  Value rhsScale = op.getRhsScale() ? buffer(op.getRhsScale()) : Value();
  // FP8: products of decoded codes summed per K block in f32, then scaled by
  // both operands' block scales into the accumulator.
  int64_t kBlock = 0, rhsScaleRows = 1;
  if (lhsScale) {
    rhsScaleRows = common::scaleRowsPerBlock(
        rhsType.getShape(), cast<MemRefType>(rhsScale.getType()).getShape(),
        op.getScheme());
    kBlock = op.getScheme().getBlockSize();
  }
  auto dot = [&](Value r, ArrayRef<Value> rhsPrefix) -> Value {
    if (transposed) {
      // rhs [.., K, N]: column c of the result is rhs's column c.
      return e.reduce(e.index(0), e.index(k), {e.f32(0.0)},
                      [&](Value kk, ValueRange acc) -> SmallVector<Value> {
                        SmallVector<Value> rhsIndex(rhsPrefix.drop_back());
                        rhsIndex.append({kk, rhsPrefix.back()});
                        return {e.add(acc[0], e.mul(e.load(lhs, {r, kk}),
                                                    e.load(rhs, rhsIndex)))};
                      })[0];
    }
    if (!lhsScale)
      return e.dot(lhs, r, rhs, rhsPrefix, k);
    SmallVector<Value> scalePrefix(rhsPrefix);
    if (rhsScaleRows != 1)
      scalePrefix.back() = arith::DivUIOp::create(
          e.b, e.loc, scalePrefix.back(), e.index(rhsScaleRows));
    int64_t blocks = llvm::divideCeil(k, kBlock);
    return e.reduce(
        e.index(0), e.index(blocks), {e.f32(0.0)},
        [&](Value kb, ValueRange acc) -> SmallVector<Value> {
          Value first = arith::MulIOp::create(e.b, e.loc, kb, e.index(kBlock));
          Value last = arith::MinUIOp::create(
              e.b, e.loc, e.iadd(first, e.index(kBlock)), e.index(k));
          Value partial =
              e.reduce(first, last, {e.f32(0.0)},
                       [&](Value kk, ValueRange sum) -> SmallVector<Value> {
                         SmallVector<Value> rhsIndex(rhsPrefix);
                         rhsIndex.push_back(kk);
                         Value a = decodeE4M3(e, e.loadRaw(lhs, {r, kk}));
                         Value b = decodeE4M3(e, e.loadRaw(rhs, rhsIndex));
                         return {e.add(sum[0], e.mul(a, b))};
                       })[0];
          SmallVector<Value> scaleIndex(scalePrefix);
          scaleIndex.push_back(kb);
          Value scale = e.mul(loadScale(e, lhsScale, {r, kb}),
                              loadScale(e, rhsScale, scaleIndex));
          return {e.add(acc[0], e.mul(partial, scale))};
        })[0];
  };

  // out[r, c] for rows [first, last) that use expert `expert` (or none).
  auto rowsOf = [&](Value first, Value last, Value expert) {
    SmallVector<Value> prefix;
    if (expert)
      prefix.push_back(expert);
    e.forEach(first, last, [&](Value r) {
      e.forEach(e.index(0), e.index(outN), [&](Value c) {
        auto column = [&](Value col) {
          SmallVector<Value> rhsPrefix(prefix);
          rhsPrefix.push_back(col);
          Value acc = dot(r, rhsPrefix);
          if (bias)
            acc = e.add(acc, e.load(bias, rhsPrefix));
          return acc;
        };
        if (!activation) {
          e.store(column(c), out, {r, c});
          return;
        }
        Value gate = column(c);
        Value up = column(e.iadd(c, e.index(outN)));
        Value result = activate(e, activation, gate, up);
        e.store(result, out, {r, c});
      });
    });
  };

  auto finish = [&] {
    if (outQuant)
      quantizeResult(out, op.getOut(), op.getOutScale(), outQuant, rowCount);
    return success();
  };
  if (!grouped) {
    rowsOf(e.index(0), rowCount, Value());
    return finish();
  }
  // Rows outside every expert's segment (alignment padding) are zero.
  e.fill(out, arith::ConstantOp::create(
                  e.b, e.loc,
                  e.b.getZeroAttr(
                      cast<MemRefType>(out.getType()).getElementType())));
  Value counts = buffer(op.getTokensPerExpert());
  Value offsets = buffer(op.getExpertOffsets());
  e.forEach(e.index(0), e.index(rhsType.getDimSize(0)), [&](Value x) {
    Value first = e.toIndex(e.loadRaw(offsets, {x}));
    Value last = e.iadd(first, e.toIndex(e.loadRaw(counts, {x})));
    rowsOf(first, last, x);
  });
  return finish();
}

LogicalResult FunctionLowering::lowerCombine(CombineOp op) {
  Value expertOut = buffer(op.getExpertOut()), rows = buffer(op.getRows());
  Value weights = op.getWeights() ? buffer(op.getWeights()) : Value();
  Value shared = op.getShared() ? buffer(op.getShared()) : Value();
  Value gate = op.getGate() ? buffer(op.getGate()) : Value();
  int64_t h = cast<MemRefType>(expertOut.getType()).getDimSize(1);
  int64_t topK = cast<MemRefType>(rows.getType()).getDimSize(1);
  Value tokens = e.dim(rows, 0);
  Value out = resultBuffer(op.getOut(), {tokens});

  e.forEach(e.index(0), tokens, [&](Value t) {
    Value gateScale = gate ? e.sigmoid(e.load(gate, {t, e.index(0)})) : Value();
    e.forEach(e.index(0), e.index(h), [&](Value c) {
      Value sum =
          e.reduce(e.index(0), e.index(topK), {e.f32(0.0)},
                   [&](Value j, ValueRange acc) -> SmallVector<Value> {
                     Value row = e.loadRaw(rows, {t, j});
                     Value valid =
                         e.icmp(arith::CmpIPredicate::sge, row, e.i32(0));
                     // Rows of -1 read row 0 and are discarded by the select.
                     Value safe = e.toIndex(e.select(valid, row, e.i32(0)));
                     Value term = e.load(expertOut, {safe, c});
                     if (weights)
                       term = e.mul(term, e.loadRaw(weights, {t, j}));
                     return {e.select(valid, e.add(acc[0], term), acc[0])};
                   })[0];
      if (shared) {
        Value s = e.load(shared, {t, c});
        sum = e.add(sum, gate ? e.mul(s, gateScale) : s);
      }
      e.store(sum, out, {t, c});
    });
  });
  return success();
}

void FunctionLowering::forEachBlock(
    Value data, int64_t rowsPerBlock, int64_t kBlock,
    function_ref<void(ArrayRef<Value>, Value, Value, Value, Value, Value,
                      Value)>
        body) {
  auto type = cast<MemRefType>(data.getType());
  int64_t rank = type.getRank();
  auto blocks = [&](Value prefixValue) {
    SmallVector<Value> prefix;
    if (prefixValue)
      prefix.push_back(prefixValue);
    Value rows = e.dim(data, rank - 2);
    Value rowBlocks =
        arith::CeilDivUIOp::create(e.b, e.loc, rows, e.index(rowsPerBlock));
    int64_t k = type.getDimSize(rank - 1);
    e.forEach(e.index(0), rowBlocks, [&](Value rb) {
      Value firstRow =
          arith::MulIOp::create(e.b, e.loc, rb, e.index(rowsPerBlock));
      Value lastRow = arith::MinUIOp::create(
          e.b, e.loc, e.iadd(firstRow, e.index(rowsPerBlock)), rows);
      e.forEach(e.index(0), e.index(llvm::divideCeil(k, kBlock)),
                [&](Value kb) {
                  Value firstCol =
                      arith::MulIOp::create(e.b, e.loc, kb, e.index(kBlock));
                  Value lastCol =
                      e.minUI(e.iadd(firstCol, e.index(kBlock)), e.index(k));
                  body(prefix, rb, kb, firstRow, lastRow, firstCol, lastCol);
                });
    });
  };
  if (rank == 3)
    e.forEach(e.index(0), e.dim(data, 0), [&](Value x) { blocks(x); });
  else
    blocks(Value());
}

/// Rows per scale block of quantized `data`: 128 for FP8 block-128 weights
/// stored in 128 x 128 blocks, else 1. The backend handles ranks 2 and 3.
static FailureOr<int64_t> scaleRowsPerBlock(Operation *op, MemRefType data,
                                            ArrayRef<int64_t> scaleShape,
                                            QuantAttr scheme) {
  int64_t rank = data.getRank();
  if (rank != 2 && rank != 3)
    return op->emitOpError() << "of rank " << rank
                             << " is not supported by the CPU reference "
                                "backend (ranks 2 and 3 are)";
  return common::scaleRowsPerBlock(data.getShape(), scaleShape, scheme);
}

/// Calls body(index) for every index of the first `dims` dimensions of
/// `buffer`.
static void forEachIndex(Emitter &e, Value buffer, int64_t dims,
                         function_ref<void(ArrayRef<Value>)> body) {
  SmallVector<Value> ivs;
  std::function<void(int64_t)> nest = [&](int64_t d) {
    if (d == dims)
      return body(ivs);
    e.forEach(e.index(0), e.dim(buffer, d), [&](Value i) {
      ivs.push_back(i);
      nest(d + 1);
      ivs.pop_back();
    });
  };
  nest(0);
}

/// `out`[..., j, i] = `input`[..., i, j].
static void transposeInto(Emitter &e, Value input, Value out) {
  int64_t rank = cast<MemRefType>(input.getType()).getRank();
  forEachIndex(e, input, rank, [&](ArrayRef<Value> index) {
    SmallVector<Value> to(index);
    std::swap(to[rank - 1], to[rank - 2]);
    e.storeRaw(e.loadRaw(input, index), out, to);
  });
}

LogicalResult FunctionLowering::lowerQuantize(QuantizeOp op) {
  if (failed(quantizeInto(op, op.getTranspose(), op.getData(), op.getScales())))
    return failure();
  // Both ways: the transpose's codes and scales as a second quantize.
  if (!op.getTransposed().empty())
    return quantizeInto(op, /*transpose=*/true, op.getTransposed()[0],
                        op.getTransposed()[1]);
  return success();
}

LogicalResult FunctionLowering::quantizeInto(QuantizeOp op, bool transpose,
                                             Value dataResult,
                                             Value scalesResult) {
  Value input = buffer(op.getInput());
  if (transpose) {
    // The reference transposes first: the codes do not depend on the order
    // in which a block is read.
    auto type = cast<MemRefType>(input.getType());
    SmallVector<int64_t> shape(type.getShape());
    std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
    SmallVector<Value> sizes;
    if (type.isDynamicDim(0))
      sizes.push_back(e.dim(input, 0));
    Value swapped =
        e.alloc(MemRefType::get(shape, type.getElementType()), sizes);
    transposeInto(e, input, swapped);
    input = swapped;
  }
  auto inputType = cast<MemRefType>(input.getType());
  auto scaleShape = cast<RankedTensorType>(scalesResult.getType()).getShape();
  FailureOr<int64_t> rowsPerBlock =
      scaleRowsPerBlock(op, inputType, scaleShape, op.getScheme());
  if (failed(rowsPerBlock))
    return failure();
  QuantAttr scheme = op.getScheme();
  Value data = resultBuffer(dataResult, dynamicSizes(dataResult, input));
  SmallVector<Value> scaleSizes;
  if (ShapedType::isDynamic(scaleShape[0]))
    scaleSizes.push_back(e.dim(input, 0));
  Value scales = resultBuffer(scalesResult, scaleSizes);
  int64_t kBlock = scheme.getBlockSize();

  forEachBlock(input, *rowsPerBlock, kBlock,
               [&](ArrayRef<Value> prefix, Value rb, Value kb, Value firstRow,
                   Value lastRow, Value firstCol, Value lastCol) {
                 quantizeBlock(e, scheme, input, data, scales, prefix, rb, kb,
                               firstRow, lastRow, firstCol, lastCol);
               });
  return success();
}

LogicalResult FunctionLowering::lowerTranspose(TransposeOp op) {
  Value input = buffer(op.getInput());
  Value out = resultBuffer(op.getResult(), dynamicSizes(op.getResult(), input));
  transposeInto(e, input, out);
  return success();
}

LogicalResult FunctionLowering::lowerPad(PadOp op) {
  Value input = buffer(op.getInput());
  auto inType = cast<MemRefType>(input.getType());
  Value out = resultBuffer(op.getResult(), dynamicSizes(op.getResult(), input));
  auto outType = cast<MemRefType>(out.getType());
  int64_t last = outType.getRank() - 1, k = inType.getDimSize(last);
  Type element = outType.getElementType();
  Value zero =
      arith::ConstantOp::create(e.b, e.loc, element, e.b.getZeroAttr(element));
  forEachIndex(e, input, last, [&](ArrayRef<Value> outer) {
    e.forEach(e.index(0), e.index(outType.getDimSize(last)), [&](Value c) {
      SmallVector<Value> ivs(outer);
      ivs.push_back(c);
      auto inside = scf::IfOp::create(e.b, e.loc, TypeRange{element},
                                      e.ult(c, e.index(k)), true);
      OpBuilder::InsertionGuard guard(e.b);
      e.b.setInsertionPointToStart(&inside.getThenRegion().front());
      scf::YieldOp::create(e.b, e.loc, e.loadRaw(input, ivs));
      e.b.setInsertionPointToStart(&inside.getElseRegion().front());
      scf::YieldOp::create(e.b, e.loc, zero);
      e.b.setInsertionPointAfter(inside);
      e.storeRaw(inside.getResult(0), out, ivs);
    });
  });
  return success();
}

/// Row by row, the same tiles, key ranges and arithmetic as the GPU's
/// stages: per key tile the masked scores in base 2, the running max, P, the
/// rescaled sum (of P in f32) and output (P rounded to bf16 times V, in f32);
/// the ranges' partial results merged at the end.
LogicalResult FunctionLowering::lowerTiledAttention(TiledAttentionOp op) {
  Value q = buffer(op.getQuery()), k = buffer(op.getKey()),
        v = buffer(op.getValue());
  Value out = resultBuffer(op.getOut(), dynamicSizes(op.getOut(), q));
  auto qType = cast<MemRefType>(q.getType());
  auto kType = cast<MemRefType>(k.getType());
  int64_t hq = qType.getDimSize(2), d = qType.getDimSize(3);
  int64_t hkv = kType.getDimSize(2);
  int64_t dv = cast<MemRefType>(v.getType()).getDimSize(3);
  int64_t tileN = op.getTileN(), splits = op.getKvSplits();
  OpBuilder &b = e.b;
  Type f32 = b.getF32Type();
  Value sq = e.dim(q, 1), skv = e.dim(k, 1);
  Value keyTiles = e.divUI(e.iadd(skv, e.index(tileN - 1)), tileN);
  Value perSplit = e.divUI(e.iadd(keyTiles, e.index(splits - 1)), splits);
  Value scores = e.alloc(MemRefType::get({tileN}, f32));
  Value acc = e.alloc(MemRefType::get({splits, dv}, f32));
  // Per key range: its max, its sum and, once merged, its weight.
  Value stats = e.alloc(MemRefType::get({splits, 3}, f32));
  Value c = e.f32(attentionLog2Scale(op.getScale().convertToDouble()));
  Value negInf = e.f32(-INFINITY), zero = e.f32(0.0);
  auto exp2 = [&](Value x) -> Value {
    return math::Exp2Op::create(b, e.loc, x);
  };
  // exp2(x - m), with m = -inf (nothing seen yet) taken as 0.
  auto safe = [&](Value m) {
    return e.select(
        arith::CmpFOp::create(b, e.loc, arith::CmpFPredicate::OEQ, m, negInf),
        zero, m);
  };
  e.forEach(e.index(0), e.dim(q, 0), [&](Value bi) {
    e.forEach(e.index(0), e.index(hq), [&](Value h) {
      Value hk = e.divUI(h, hq / hkv);
      e.forEach(e.index(0), sq, [&](Value i) {
        // The last key row i sees: the mask is aligned to the keys' end.
        Value limit = e.isub(e.iadd(i, skv), sq);
        e.forEach(e.index(0), e.index(splits), [&](Value s) {
          e.forEach(e.index(0), e.index(dv), [&](Value x) {
            e.storeRaw(zero, acc, {s, x});
          });
          Value first = e.minUI(e.imul(s, perSplit), keyTiles);
          Value last = e.minUI(e.iadd(first, perSplit), keyTiles);
          SmallVector<Value> ml = e.reduce(
              first, last, {negInf, zero},
              [&](Value t, ValueRange carried) -> SmallVector<Value> {
                Value key0 = e.imul(t, tileN);
                // qk and mask.
                e.forEach(e.index(0), e.index(tileN), [&](Value jj) {
                  Value key = e.iadd(key0, jj);
                  Value valid = e.ult(key, skv);
                  if (op.getCausal())
                    valid = e.andi(
                        valid, e.icmp(arith::CmpIPredicate::sle, key, limit));
                  Value row = e.minUI(key, e.isub(skv, e.index(1)));
                  Value dot = e.reduce(
                      e.index(0), e.index(d), {zero},
                      [&](Value x, ValueRange sum) -> SmallVector<Value> {
                        return {
                            e.add(sum[0], e.mul(e.load(q, {bi, i, h, x}),
                                                e.load(k, {bi, row, hk, x})))};
                      })[0];
                  e.storeRaw(e.select(valid, e.mul(dot, c), negInf), scores,
                             {jj});
                });
                // max, rescale.
                Value tileMax =
                    e.reduce(e.index(0), e.index(tileN), {negInf},
                             [&](Value jj, ValueRange m) -> SmallVector<Value> {
                               return {arith::MaximumFOp::create(
                                   b, e.loc, m[0], e.loadRaw(scores, {jj}))};
                             })[0];
                Value mNew =
                    arith::MaximumFOp::create(b, e.loc, carried[0], tileMax);
                Value base = safe(mNew);
                Value alpha = exp2(e.sub(carried[0], base));
                e.forEach(e.index(0), e.index(dv), [&](Value x) {
                  e.storeRaw(e.mul(e.loadRaw(acc, {s, x}), alpha), acc, {s, x});
                });
                // exp, sum and pv.
                Value sum = e.reduce(
                    e.index(0), e.index(tileN), {zero},
                    [&](Value jj, ValueRange l) -> SmallVector<Value> {
                      Value p = exp2(e.sub(e.loadRaw(scores, {jj}), base));
                      Value key = e.iadd(key0, jj);
                      e.ifThen(e.ult(key, skv), [&] {
                        Value pb = common::roundedToBF16(e, p);
                        e.forEach(e.index(0), e.index(dv), [&](Value x) {
                          Value term = e.mul(pb, e.load(v, {bi, key, hk, x}));
                          e.storeRaw(e.add(e.loadRaw(acc, {s, x}), term), acc,
                                     {s, x});
                        });
                      });
                      return {e.add(l[0], p)};
                    })[0];
                return {mNew, e.add(e.mul(carried[1], alpha), sum)};
              });
          e.storeRaw(ml[0], stats, {s, e.index(0)});
          e.storeRaw(ml[1], stats, {s, e.index(1)});
        });
        // Merge the ranges: weights exp2(m_s - M); a row that sees no key
        // gives zeros.
        Value top =
            e.reduce(e.index(0), e.index(splits), {negInf},
                     [&](Value s, ValueRange m) -> SmallVector<Value> {
                       return {arith::MaximumFOp::create(
                           b, e.loc, m[0], e.loadRaw(stats, {s, e.index(0)}))};
                     })[0];
        Value base = safe(top);
        Value total = e.reduce(
            e.index(0), e.index(splits), {zero},
            [&](Value s, ValueRange l) -> SmallVector<Value> {
              Value w = exp2(e.sub(e.loadRaw(stats, {s, e.index(0)}), base));
              e.storeRaw(w, stats, {s, e.index(2)});
              return {e.add(l[0], e.mul(e.loadRaw(stats, {s, e.index(1)}), w))};
            })[0];
        Value seen = arith::CmpFOp::create(b, e.loc, arith::CmpFPredicate::OGT,
                                           total, zero);
        Value inverse = e.select(seen, e.div(e.f32(1.0), total), zero);
        e.forEach(e.index(0), e.index(dv), [&](Value x) {
          Value sum =
              e.reduce(e.index(0), e.index(splits), {zero},
                       [&](Value s, ValueRange o) -> SmallVector<Value> {
                         Value w = e.loadRaw(stats, {s, e.index(2)});
                         return {e.add(o[0], e.mul(e.loadRaw(acc, {s, x}), w))};
                       })[0];
          e.store(e.mul(sum, inverse), out, {bi, i, h, x});
        });
      });
    });
  });
  return success();
}

LogicalResult FunctionLowering::lowerDequantize(DequantizeOp op) {
  Value data = buffer(op.getData()), scales = buffer(op.getScales());
  auto dataType = cast<MemRefType>(data.getType());
  FailureOr<int64_t> rowsPerBlock = scaleRowsPerBlock(
      op, dataType, cast<MemRefType>(scales.getType()).getShape(),
      op.getScheme());
  if (failed(rowsPerBlock))
    return failure();
  QuantAttr scheme = op.getScheme();
  Value out = resultBuffer(op.getOutput(), dynamicSizes(op.getOutput(), data));
  int64_t kBlock = scheme.getBlockSize();
  forEachBlock(data, *rowsPerBlock, kBlock,
               [&](ArrayRef<Value> prefix, Value rb, Value kb, Value firstRow,
                   Value lastRow, Value firstCol, Value lastCol) {
                 dequantizeBlock(e, data, scales, out, prefix, rb, kb, firstRow,
                                 lastRow, firstCol, lastCol);
               });
  return success();
}

void FunctionLowering::forEachGroup(
    Value counts, Value offsets, int64_t experts, Value rows,
    function_ref<void(Value, Value, Value)> body) {
  if (!counts) {
    body(e.index(0), rows, Value());
    return;
  }
  e.forEach(e.index(0), e.index(experts), [&](Value x) {
    Value first = e.toIndex(e.loadRaw(offsets, {x}));
    body(first, e.iadd(first, e.toIndex(e.loadRaw(counts, {x}))), x);
  });
}

LogicalResult FunctionLowering::lowerActivation(ActivationOp op) {
  Value input = buffer(op.getInput());
  int64_t outN = cast<MemRefType>(input.getType()).getDimSize(1) / 2;
  Value rows = e.dim(input, 0);
  QuantAttr scheme = op.getQuantAttr();
  // Quantized: the bf16 values first, then quantized as moe.quantize does.
  Value out = scheme ? e.alloc(MemRefType::get({ShapedType::kDynamic, outN},
                                               e.b.getBF16Type()),
                               {rows})
                     : resultBuffer(op.getOut(), {rows});
  Value weights = op.getRowWeights() ? buffer(op.getRowWeights()) : Value();
  e.forEach(e.index(0), rows, [&](Value r) {
    e.forEach(e.index(0), e.index(outN), [&](Value c) {
      Value gate = e.load(input, {r, c});
      Value up = e.load(input, {r, e.iadd(c, e.index(outN))});
      Value a = activate(e, op.getActivation(), gate, up);
      // The weighted form scales the activation as the forward rounded it.
      if (weights)
        a = e.mul(e.loadColumn(weights, r), common::roundedToBF16(e, a));
      e.store(a, out, {r, c});
    });
  });
  if (!scheme)
    return success();
  Value data = resultBuffer(op.getOut(), {rows});
  Value scales = resultBuffer(op.getScales(), {rows});
  forEachBlock(out, /*rowsPerBlock=*/1, scheme.getBlockSize(),
               [&](ArrayRef<Value> prefix, Value rb, Value kb, Value firstRow,
                   Value lastRow, Value firstCol, Value lastCol) {
                 quantizeBlock(e, scheme, out, data, scales, prefix, rb, kb,
                               firstRow, lastRow, firstCol, lastCol);
               });
  return success();
}

LogicalResult FunctionLowering::lowerActivationGrad(ActivationGradOp op) {
  Value g = buffer(op.getOutGrad()), h = buffer(op.getInput());
  int64_t outN = cast<MemRefType>(h.getType()).getDimSize(1) / 2;
  // The gradient's rows: an expert-parallel rank's saved input may have
  // room for more.
  Value rowCount = e.dim(g, 0);
  Value dh = resultBuffer(op.getInputGrad(), {rowCount});
  Value aw = resultBuffer(op.getWeighted(), {rowCount});
  Value dw = Value();
  Value rows = op.getRows() ? buffer(op.getRows()) : Value();
  if (op.getWeightGrad())
    dw = resultBuffer(op.getWeightGrad(), {rows ? e.dim(rows, 0) : rowCount});
  ActivationAttr activation = op.getActivation();
  // One row of weight w: dh and w a stored, <g, a> returned (a rounded to
  // bf16, as the forward's down matmul read it).
  auto row = [&](Value r, Value w) {
    return e.reduce(
        e.index(0), e.index(outN), {e.f32(0.0)},
        [&](Value c, ValueRange acc) -> SmallVector<Value> {
          Value upCol = e.iadd(c, e.index(outN));
          Value gate = e.load(h, {r, c}), up = e.load(h, {r, upCol});
          Value a = common::roundedToBF16(e, activate(e, activation, gate, up));
          auto [dGate, dUp] = activationGrad(e, activation, gate, up);
          Value gr = e.load(g, {r, c});
          Value wg = e.mul(w, gr);
          e.store(e.mul(wg, dGate), dh, {r, c});
          e.store(e.mul(wg, dUp), dh, {r, upCol});
          e.store(e.mul(w, a), aw, {r, c});
          return {e.add(acc[0], e.mul(gr, a))};
        })[0];
  };
  Value biasTerm = op.getBiasTerm() ? buffer(op.getBiasTerm()) : Value();
  auto withBias = [&](Value dot, Value r) {
    return biasTerm ? e.add(dot, e.loadRaw(biasTerm, {r, e.index(0)})) : dot;
  };
  if (!rows) {
    Value gate = op.getGate() ? buffer(op.getGate()) : Value();
    bool linear = op.getLinearGate();
    e.forEach(e.index(0), rowCount, [&](Value r) {
      Value s = e.f32(1.0);
      if (gate) {
        s = e.load(gate, {r, e.index(0)});
        if (!linear)
          s = e.sigmoid(s);
      }
      Value dot = withBias(row(r, s), r);
      // d sigmoid(x) / dx = s (1 - s).
      if (gate && !linear)
        dot = e.mul(dot, e.mul(s, e.sub(e.f32(1.0), s)));
      if (gate)
        e.storeRaw(dot, dw, {r, e.index(0)});
    });
    return success();
  }
  // Rows no choice maps to (alignment padding) weigh nothing.
  Value zero =
      arith::ConstantOp::create(e.b, e.loc, e.b.getZeroAttr(e.b.getBF16Type()));
  e.fill(dh, zero);
  e.fill(aw, zero);
  Value weights = buffer(op.getWeights());
  int64_t topK = cast<MemRefType>(rows.getType()).getDimSize(1);
  e.forEach(e.index(0), e.dim(rows, 0), [&](Value t) {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value r = e.loadRaw(rows, {t, j});
      e.storeRaw(e.f32(0.0), dw, {t, j});
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, r, e.i32(0)), [&] {
        Value ri = e.toIndex(r);
        e.storeRaw(withBias(row(ri, e.loadRaw(weights, {t, j})), ri), dw,
                   {t, j});
      });
    });
  });
  return success();
}

LogicalResult FunctionLowering::lowerDgrad(GroupedMatmulDgradOp op) {
  Value dy = buffer(op.getOutGrad()), rhs = buffer(op.getRhs());
  Value acc = op.getAcc() ? buffer(op.getAcc()) : Value();
  auto rhsType = cast<MemRefType>(rhs.getType());
  int64_t n = rhsType.getDimSize(rhsType.getRank() - 2);
  int64_t k = rhsType.getDimSize(rhsType.getRank() - 1);
  Value rowCount = e.dim(dy, 0);
  Value out = resultBuffer(op.getOut(), {rowCount});
  Value bias = op.getBias() ? buffer(op.getBias()) : Value();
  Value biasDot = bias ? resultBuffer(op.getBiasDot(), {rowCount}) : Value();
  if (biasDot)
    e.fill(biasDot, e.f32(0.0));
  auto start = [&](Value r, Value c) {
    return acc ? e.load(acc, {r, c}) : e.f32(0.0);
  };
  Value counts =
      op.getTokensPerExpert() ? buffer(op.getTokensPerExpert()) : Value();
  if (counts)
    // Rows outside every expert's segment take nothing but `acc`.
    e.forEach(e.index(0), rowCount, [&](Value r) {
      e.forEach(e.index(0), e.index(k), [&](Value c) {
        e.store(start(r, c), out, {r, c});
      });
    });
  forEachGroup(
      counts, counts ? buffer(op.getExpertOffsets()) : Value(),
      counts ? rhsType.getDimSize(0) : 0, rowCount,
      [&](Value first, Value last, Value x) {
        e.forEach(first, last, [&](Value r) {
          if (biasDot) {
            SmallVector<Value> prefix;
            if (x)
              prefix.push_back(x);
            e.storeRaw(e.dot(dy, r, bias, prefix, n), biasDot, {r, e.index(0)});
          }
          e.forEach(e.index(0), e.index(k), [&](Value c) {
            Value sum =
                e.reduce(e.index(0), e.index(n), {start(r, c)},
                         [&](Value i, ValueRange s) -> SmallVector<Value> {
                           SmallVector<Value> index;
                           if (x)
                             index.push_back(x);
                           index.append({i, c});
                           return {e.add(s[0], e.mul(e.load(dy, {r, i}),
                                                     e.load(rhs, index)))};
                         })[0];
            e.store(sum, out, {r, c});
          });
        });
      });
  return success();
}

void FunctionLowering::quantizeColumns(QuantAttr scheme, Value input,
                                       Value inputScales, Value codes,
                                       Value scales, Value first, Value last) {
  auto value = [&](Value r, Value c) {
    if (!inputScales)
      return e.load(input, {r, c});
    Value scale =
        common::loadScale(e, inputScales, {r, e.divUI(c, e.index(128))});
    return e.mul(decodeE4M3(e, e.loadRaw(input, {r, c})), scale);
  };
  int64_t columns = cast<MemRefType>(input.getType()).getDimSize(1);
  e.forEach(e.index(0), e.index(columns), [&](Value c) {
    auto stats = e.reduce(
        first, last, {e.f32(0.0), e.f32(0.0)},
        [&](Value r, ValueRange acc) -> SmallVector<Value> {
          Value special;
          Value x = common::blockStats(e, value(r, c), special);
          return {arith::MaxNumFOp::create(e.b, e.loc, acc[0], x),
                  arith::MaximumFOp::create(e.b, e.loc, acc[1], special)};
        });
    common::BlockScale scale =
        common::blockScale(e, scheme, stats[0], stats[1]);
    // x times the scale's reciprocal, as a kernel quantizing 128 rows of
    // a column takes it.
    Value inverse = e.div(e.f32(1.0), scale.stored);
    e.forEach(first, last, [&](Value r) {
      e.storeRaw(decodeE4M3(e, encodeE4M3(e, e.mul(value(r, c), inverse))),
                 codes, {r, c});
      e.storeRaw(scale.stored, scales, {r, c});
    });
  });
}

LogicalResult FunctionLowering::lowerQuantizedWgrad(GroupedMatmulWgradOp op) {
  Value dy = buffer(op.getOutGrad()), lhs = buffer(op.getLhs());
  Value lhsScale = op.getLhsScale() ? buffer(op.getLhsScale()) : Value();
  int64_t n = cast<MemRefType>(dy.getType()).getDimSize(1);
  int64_t k = cast<MemRefType>(lhs.getType()).getDimSize(1);
  Value out = resultBuffer(op.getOut(), {});
  Value counts =
      op.getTokensPerExpert() ? buffer(op.getTokensPerExpert()) : Value();
  int64_t experts =
      counts ? cast<MemRefType>(counts.getType()).getDimSize(0) : 0;
  Value rows = e.dim(dy, 0);
  Type f32 = e.b.getF32Type();
  // Each row's codes as the values they stand for, and its block's scale
  // per column: [R, N] and [R, K] each.
  auto scratch = [&](int64_t columns) {
    return e.alloc(MemRefType::get({ShapedType::kDynamic, columns}, f32),
                   {rows});
  };
  Value qy = scratch(n), sy = scratch(n), qx = scratch(k), sx = scratch(k);
  QuantAttr scheme = op.getQuantAttr();
  forEachGroup(
      counts, counts ? buffer(op.getExpertOffsets()) : Value(), experts, rows,
      [&](Value first, Value last, Value x) {
        Value size = e.isub(last, first);
        Value blocks = e.divUI(e.iadd(size, e.index(127)), e.index(128));
        auto blockRows = [&](Value blk) {
          Value from = e.iadd(first, e.imul(blk, e.index(128)));
          return std::make_pair(from,
                                e.minUI(e.iadd(from, e.index(128)), last));
        };
        e.forEach(e.index(0), blocks, [&](Value blk) {
          auto [from, to] = blockRows(blk);
          quantizeColumns(scheme, dy, Value(), qy, sy, from, to);
          quantizeColumns(scheme, lhs, lhsScale, qx, sx, from, to);
        });
        // Each block's product of the codes in f32, then scaled by its
        // two columns' scales, as the promotion of an E4M3 matmul.
        e.forEach(e.index(0), e.index(n), [&](Value i) {
          e.forEach(e.index(0), e.index(k), [&](Value c) {
            Value sum = e.reduce(
                e.index(0), blocks, {e.f32(0.0)},
                [&](Value blk, ValueRange acc) -> SmallVector<Value> {
                  auto [from, to] = blockRows(blk);
                  Value partial = e.reduce(
                      from, to, {e.f32(0.0)},
                      [&](Value r, ValueRange p) -> SmallVector<Value> {
                        return {e.add(p[0], e.mul(e.loadRaw(qy, {r, i}),
                                                  e.loadRaw(qx, {r, c})))};
                      })[0];
                  Value scale =
                      e.mul(e.loadRaw(sy, {from, i}), e.loadRaw(sx, {from, c}));
                  return {e.add(acc[0], e.mul(partial, scale))};
                })[0];
            SmallVector<Value> index;
            if (x)
              index.push_back(x);
            index.append({i, c});
            e.store(sum, out, index);
          });
        });
      });
  return success();
}

LogicalResult FunctionLowering::lowerWgrad(GroupedMatmulWgradOp op) {
  if (op.getQuant())
    return lowerQuantizedWgrad(op);
  Value dy = buffer(op.getOutGrad());
  Value lhs = op.getLhs() ? buffer(op.getLhs()) : Value();
  int64_t n = cast<MemRefType>(dy.getType()).getDimSize(1);
  auto lhsType = lhs ? cast<MemRefType>(lhs.getType()) : MemRefType();
  int64_t k = lhsType && lhsType.getRank() == 2 ? lhsType.getDimSize(1) : 0;
  Value out = resultBuffer(op.getOut(), {});
  Value counts =
      op.getTokensPerExpert() ? buffer(op.getTokensPerExpert()) : Value();
  int64_t experts =
      counts ? cast<MemRefType>(counts.getType()).getDimSize(0) : 0;
  // out[x..., i (, c)] = sum over the expert's rows of dy[r, i] (x lhs).
  auto sumRows = [&](Value first, Value last, Value x, Value i, Value c) {
    SmallVector<Value> index;
    if (x)
      index.push_back(x);
    index.push_back(i);
    if (c)
      index.push_back(c);
    Value sum = e.reduce(
        first, last, {e.f32(0.0)},
        [&](Value r, ValueRange s) -> SmallVector<Value> {
          Value term = e.load(dy, {r, i});
          if (lhs)
            term = e.mul(term, c ? e.load(lhs, {r, c}) : e.load(lhs, {r}));
          return {e.add(s[0], term)};
        })[0];
    e.store(sum, out, index);
  };
  forEachGroup(counts, counts ? buffer(op.getExpertOffsets()) : Value(),
               experts, e.dim(dy, 0), [&](Value first, Value last, Value x) {
                 e.forEach(e.index(0), e.index(n), [&](Value i) {
                   if (!k)
                     return sumRows(first, last, x, i, Value());
                   e.forEach(e.index(0), e.index(k),
                             [&](Value c) { sumRows(first, last, x, i, c); });
                 });
               });
  return success();
}

LogicalResult FunctionLowering::lowerRouteGrad(RouteGradOp op) {
  RouterAttr router = op.getRouter();
  Value hidden = buffer(op.getHiddenStates());
  Value weight = buffer(op.getRouterWeight());
  Value bias = op.getBias() ? buffer(op.getBias()) : Value();
  Value ids = buffer(op.getExpertIds()), dw = buffer(op.getWeightGrad());
  auto weightType = cast<MemRefType>(weight.getType());
  int64_t experts = weightType.getDimSize(0), h = weightType.getDimSize(1);
  int64_t topK = cast<MemRefType>(ids.getType()).getDimSize(1);
  Value tokens = e.dim(hidden, 0);
  Value dl = resultBuffer(op.getLogitGrad(), {tokens});
  Value saved = op.getLogits() ? buffer(op.getLogits()) : Value();
  Type f32 = e.b.getF32Type();
  // Per token: the logits (the forward's, or computed again), then the
  // scores and their gradient in place.
  Value score = e.alloc(MemRefType::get({experts}, f32));
  Value scoreGrad = e.alloc(MemRefType::get({experts}, f32));
  e.forEach(e.index(0), tokens, [&](Value t) {
    e.forEach(e.index(0), e.index(experts), [&](Value x) {
      if (saved) {
        e.storeRaw(e.loadRaw(saved, {t, x}), score, {x});
        return;
      }
      Value logit = e.dot(hidden, t, weight, {x}, h);
      Value b = bias ? e.load(bias, {x}) : Value();
      e.storeRaw(common::routerLogit(e, router.getKind(), logit, b), score,
                 {x});
    });
    common::routeGrad(e, router, experts, topK, score, scoreGrad, ids, dw, dl,
                      t);
  });
  return success();
}

LogicalResult FunctionLowering::lowerGatherDot(GatherDotOp op) {
  Value values = buffer(op.getRowValues());
  Value tokens = op.getTokens() ? buffer(op.getTokens()) : Value();
  int64_t h = cast<MemRefType>(values.getType()).getDimSize(1);
  if (!op.getRows()) {
    // Each row's own sum.
    Value count = e.dim(values, 0);
    Value out = resultBuffer(op.getOut(), {count});
    e.forEach(e.index(0), count, [&](Value r) {
      e.storeRaw(e.reduce(e.index(0), e.index(h), {e.f32(0.0)},
                          [&](Value c, ValueRange acc) -> SmallVector<Value> {
                            return {e.add(acc[0], e.load(values, {r, c}))};
                          })[0],
                 out, {r, e.index(0)});
    });
    return success();
  }
  Value rows = buffer(op.getRows());
  int64_t topK = cast<MemRefType>(rows.getType()).getDimSize(1);
  Value count = e.dim(rows, 0);
  Value out = resultBuffer(op.getOut(), {count});
  e.forEach(e.index(0), count, [&](Value t) {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value r = e.loadRaw(rows, {t, j});
      e.storeRaw(e.f32(0.0), out, {t, j});
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, r, e.i32(0)), [&] {
        Value ri = e.toIndex(r);
        Value dot =
            e.reduce(e.index(0), e.index(h), {e.f32(0.0)},
                     [&](Value c, ValueRange acc) -> SmallVector<Value> {
                       Value v = e.load(values, {ri, c});
                       if (tokens)
                         v = e.mul(v, e.load(tokens, {t, c}));
                       return {e.add(acc[0], v)};
                     })[0];
        e.storeRaw(dot, out, {t, j});
      });
    });
  });
  return success();
}

LogicalResult FunctionLowering::lowerScatter(ScatterOp op) {
  Value source = buffer(op.getSource()), rows = buffer(op.getRows());
  Value offsets = buffer(op.getExpertOffsets());
  Value scale = op.getScale() ? buffer(op.getScale()) : Value();
  int64_t h = cast<MemRefType>(source.getType()).getDimSize(1);
  int64_t topK = cast<MemRefType>(rows.getType()).getDimSize(1);
  int64_t experts = cast<MemRefType>(offsets.getType()).getDimSize(0) - 1;
  Value total = e.toIndex(e.loadRaw(offsets, {e.index(experts)}));
  Value out = resultBuffer(op.getOut(), {total});
  e.fill(out, arith::ConstantOp::create(e.b, e.loc,
                                        e.b.getZeroAttr(e.b.getBF16Type())));
  Value weights = op.getWeights() ? buffer(op.getWeights()) : Value();
  Value rowWeights =
      weights ? resultBuffer(op.getRowWeights(), {total}) : Value();
  if (rowWeights)
    e.fill(rowWeights, e.f32(0.0));
  e.forEach(e.index(0), e.dim(source, 0), [&](Value t) {
    e.forEach(e.index(0), e.index(topK), [&](Value j) {
      Value row = e.loadRaw(rows, {t, j});
      e.ifThen(e.icmp(arith::CmpIPredicate::sge, row, e.i32(0)), [&] {
        Value r = e.toIndex(row);
        if (rowWeights)
          e.storeRaw(e.loadRaw(weights, {t, j}), rowWeights, {r});
        e.forEach(e.index(0), e.index(h), [&](Value c) {
          if (!scale) {
            e.storeRaw(e.loadRaw(source, {t, c}), out, {r, c});
            return;
          }
          e.store(e.mul(e.load(source, {t, c}), e.load(scale, {t, j})), out,
                  {r, c});
        });
      });
    });
  });
  return success();
}

LogicalResult FunctionLowering::lowerEpDispatchSend(EpDispatchSendOp op) {
  Value hidden = buffer(op.getHiddenStates());
  Value tokens = e.dim(hidden, 0);
  Value sent = resultBuffer(op.getSent(), {});
  Value rows = resultBuffer(op.getRows(), {tokens});
  // Quantized tokens travel as codes and scales, quantized here exactly as
  // moe.dispatch quantizes its rows.
  Value data = hidden, scales;
  if (!op.getQuantized().empty()) {
    quantizeResult(hidden, op.getQuantized()[0], op.getQuantized()[1],
                   op.getQuantAttr(), tokens);
    data = buffer(op.getQuantized()[0]);
    scales = buffer(op.getQuantized()[1]);
  }
  Value weights = op.getScale() ? buffer(op.getScale()) : Value();
  callRuntime(RuntimeImport::moe_ep_dispatch_send,
              {address(data), i64(rowBytes(data)), address(scales),
               i64(scales ? rowBytes(scales) : 0),
               address(buffer(op.getExpertIds())), address(weights),
               indexToI64(tokens), address(sent), address(rows)});
  return success();
}

LogicalResult FunctionLowering::lowerEpDispatchRecv(EpDispatchRecvOp op) {
  Value count = arith::IndexCastOp::create(
      e.b, e.loc, e.b.getIndexType(),
      callRuntime(RuntimeImport::moe_ep_dispatch_wait, {}));
  Value counts = resultBuffer(op.getTokensPerExpert(), {});
  Value offsets = resultBuffer(op.getExpertOffsets(), {});
  Value origin = resultBuffer(op.getOrigin(), {count});
  QuantAttr quant = op.getQuantAttr();
  bool scaled = op.getScaled();
  Value data, scales, weights;
  if (quant && !scaled) {
    data = resultBuffer(op.getDispatched(), {count});
    scales = resultBuffer(op.getQuantized()[0], {count});
  } else {
    data = realResult(op.getDispatched(), quant, {count});
  }
  if (scaled)
    weights = e.alloc(MemRefType::get({ShapedType::kDynamic}, e.b.getF32Type()),
                      {count});
  else if (op.getWeights())
    weights = resultBuffer(op.getQuantized()[0], {count});
  callRuntime(RuntimeImport::moe_ep_dispatch_unpack,
              {address(data), address(scales), address(weights),
               address(counts), address(offsets), address(origin)});
  if (!scaled)
    return success();
  // Each row times its choice's weight, rounded to bf16, as moe.dispatch
  // scales rows; then quantized, as it quantizes them.
  int64_t h = cast<MemRefType>(data.getType()).getDimSize(1);
  e.forEach(e.index(0), count, [&](Value r) {
    Value w = e.load(weights, {r});
    e.forEach(e.index(0), e.index(h), [&](Value c) {
      e.store(e.mul(e.load(data, {r, c}), w), data, {r, c});
    });
  });
  if (quant)
    quantizeResult(data, op.getDispatched(), op.getQuantized()[0], quant,
                   count);
  return success();
}

LogicalResult FunctionLowering::lowerEpCombineSend(EpCombineSendOp op) {
  Value out = buffer(op.getExpertOut());
  Value sent = resultBuffer(op.getSent(), {});
  Value values = op.getValues() ? buffer(op.getValues()) : Value();
  // The rows that arrived; `out` may have room for more (a training
  // forward's saved rows).
  callRuntime(RuntimeImport::moe_ep_combine_send,
              {address(out), i64(rowBytes(out)),
               address(buffer(op.getOrigin())), indexToI64(e.dim(out, 0)),
               address(sent), address(values)});
  return success();
}

LogicalResult FunctionLowering::lowerEpCombineRecv(EpCombineRecvOp op) {
  Value rows = buffer(op.getRows());
  int64_t topK = cast<MemRefType>(rows.getType()).getDimSize(1);
  Value count = e.imul(e.dim(rows, 0), topK);
  Value gathered = resultBuffer(op.getGathered(), {count});
  Value values =
      op.getValues() ? resultBuffer(op.getValues(), {e.dim(rows, 0)}) : Value();
  callRuntime(
      RuntimeImport::moe_ep_combine_recv,
      {address(gathered), indexToI64(count), address(rows), address(values)});
  return success();
}

namespace {
struct LowerToLoopsPass
    : public moe::cpu::impl::LowerToLoopsBase<LowerToLoopsPass> {
  void runOnOperation() override {
    SmallVector<func::FuncOp> funcs;
    for (auto func : getOperation().getOps<func::FuncOp>())
      if (!func.isExternal() && hasMoeOps(func))
        funcs.push_back(func);
    for (func::FuncOp func : funcs)
      if (failed(lowerFunction(func)))
        return signalPassFailure();
  }

  static bool hasMoeOps(func::FuncOp func) {
    return func
        .walk([](Operation *op) {
          return isa<MoeDialect>(op->getDialect()) ? WalkResult::interrupt()
                                                   : WalkResult::advance();
        })
        .wasInterrupted();
  }

  /// Rewrites `func` on tensors into a function of the same name on buffers,
  /// results becoming trailing output arguments.
  LogicalResult lowerFunction(func::FuncOp func) {
    if (!func.getBody().hasOneBlock())
      return func.emitOpError() << "must have a single block to be lowered";
    FunctionType type = func.getFunctionType();
    SmallVector<Type> argTypes;
    for (Type t :
         llvm::concat<const Type>(type.getInputs(), type.getResults())) {
      if (!isa<RankedTensorType>(t))
        return func.emitOpError()
               << "takes and returns only ranked tensors here, not " << t;
      argTypes.push_back(bufferType(t));
    }
    OpBuilder b(func);
    auto lowered = func::FuncOp::create(b, func.getLoc(), func.getName(),
                                        b.getFunctionType(argTypes, {}));
    Block *entry = lowered.addEntryBlock();
    b.setInsertionPointToStart(entry);
    Emitter emitter(b, func.getLoc());
    FunctionLowering lowering(emitter);
    Block &body = func.getBody().front();
    for (auto [old, now] :
         llvm::zip(body.getArguments(), entry->getArguments()))
      lowering.buffers.map(old, now);
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    unsigned numInputs = type.getNumInputs();
    for (auto [i, value] : llvm::enumerate(ret.getOperands())) {
      if (!value.getDefiningOp() || lowering.outputBuffers.count(value))
        return func.emitOpError()
               << "must return distinct values computed by moe ops";
      lowering.outputBuffers[value] = entry->getArgument(numInputs + i);
    }
    for (Operation &op : body.without_terminator()) {
      emitter.loc = op.getLoc();
      if (failed(lowering.lower(&op))) {
        lowered.erase();
        return failure();
      }
    }
    for (Value buffer : emitter.allocations)
      memref::DeallocOp::create(b, func.getLoc(), buffer);
    func::ReturnOp::create(b, func.getLoc());
    lowered->setAttrs(func->getAttrs());
    lowered.setFunctionType(b.getFunctionType(argTypes, {}));
    lowered->removeAttr(func.getArgAttrsAttrName());
    lowered->removeAttr(func.getResAttrsAttrName());
    func.erase();
    return success();
  }
};
} // namespace
