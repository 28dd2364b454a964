// RUN: moe-opt %s --moe-configure-matmuls="matmul-config=cluster=2x1,multicast=rhs" --moe-build-kernels | FileCheck %s
// RUN: moe-opt %s --moe-sm90a-pipeline="matmul-config={cluster=2x1,multicast=rhs} stop-after=ptx" | FileCheck %s --check-prefix=PTX

// A cluster of two blocks along M: each block takes 128 of a cluster's 256
// rows, loads half of the weight tile into both blocks' rings (TMA
// multicast) and tells both blocks when a slot is free. The launch counts
// clusters (256 rows each, one more per expert; a column tile per 256
// weight rows) and doubles them; the
// kernel's cluster shape is its own, so a plain launch forms the clusters.
// CHECK: launches = [#moe.launch<kernel = @moe_grouped_matmul, work = 1 * T, per_block = 256, extra_blocks = 8, grid_y = 2, block = 384, shared_bytes = 216576, args = [{{.*}}], cluster = 2>]
// CHECK: gpu.func @moe_grouped_matmul({{.*}}) kernel attributes {known_block_size = array<i32: 384, 1, 1>, known_cluster_size = array<i32: 2, 1, 1>
// CHECK: nvvm.cluster.arrive
// CHECK: nvvm.cluster.wait
// CHECK: mapa.shared::cluster
// CHECK: nvgpu.tma.async.load {{.*}} multicast_mask
// PTX: .visible .entry moe_grouped_matmul(
// PTX-SAME: .explicitcluster
// PTX-SAME: .reqnctapercluster 2, 1, 1
// PTX-SAME: fence.mbarrier_init.release.cluster
// PTX-SAME: barrier.cluster.arrive
// PTX-SAME: mbarrier.arrive.shared::cluster.b64
// PTX-SAME: multicast::cluster
func.func @fp8_up(%x: tensor<?x256xf8E4M3FN>, %w: tensor<8x512x256xf8E4M3FN>,
                  %counts: tensor<8xi32>, %offsets: tensor<9xi32>,
                  %sx: tensor<?x2xf32>, %sw: tensor<8x4x2xf32>)
    -> tensor<?x512xbf16> {
  %0 = moe.grouped_matmul %x, %w groups(%counts, %offsets) scales(%sx, %sw)
      : (tensor<?x256xf8E4M3FN>, tensor<8x512x256xf8E4M3FN>, tensor<8xi32>,
         tensor<9xi32>, tensor<?x2xf32>, tensor<8x4x2xf32>) -> tensor<?x512xbf16>
  return %0 : tensor<?x512xbf16>
}
