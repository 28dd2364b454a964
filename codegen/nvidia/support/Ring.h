//===- Ring.h - shared-memory rings of pipelined kernels --------*- C++ -*-===//
//
// What every pipelined kernel family (the grouped matmul, its decode tile,
// attention) builds its producer/consumer pipeline from: the kernel's
// dynamic shared memory aligned for 128-byte swizzled tiles, rings of slots
// counted by stage, groups of mbarriers (a "full" one a slot that TMA
// completes, an "empty" one the consumers release), the phase parity a
// wait takes, TMA loads into a slot, and the warp-specialized register
// split.
//
// Stages are counted from the kernel's start: stage n uses slot
// n % stages in round n / stages. A full barrier's wait for stage n is for
// the phase of round n; a producer waits for the empty barrier of round
// n - stages, the phase of round n / stages + 1 (mod 2), before it refills
// the slot.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CODEGEN_NVIDIA_SUPPORT_RING_H
#define MOE_CODEGEN_NVIDIA_SUPPORT_RING_H

#include "codegen/common/Emitter.h"
#include "codegen/nvidia/support/Sm90a.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"

#include <utility>

namespace mlir::moe::nvidia {

using common::Emitter;

/// The kernel's dynamic shared memory from its first byte aligned to
/// sm90a::kSwizzleAlign: `pad` bytes past `bytes`' start, at address
/// `base` + `pad`. The kernel asks for kSwizzleAlign bytes more than it
/// lays out.
struct AlignedShared {
  explicit AlignedShared(Emitter &e);
  /// A view of `type` at byte `offset` of the aligned buffer.
  Value view(MemRefType type, Value offset);
  /// The shared address (i64) of byte `offset` of the aligned buffer.
  Value address(Value offset);

  Emitter &e;
  Value bytes, base, pad;
};

/// The memref type of shared memory (workgroup address space).
MemRefType sharedType(ArrayRef<int64_t> shape, Type element);

/// A group of `count` mbarriers in shared memory.
Value createBarriers(Emitter &e, int64_t count);

/// Thread `leader` initializes mbarrier s of every group in `groups` (each
/// with its arrival count), s from 0 to `count`.
void initBarriers(Emitter &e, Value leader, int64_t count,
                  ArrayRef<std::pair<Value, int64_t>> groups);
/// Thread `leader` makes its mbarrier initializations visible to the TMA
/// unit, once they are all done.
void fenceBarrierInits(Emitter &e, Value leader);

/// The phase parity (i1) of `round`.
Value phaseParity(Emitter &e, Value round);

/// Waits until mbarrier `slot` of `group` has completed the phase of
/// parity `parity`.
void waitBarrier(Emitter &e, Value group, Value parity, Value slot);

/// Mbarrier `slot` of `group` expects `bytes` more of TMA loads.
void expectBytes(Emitter &e, Value group, int64_t bytes, Value slot);

/// A TMA load of `desc` at `coords` into the shared view `into`, completing
/// on mbarrier `slot` of `group`; multicast to the cluster blocks of
/// `mask` (i16) when given.
void tmaLoad(Emitter &e, Value into, Value group, Value desc, ValueRange coords,
             Value slot, Value mask = Value());

/// A ring of `stages` slots of `slotBytes` each from the start of the
/// aligned shared memory.
struct Ring {
  /// The slot of stage `n`, and its round.
  Value slot(Value n) const;
  Value round(Value n) const;
  /// The parity of stage `n`'s wait: its round for a full barrier, the
  /// round before for an empty (`released`) one.
  Value parity(Value n, bool released) const;
  /// The producer's wait before stage `n` refills its slot: from the ring's
  /// second round on, for the slot's last use to be released on `empty`.
  void waitReleased(Value empty, Value n, Value slot) const;
  /// A view of `type` at byte `offset` of slot `slot`.
  Value view(MemRefType type, Value slot, Value offset) const;
  /// The shared address (i64) of byte `offset` of slot `slot`.
  Value address(Value slot, int64_t offset) const;

  AlignedShared &shared;
  int64_t stages, slotBytes;
};

/// The register split of a warp-specialized block: the producer warps give
/// up registers (sm90a::kProducerRegisters), the consumer warps take them.
void producerRegisters(Emitter &e, int64_t registers);
void consumerRegisters(Emitter &e, int64_t registers);

} // namespace mlir::moe::nvidia

#endif // MOE_CODEGEN_NVIDIA_SUPPORT_RING_H
