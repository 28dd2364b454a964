// RUN: moe-opt %s -split-input-file --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// moe.transpose: a block per 32 x 32 tile of each expert's matrix (4
// experts x 2 x 3 tiles of [40, 96]), 256 threads; the tile goes through
// shared memory with a padding column.
// CHECK-LABEL: func.func @weights
// CHECK: launches = [#moe.launch<kernel = @moe_transpose, work = 24, block = 256, args = [buffer 0, buffer 1, tokens]>]
// CHECK: gpu.func @moe_transpose({{.*}}) workgroup(%{{.*}} : memref<32x33xbf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: gpu.barrier
// PTX-LABEL: .visible .entry moe_transpose(
// A block past the tiles (24) exits before the barrier, which every thread
// of a working block reaches: the bounds guard only the loads and stores.
// PTX-SAME: .shared .align 16 .b8 {{[^ ]*}}[2112];
// PTX-SAME: setp.gt.u32 {{[^,]*}}, {{[^,]*}}, 23;
// PTX-SAME: bar.sync
// PTX-SAME: st.global.b16
func.func @weights(%w: tensor<4x40x96xbf16>) -> tensor<4x96x40xbf16> {
  %0 = moe.transpose %w : tensor<4x40x96xbf16> -> tensor<4x96x40xbf16>
  return %0 : tensor<4x96x40xbf16>
}

