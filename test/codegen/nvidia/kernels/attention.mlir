// RUN: moe-opt %s --moe-split-attention --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-split-attention=ping-pong=false --moe-build-kernels | FileCheck %s --check-prefix=SERIAL
// RUN: moe-compile %s --target=sm_90a --emit=ptx -o %t.ptx
// RUN: FileCheck %s --check-prefix=PTX --input-file=%t.ptx
// RUN: %if ptxas %{ ptxas -arch=sm_90a %t.ptx -o %t.cubin %}

// Causal GQA 4:1, head size 128, 300 positions: the four query heads of a
// key/value head share a row tile (32 positions x 4 heads), 10 row tiles
// per key/value head in 5 long/short pairs, 10 pairs in all. Q is read as
// (head dim, head in group, position, kv head, batch), K and V as (head
// dim, position, head, batch), 64 columns at a time; the output is stored
// like Q, 16 positions (a row group's 64 rows) at a time. One persistent
// launch (a producer and two row groups, 384 threads) with two Q buffers
// and a two-slot K/V ring.
// CHECK-LABEL: func.func @gqa_causal
// CHECK-SAME: tensor_maps = [#moe.tensor_map<buffer = 0, element_bytes = 2, rows = 4, cols = 128, box_rows = 4, box_cols = 64, row_stride = 128, outer = 300, 1024, 32, 2, 512, 1, 1, 307200, 1>,
// CHECK-SAME: #moe.tensor_map<buffer = 1, element_bytes = 2, rows = 300, cols = 128, box_rows = 128, box_cols = 64, row_stride = 256, outer = 2, 128, 1, 1, 76800, 1>,
// CHECK-SAME: #moe.tensor_map<buffer = 2, element_bytes = 2, rows = 300, cols = 128, box_rows = 128, box_cols = 64, row_stride = 256, outer = 2, 128, 1, 1, 76800, 1>,
// CHECK-SAME: #moe.tensor_map<buffer = 3, element_bytes = 2, rows = 4, cols = 128, box_rows = 4, box_cols = 64, row_stride = 128, outer = 300, 1024, 16, 2, 512, 1, 1, 307200, 1>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_attention, work = 10, block = 384, shared_bytes = 197632, args = [buffer 3, tensor_map 0, tensor_map 1, tensor_map 2, tensor_map 3, tokens], persistent = true>]
// The row groups: S = Q K^T with both operands in shared memory, then
// O += P V with P from registers and V transposed (imm-trans-b 1).
// Ping-pong: a group waits for its turn before its matmuls and hands the
// turn over after issuing them.
// CHECK: gpu.func @moe_attention(
// CHECK: nvvm.setmaxregister  increase 240
// CHECK: llvm.inline_asm has_side_effects "bar.sync $0, 256;"
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 16>, D[<f32>, <zero>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK: llvm.inline_asm has_side_effects "bar.arrive $0, 256;"
// CHECK: "ex2.approx.ftz.f32 $0, $1;"
// CHECK: "cvt.rn.bf16x2.f32 $0, $1, $2;"
// CHECK: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// The producer loads Q in boxes of 32 positions x 4 heads, K and V in 128
// keys, each 64 columns wide.
// A row group's output leaves through its rows of the Q buffer, with TMA.
// CHECK: "fence.proxy.async.shared::cta;"
// CHECK: nvgpu.tma.async.store {{.*}} : memref<1x1x16x4x64xbf16, #gpu.address_space<workgroup>>
// CHECK: "cp.async.bulk.wait_group.read 0;"
// CHECK: nvvm.setmaxregister  decrease 24
// CHECK: nvgpu.tma.async.load {{.*}} : <tensor = memref<1x1x32x4x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// CHECK: nvgpu.tma.async.load {{.*}} : <tensor = memref<1x1x128x64xbf16, #gpu.address_space<workgroup>>, swizzle = swizzle_128b
// Without ping-pong no group waits for another (a group still syncs its own
// 128 threads before storing its output).
// SERIAL-LABEL: gpu.func @moe_attention(
// SERIAL-NOT: bar.sync $0, 256
// SERIAL-NOT: bar.arrive
// SERIAL: gpu.return
// PTX: .visible .entry moe_attention(
// PTX: .maxntid 384, 1, 1
// PTX-DAG: cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-DAG: cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-DAG: bar.sync %r{{[0-9]+}}, 256;
// PTX-DAG: bar.arrive %r{{[0-9]+}}, 256;
// PTX-DAG: ex2.approx.ftz.f32
// PTX-DAG: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, %rd{{[0-9]+}}, %rd{{[0-9]+}}, p, 1, 1, 0, 0;
// PTX-DAG: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}}, {%r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}, %r{{[0-9]+}}}, %rd{{[0-9]+}}, p, 1, 1, 1;
func.func @gqa_causal(%q: tensor<1x300x8x128xbf16>, %k: tensor<1x300x2x128xbf16>, %v: tensor<1x300x2x128xbf16>) -> tensor<1x300x8x128xbf16> {
  %o = moe.attention %q, %k, %v {causal} : (tensor<1x300x8x128xbf16>, tensor<1x300x2x128xbf16>, tensor<1x300x2x128xbf16>) -> tensor<1x300x8x128xbf16>
  return %o : tensor<1x300x8x128xbf16>
}
