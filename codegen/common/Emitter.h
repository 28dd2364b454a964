//===- Emitter.h - loops and scalar arithmetic for every backend -*- C++
//-*-===//
//
// The CPU backend builds whole ops from these; the GPU kernels build their
// per-thread code from them, so both share the numerics in Numerics.h.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_COMMON_EMITTER_H
#define MOE_CODEGEN_COMMON_EMITTER_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>
#include <functional>

namespace mlir::moe::common {

/// The buffer type holding a tensor: FP8 codes live in i8.
inline MemRefType bufferType(Type type) {
  auto tensor = cast<RankedTensorType>(type);
  Type element = tensor.getElementType();
  if (isa<Float8E4M3FNType, Float8E8M0FNUType>(element))
    element = IntegerType::get(type.getContext(), 8);
  return MemRefType::get(tensor.getShape(), element);
}

/// Emits loops and scalar arithmetic at one insertion point.
class Emitter {
public:
  Emitter(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  Value index(int64_t value) {
    return arith::ConstantIndexOp::create(b, loc, value);
  }
  Value f32(double value) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(value));
  }
  Value i32(int64_t value) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(value));
  }
  Value dim(Value buffer, int64_t i) {
    return memref::DimOp::create(b, loc, buffer, i);
  }
  Value toIndex(Value i32Value) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), i32Value);
  }
  Value toI32(Value indexValue) {
    return arith::IndexCastOp::create(b, loc, b.getI32Type(), indexValue);
  }

  /// A buffer of `type`, its dynamic sizes given in order.
  Value alloc(MemRefType type, ValueRange dynamicSizes = {}) {
    Value buffer = memref::AllocOp::create(b, loc, type, dynamicSizes);
    allocations.push_back(buffer);
    return buffer;
  }
  void fill(Value buffer, Value value) {
    auto type = cast<MemRefType>(buffer.getType());
    SmallVector<Value> ivs;
    std::function<void(int64_t)> nest = [&](int64_t d) {
      if (d == type.getRank()) {
        memref::StoreOp::create(b, loc, value, buffer, ivs);
        return;
      }
      forEach(index(0), dim(buffer, d), [&](Value iv) {
        ivs.push_back(iv);
        nest(d + 1);
        ivs.pop_back();
      });
    };
    nest(0);
  }

  /// for (iv = lb; iv < ub; iv += step) body(iv); the step defaults to 1.
  void forEach(Value lb, Value ub, function_ref<void(Value)> body,
               Value step = {}) {
    scf::ForOp::create(b, loc, lb, ub, step ? step : index(1), ValueRange{},
                       [&](OpBuilder &nested, Location, Value iv, ValueRange) {
                         OpBuilder::InsertionGuard guard(b);
                         b.setInsertionPoint(nested.getInsertionBlock(),
                                             nested.getInsertionPoint());
                         body(iv);
                         scf::YieldOp::create(b, loc);
                       });
  }

  /// A loop carrying `init`; body returns the next values.
  SmallVector<Value>
  reduce(Value lb, Value ub, ValueRange init,
         function_ref<SmallVector<Value>(Value, ValueRange)> body,
         Value step = {}) {
    auto loop = scf::ForOp::create(
        b, loc, lb, ub, step ? step : index(1), init,
        [&](OpBuilder &nested, Location, Value iv, ValueRange carried) {
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPoint(nested.getInsertionBlock(),
                              nested.getInsertionPoint());
          scf::YieldOp::create(b, loc, body(iv, carried));
        });
    return SmallVector<Value>(loop.getResults());
  }

  /// if (condition) body()
  void ifThen(Value condition, function_ref<void()> body) {
    auto op = scf::IfOp::create(b, loc, condition, /*withElseRegion=*/false);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&op.getThenRegion().front());
    body();
  }

  /// condition ? body() : 0 of `type`, body emitted only where condition
  /// holds (a load there need not be waited for at the branch).
  Value valueIf(Value condition, Type type, function_ref<Value()> body) {
    auto op = scf::IfOp::create(b, loc, TypeRange{type}, condition,
                                /*withElseRegion=*/true);
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(&op.getThenRegion().front());
    scf::YieldOp::create(b, loc, body());
    b.setInsertionPointToStart(&op.getElseRegion().front());
    scf::YieldOp::create(
        b, loc,
        arith::ConstantOp::create(b, loc, cast<TypedAttr>(b.getZeroAttr(type)))
            .getResult());
    return op.getResult(0);
  }

  /// An element as f32, whatever the buffer's float type.
  Value load(Value buffer, ValueRange indices) {
    Value value = memref::LoadOp::create(b, loc, buffer, indices);
    if (!value.getType().isF32())
      value = arith::ExtFOp::create(b, loc, b.getF32Type(), value);
    return value;
  }
  /// load() of element `r` of a column: a [R] or [R, 1] buffer.
  Value loadColumn(Value buffer, Value r) {
    if (cast<MemRefType>(buffer.getType()).getRank() == 2)
      return load(buffer, {r, index(0)});
    return load(buffer, {r});
  }
  /// Stores an f32, rounded to nearest even if the buffer is narrower.
  void store(Value value, Value buffer, ValueRange indices) {
    Type element = cast<MemRefType>(buffer.getType()).getElementType();
    if (element != value.getType())
      value = arith::TruncFOp::create(b, loc, element, value);
    memref::StoreOp::create(b, loc, value, buffer, indices);
  }
  Value loadRaw(Value buffer, ValueRange indices) {
    return memref::LoadOp::create(b, loc, buffer, indices);
  }
  void storeRaw(Value value, Value buffer, ValueRange indices) {
    memref::StoreOp::create(b, loc, value, buffer, indices);
  }

  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }
  Value exp(Value x) { return math::ExpOp::create(b, loc, x); }
  Value sigmoid(Value x) {
    return div(f32(1.0), add(f32(1.0), exp(arith::NegFOp::create(b, loc, x))));
  }
  Value fgt(Value x, Value y) {
    return arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, x, y);
  }
  Value select(Value c, Value x, Value y) {
    return arith::SelectOp::create(b, loc, c, x, y);
  }
  Value minf(Value x, Value y) {
    return arith::MinimumFOp::create(b, loc, x, y);
  }
  Value maxf(Value x, Value y) {
    return arith::MaximumFOp::create(b, loc, x, y);
  }
  Value iadd(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value isub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value imul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value divUI(Value x, Value y) { return arith::DivUIOp::create(b, loc, x, y); }
  Value remUI(Value x, Value y) { return arith::RemUIOp::create(b, loc, x, y); }
  Value minUI(Value x, Value y) { return arith::MinUIOp::create(b, loc, x, y); }
  Value imul(Value x, int64_t y) { return imul(x, index(y)); }
  Value divUI(Value x, int64_t y) { return divUI(x, index(y)); }
  Value remUI(Value x, int64_t y) { return remUI(x, index(y)); }
  /// x rounded up to a multiple of `multiple`, for i32 or index values.
  Value roundUp(Value x, Value multiple) {
    return imul(arith::CeilDivUIOp::create(b, loc, x, multiple), multiple);
  }
  Value eq(Value x, Value y) { return icmp(arith::CmpIPredicate::eq, x, y); }
  Value ne(Value x, Value y) { return icmp(arith::CmpIPredicate::ne, x, y); }
  Value ult(Value x, Value y) { return icmp(arith::CmpIPredicate::ult, x, y); }
  Value icmp(arith::CmpIPredicate p, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, p, x, y);
  }
  Value andi(Value x, Value y) { return arith::AndIOp::create(b, loc, x, y); }
  Value xori(Value x, Value y) { return arith::XOrIOp::create(b, loc, x, y); }
  /// The i1 `x` negated.
  Value negate(Value x) {
    return xori(x, arith::ConstantOp::create(b, loc, b.getBoolAttr(true)));
  }
  Value ori(Value x, Value y) { return arith::OrIOp::create(b, loc, x, y); }

  /// Sum over k in [0, K) of lhs[lhsRow, k] * rhs[rhsIndex..., k], in f32.
  Value dot(Value lhs, Value lhsRow, Value rhs, ValueRange rhsPrefix,
            int64_t k) {
    return reduce(
        index(0), index(k), {f32(0.0)},
        [&](Value kk, ValueRange acc) -> SmallVector<Value> {
          SmallVector<Value> rhsIndex(rhsPrefix);
          rhsIndex.push_back(kk);
          Value product = mul(load(lhs, {lhsRow, kk}), load(rhs, rhsIndex));
          return {add(acc[0], product)};
        })[0];
  }

  /// The index in [lb, ub) whose `key` is largest among those `eligible`
  /// says; ties and NaN keys go to the lowest index. -1 if none is eligible.
  Value argmax(Value lb, Value ub, function_ref<Value(Value)> key,
               function_ref<Value(Value)> eligible) {
    auto result =
        reduce(lb, ub, {i32(-1), f32(0.0)},
               [&](Value iv, ValueRange acc) -> SmallVector<Value> {
                 Value value = key(iv);
                 Value none = icmp(arith::CmpIPredicate::slt, acc[0], i32(0));
                 Value better =
                     andi(eligible(iv), ori(none, fgt(value, acc[1])));
                 return {select(better, toI32(iv), acc[0]),
                         select(better, value, acc[1])};
               });
    return result[0];
  }

  OpBuilder &b;
  Location loc;
  SmallVector<Value> allocations;
  /// The target's E4M3 encode of an f32 in one instruction, where it has
  /// one that rounds as encodeE4M3 does (ties to even, magnitudes
  /// saturated to 448); encodeE4M3 keeps NaN's code itself.
  std::function<Value(Emitter &, Value)> nativeE4M3;
  /// The target's correctly rounded f32 x / y for y a block's scale
  /// (positive: normal or infinite), where it has a quicker one than its
  /// division.
  std::function<Value(Emitter &, Value, Value)> scaleQuotient;
};

} // namespace mlir::moe::common

#endif // MOE_CODEGEN_COMMON_EMITTER_H
