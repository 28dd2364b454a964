// RUN: moe-opt %s --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline=stop-after=ptx | FileCheck %s --check-prefix=PTX

// Dispatch in two kernels. The plan (one block of 1024 threads) counts with
// shared-memory atomics and writes counts, offsets and each choice's row on
// the device; the scatter (a block per token) copies rows with 16-byte
// vectors. Ten experts: its two shared buffers of 40 bytes are each 16-byte
// aligned.
// CHECK: launches = [#moe.launch<kernel = @moe_dispatch_plan, work = 1, block = 1024, args = [buffer 1, buffer 3, buffer 4, buffer 5, tokens]>, #moe.launch<kernel = @moe_dispatch_scatter, work = 1 * T, block = 128, args = [buffer 0, buffer 5, buffer 2, tokens]>]
// CHECK: gpu.func @moe_dispatch_plan({{.*}}) workgroup(%{{.*}} : memref<10xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<10xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: memref.atomic_rmw addi
// CHECK: gpu.func @moe_dispatch_scatter(
// CHECK: vector.load {{.*}} vector<8xbf16>
// CHECK: vector.store {{.*}} vector<8xbf16>
// PTX: .visible .entry moe_dispatch_plan(
// PTX-SAME: .shared .align 16 .b8 __wg_moe_dispatch_plan_0[40];
// PTX-SAME: .shared .align 16 .b8 __wg_moe_dispatch_plan_1[40];
// PTX-SAME: atom.shared.add.u32
// PTX-SAME: .visible .entry moe_dispatch_scatter(
// PTX-SAME: ld.global.v4.b32
// PTX-SAME: st.global.v4.b32
func.func @dispatch(%hidden: tensor<?x200xbf16>, %ids: tensor<?x3xi32>)
    -> (tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>) {
  %dispatched, %counts, %offsets, %rows = moe.dispatch %hidden, %ids
      : (tensor<?x200xbf16>, tensor<?x3xi32>)
      -> (tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>)
  return %dispatched, %counts, %offsets, %rows
      : tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>
}

// A training forward's dispatch (`ordered`) gives each expert's rows in
// token order: each warp counts its run of choices into its own row of a
// shared table, then walks it again, its lanes of one expert meeting by
// match.any.
// CHECK: gpu.func @moe_dispatch_plan({{.*}}) workgroup(%{{.*}} : memref<32x10xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<10xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// PTX: .visible .entry moe_dispatch_plan(
// PTX-SAME: match.any.sync.b32
func.func @ordered(%hidden: tensor<?x200xbf16>, %ids: tensor<?x3xi32>)
    -> (tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>) {
  %dispatched, %counts, %offsets, %rows = moe.dispatch %hidden, %ids {ordered}
      : (tensor<?x200xbf16>, tensor<?x3xi32>)
      -> (tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>)
  return %dispatched, %counts, %offsets, %rows
      : tensor<?x200xbf16>, tensor<10xi32>, tensor<11xi32>, tensor<?x3xi32>
}
