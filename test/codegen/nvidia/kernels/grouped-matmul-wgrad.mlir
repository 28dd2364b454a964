// RUN: moe-opt %s -split-input-file --moe-build-kernels -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx -verify-diagnostics | FileCheck %s --check-prefix=PTX

// The K-grouped weight gradient: [128, tileN] tiles of each expert's
// gradient (3 experts x 1 x 1 tiles: N 72, K 40, so tileN 64), walked
// persistently; both operands through TMA in boxes of 64 rows x 64
// columns, a producer warpgroup and two consumers; wgmma reads both
// MN-major (PTX's trans-a and trans-b 1); rows of a stage past the expert
// are zeroed in shared memory and fenced for the async proxy; each
// warpgroup's f32 pairs go to shared memory, 128 bytes of columns at a
// time, and TMA stores them through a 3-d map of the result ([E][N][K], a
// box of 64 rows by 32 f32), each buffer refilled once its store has read
// it.
// CHECK-LABEL: func.func @wgrad
// CHECK-SAME: tensor_maps = [#moe.tensor_map<buffer = 0, element_bytes = 2, rows = 1 * T, cols = 72, box_rows = 64, box_cols = 64>, #moe.tensor_map<buffer = 1, element_bytes = 2, rows = 1 * T, cols = 40, box_rows = 64, box_cols = 64>, #moe.tensor_map<buffer = 4, element_bytes = 4, rows = 72, cols = 40, box_rows = 64, box_cols = 32, row_stride = 40, outer = 3, 2880, 1>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_grouped_matmul_wgrad, work = 3, block = 384, shared_bytes = 132096, args = [buffer 4, buffer 2, buffer 3, tensor_map 0, tensor_map 1, tensor_map 2, tokens], persistent = true>]
// CHECK: gpu.func @moe_grouped_matmul_wgrad(
// CHECK: nvvm.wgmma.mma_async {{.*}} A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// CHECK: vector.store {{.*}} vector<2xf32>
// CHECK: nvgpu.tma.async.store
// PTX-LABEL: .visible .entry moe_grouped_matmul_wgrad(
// PTX-SAME: .maxntid 384, 1, 1
// PTX-SAME: fence.proxy.async.shared::cta;
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{[^;]*}}, p, 1, 1, 1, 1;
// PTX-SAME: cp.async.bulk.wait_group.read 0;
// PTX-SAME: st.shared.v2.b32
// PTX-SAME: cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group
// PTX-SAME: cp.async.bulk.commit_group;
// PTX-SAME: cp.async.bulk.wait_group.read 1;
// PTX-SAME: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-SAME: cp.async.bulk.wait_group 0;
func.func @wgrad(%dy: tensor<?x72xbf16>, %x: tensor<?x40xbf16>,
                 %c: tensor<3xi32>, %o: tensor<4xi32>) -> tensor<3x72x40xf32> {
  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o)
      : (tensor<?x72xbf16>, tensor<?x40xbf16>, tensor<3xi32>, tensor<4xi32>)
      -> tensor<3x72x40xf32>
  return %0 : tensor<3x72x40xf32>
}

// -----

// Dense (the shared experts'): every row, one expert; K 1024 takes tiles
// of 256 columns (4 of them) in 4 stages of 48 KiB beside 32 KiB of
// epilogue buffers; the result is stored through a 2-d map.
// CHECK-LABEL: func.func @dense
// CHECK-SAME: #moe.tensor_map<buffer = 2, element_bytes = 4, rows = 256, cols = 1024, box_rows = 64, box_cols = 32, row_stride = 1024>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_grouped_matmul_wgrad, work = 8, block = 384, shared_bytes = 230400, args = [buffer 2, tensor_map 0, tensor_map 1, tensor_map 2, tokens], persistent = true>]
// PTX-LABEL: .visible .entry moe_grouped_matmul_wgrad(
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// PTX-SAME: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
func.func @dense(%dy: tensor<?x256xbf16>, %x: tensor<?x1024xbf16>)
    -> tensor<256x1024xf32> {
  %0 = moe.grouped_matmul_wgrad %dy lhs %x
      : (tensor<?x256xbf16>, tensor<?x1024xbf16>) -> tensor<256x1024xf32>
  return %0 : tensor<256x1024xf32>
}

// -----

// A bf16 result (rounded once from the f32 sums): its pairs go to shared
// memory as 4 bytes, and TMA stores 64 columns (128 bytes) a box.
// CHECK-LABEL: func.func @bf16_out
// CHECK-SAME: #moe.tensor_map<buffer = 4, element_bytes = 2, rows = 136, cols = 520, box_rows = 64, box_cols = 64, row_stride = 520, outer = 2, 70720, 1>]
// CHECK: arith.truncf {{.*}} : vector<2xf32> to vector<2xbf16>
// PTX-LABEL: .visible .entry moe_grouped_matmul_wgrad(
// PTX-SAME: st.shared.b32
// PTX-SAME: cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group
func.func @bf16_out(%dy: tensor<?x136xbf16>, %x: tensor<?x520xbf16>,
                    %c: tensor<2xi32>, %o: tensor<3xi32>)
    -> tensor<2x136x520xbf16> {
  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o)
      : (tensor<?x136xbf16>, tensor<?x520xbf16>, tensor<2xi32>, tensor<3xi32>)
      -> tensor<2x136x520xbf16>
  return %0 : tensor<2x136x520xbf16>
}

// -----

func.func @odd_k(%dy: tensor<?x64xbf16>, %x: tensor<?x36xbf16>,
                 %c: tensor<2xi32>, %o: tensor<3xi32>) -> tensor<2x64x36xf32> {
  // expected-error @+1 {{has K (the lhs's columns) = 36: sm_90a loads both operands with TMA, whose rows must be a multiple of 16 bytes, so it must be a multiple of 8}}
  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o)
      : (tensor<?x64xbf16>, tensor<?x36xbf16>, tensor<2xi32>, tensor<3xi32>)
      -> tensor<2x64x36xf32>
  return %0 : tensor<2x64x36xf32>
}

// -----

// An f32 lhs (the router's f32 gradient goes to SimtMatmul.cpp; a bf16
// one with an f32 lhs has no kernel).
func.func @f32_lhs(%dy: tensor<?x8xbf16>, %x: tensor<?x64xf32>)
    -> tensor<8x64xf32> {
  // expected-error @+1 {{multiplies 'bf16' by 'f32': sm_90a's weight-gradient kernel takes bf16 operands}}
  %0 = moe.grouped_matmul_wgrad %dy lhs %x
      : (tensor<?x8xbf16>, tensor<?x64xf32>) -> tensor<8x64xf32>
  return %0 : tensor<8x64xf32>
}
