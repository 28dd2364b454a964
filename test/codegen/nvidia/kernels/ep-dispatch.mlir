// RUN: moe-opt %s --moe-build-kernels=ep-max-tokens=64 | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// The exchanges in six kernels around the expert-parallel state (buffer
// arg -2: device memory the library owns; the gathered outputs stay at its
// combine area). Receive-side buffers are sized for every rank's capacity:
// 2 ranks x 64 tokens x top-2 = 256 rows. The plan is a thread per token,
// one block at least (it counts the forward); the waits are one block; the
// send (for any count: a bucket of at most 264 tokens takes a block a token
// plus one), the unpack and the combine send stride over 264 blocks, and
// the last block to finish raises the flags, even with no tokens.
// CHECK: #moe.buffer<kind = ep_state>
// An exchange's slices lie apart, in plan order (its peers reach them).
// CHECK-SAME: #moe.buffer<bytes = 4096, offset = 768 + 256 * T>
// CHECK-SAME: #moe.buffer<kind = ep_state, bytes = 12384>
// CHECK: #moe.launch<kernel = @moe_ep_dispatch_plan, work = 1 + 1 * T, per_block = 256, block = 256
// CHECK-SAME: #moe.launch<kernel = @moe_ep_dispatch_send, work = 264, block = 512
// CHECK-SAME: #moe.launch<kernel = @moe_ep_dispatch_wait, work = 1, block = 64
// CHECK-SAME: #moe.launch<kernel = @moe_ep_dispatch_unpack, work = 264, block = 512
// CHECK-SAME: #moe.launch<kernel = @moe_ep_combine_send, work = 264, block = 512
// CHECK-SAME: #moe.launch<kernel = @moe_ep_combine_wait, work = 1, block = 64
// PTX: .visible .entry moe_ep_dispatch_plan(
// Blocks claim their share of the state's counters.
// PTX: atom.global.add.u32
// PTX: .visible .entry moe_ep_dispatch_send(
// The peers' states are generic addresses (CUDA IPC mappings).
// PTX: st.v4.b32
// PTX: fence.sc.sys
// PTX: atom.global.add.u32
// The last block's counts for each peer add the test hook's word (state
// byte 40, 0 but in tests).
// PTX: ld.global.b32 {{[^,]*}}, [{{[^]]*}}+40];
// PTX: st.volatile.b32
// PTX: .visible .entry moe_ep_dispatch_wait(
// PTX: %globaltimer;
// PTX: ld.volatile.global.b32
// PTX: fence.acq_rel.sys
// The unpack stamps each row it fills with the forward's number (rows at
// state byte 887552; a row counts once), and each block adds the rows its
// sources' records filled and their choices that found no row (bytes
// 953088 and 953096, a word a rank) for the combine send to check.
// PTX: .visible .entry moe_ep_dispatch_unpack(
// PTX: atom.global.add.u32 {{[^,]*}}, [{{[^]]*}}+953088]
// PTX: atom.global.add.u32 {{[^,]*}}, [{{[^]]*}}+953096]
// PTX: atom.global.exch.b32 {{[^,]*}}, [{{[^]]*}}+887552]
// PTX: atom.shared.add.u32
// PTX: atom.shared.add.u32
// PTX: .visible .entry moe_ep_combine_wait(
func.func @exchange(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16> {
  %sent, %rows = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  %back = moe.ep_combine_send %d, %origin : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
  %g = moe.ep_combine_recv %back, %rows : (tensor<2xi32>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  %out = moe.combine %g, %rows : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  return %out : tensor<?x8xbf16>
}
