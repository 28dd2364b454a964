// RUN: moe-opt %s -split-input-file --moe-build-kernels -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx -verify-diagnostics | FileCheck %s --check-prefix=PTX

// The K-grouped weight gradient: a block per [128, tileN] tile of each
// expert's gradient (3 experts x 1 x 1 tiles: N 72, K 40, so tileN 64);
// both operands through TMA in boxes of 64 rows x 64 columns, a producer
// warpgroup and two consumers; wgmma reads both MN-major (PTX's trans-a
// and trans-b 1); rows of a stage past the expert are zeroed in shared
// memory and fenced for the async proxy; f32 pairs stored.
// CHECK-LABEL: func.func @wgrad
// CHECK-SAME: tensor_maps = [#moe.tensor_map<buffer = 0, element_bytes = 2, rows = 1 * T, cols = 72, box_rows = 64, box_cols = 64>, #moe.tensor_map<buffer = 1, element_bytes = 2, rows = 1 * T, cols = 40, box_rows = 64, box_cols = 64>]
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_grouped_matmul_wgrad, work = 3, block = 384, shared_bytes = 99328, args = [buffer 4, buffer 2, buffer 3, tensor_map 0, tensor_map 1, tokens]>]
// CHECK: gpu.func @moe_grouped_matmul_wgrad(
// CHECK: nvvm.wgmma.mma_async {{.*}} A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// CHECK: vector.store {{.*}} vector<2xf32>
// PTX-LABEL: .visible .entry moe_grouped_matmul_wgrad(
// PTX-SAME: .maxntid 384, 1, 1
// PTX-SAME: fence.proxy.async.shared::cta;
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{[^;]*}}, p, 1, 1, 1, 1;
// PTX-SAME: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// PTX-SAME: st.global.v2.b32
func.func @wgrad(%dy: tensor<?x72xbf16>, %x: tensor<?x40xbf16>,
                 %c: tensor<3xi32>, %o: tensor<4xi32>) -> tensor<3x72x40xf32> {
  %0 = moe.grouped_matmul_wgrad %dy lhs %x groups(%c, %o)
      : (tensor<?x72xbf16>, tensor<?x40xbf16>, tensor<3xi32>, tensor<4xi32>)
      -> tensor<3x72x40xf32>
  return %0 : tensor<3x72x40xf32>
}

// -----

// Dense (the shared experts'): every row, one expert; K 1024 takes tiles
// of 256 columns (4 of them) in 4 stages of 48 KiB.
// CHECK-LABEL: func.func @dense
// CHECK-SAME: launches = [#moe.launch<kernel = @moe_grouped_matmul_wgrad, work = 8, block = 384, shared_bytes = 197632, args = [buffer 2, tensor_map 0, tensor_map 1, tokens]>]
// PTX-LABEL: .visible .entry moe_grouped_matmul_wgrad(
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
func.func @dense(%dy: tensor<?x256xbf16>, %x: tensor<?x1024xbf16>)
    -> tensor<256x1024xf32> {
  %0 = moe.grouped_matmul_wgrad %dy lhs %x
      : (tensor<?x256xbf16>, tensor<?x1024xbf16>) -> tensor<256x1024xf32>
  return %0 : tensor<256x1024xf32>
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
