//===- Ring.cpp - shared-memory rings of pipelined kernels ----------------===//

#include "codegen/nvidia/support/Ring.h"

#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::nvidia;

static gpu::AddressSpaceAttr workgroup(MLIRContext *ctx) {
  return gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Workgroup);
}

MemRefType nvidia::sharedType(ArrayRef<int64_t> shape, Type element) {
  return MemRefType::get(shape, element, MemRefLayoutAttrInterface(),
                         workgroup(element.getContext()));
}

AlignedShared::AlignedShared(Emitter &e) : e(e) {
  bytes = gpu::DynamicSharedMemoryOp::create(
      e.b, e.loc, sharedType({ShapedType::kDynamic}, e.b.getI8Type()));
  base = memref::ExtractAlignedPointerAsIndexOp::create(e.b, e.loc, bytes);
  int64_t align = sm90a::kSwizzleAlign;
  pad = e.remUI(e.isub(e.index(align), e.remUI(base, align)), align);
}

Value AlignedShared::view(MemRefType type, Value offset) {
  return memref::ViewOp::create(e.b, e.loc, type, bytes, e.iadd(pad, offset),
                                ValueRange{})
      .getResult();
}

Value AlignedShared::address(Value offset) {
  return arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(),
                                    e.iadd(e.iadd(base, pad), offset))
      .getResult();
}

Value nvidia::createBarriers(Emitter &e, int64_t count) {
  MLIRContext *ctx = e.b.getContext();
  return nvgpu::MBarrierCreateOp::create(
      e.b, e.loc, nvgpu::MBarrierGroupType::get(ctx, workgroup(ctx), count));
}

void nvidia::initBarriers(Emitter &e, Value leader, int64_t count,
                          ArrayRef<std::pair<Value, int64_t>> groups) {
  for (int64_t s = 0; s < count; ++s)
    for (auto [group, arrivals] : groups)
      nvgpu::MBarrierInitOp::create(e.b, e.loc, group, e.index(arrivals),
                                    e.index(s), leader);
}

void nvidia::fenceBarrierInits(Emitter &e, Value leader) {
  e.ifThen(leader, [&] { NVVM::FenceMbarrierInitOp::create(e.b, e.loc); });
}

Value nvidia::phaseParity(Emitter &e, Value round) {
  return arith::TruncIOp::create(e.b, e.loc, e.b.getI1Type(),
                                 e.toI32(e.remUI(round, 2)))
      .getResult();
}

void nvidia::waitBarrier(Emitter &e, Value group, Value parity, Value slot) {
  nvgpu::MBarrierTryWaitParityOp::create(e.b, e.loc, group, parity,
                                         e.index(sm90a::kWaitTicks), slot);
}

void nvidia::expectBytes(Emitter &e, Value group, int64_t bytes, Value slot) {
  nvgpu::MBarrierArriveExpectTxOp::create(e.b, e.loc, group, e.index(bytes),
                                          slot, Value());
}

void nvidia::tmaLoad(Emitter &e, Value into, Value group, Value desc,
                     ValueRange coords, Value slot, Value mask) {
  nvgpu::TmaAsyncLoadOp::create(e.b, e.loc, into, group, desc, coords, slot,
                                mask, Value());
}

Value Ring::slot(Value n) const { return shared.e.remUI(n, stages); }

Value Ring::round(Value n) const { return shared.e.divUI(n, stages); }

Value Ring::parity(Value n, bool released) const {
  Emitter &e = shared.e;
  Value round = this->round(n);
  if (released)
    round = e.iadd(round, e.index(1));
  return phaseParity(e, round);
}

void Ring::waitReleased(Value empty, Value n, Value slot) const {
  Emitter &e = shared.e;
  e.ifThen(e.icmp(arith::CmpIPredicate::uge, n, e.index(stages)),
           [&] { waitBarrier(e, empty, parity(n, /*released=*/true), slot); });
}

Value Ring::view(MemRefType type, Value slot, Value offset) const {
  Emitter &e = shared.e;
  Value shift = e.iadd(e.iadd(shared.pad, e.imul(slot, slotBytes)), offset);
  return memref::ViewOp::create(e.b, e.loc, type, shared.bytes, shift,
                                ValueRange{})
      .getResult();
}

Value Ring::address(Value slot, int64_t offset) const {
  Emitter &e = shared.e;
  Value a = e.iadd(e.iadd(shared.base, shared.pad),
                   e.iadd(e.imul(slot, slotBytes), e.index(offset)));
  return arith::IndexCastOp::create(e.b, e.loc, e.b.getI64Type(), a)
      .getResult();
}

void nvidia::producerRegisters(Emitter &e, int64_t registers) {
  NVVM::SetMaxRegisterOp::create(e.b, e.loc, registers,
                                 NVVM::SetMaxRegisterAction::decrease);
}

void nvidia::consumerRegisters(Emitter &e, int64_t registers) {
  NVVM::SetMaxRegisterOp::create(e.b, e.loc, registers,
                                 NVVM::SetMaxRegisterAction::increase);
}
