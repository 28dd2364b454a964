// RUN: moe-opt %s --split-input-file --moe-fuse-layer --verify-diagnostics | FileCheck %s
// RUN: moe-opt %s --split-input-file --moe-fuse-layer="max-tokens=1" 2>/dev/null | FileCheck %s --check-prefix=ONE
// RUN: moe-opt %s --split-input-file --moe-fuse-layer="max-tokens=0" | FileCheck %s --check-prefix=NONE
// RUN: not moe-opt %s --moe-fuse-layer="max-tokens=-1" 2>&1 | FileCheck %s --check-prefix=NEGATIVE

// NEGATIVE: moe-fuse-layer's max-tokens must be at least 0, not -1

// The buckets of at most 64 tokens run as one kernel; 128 keeps its chain.
// CHECK-LABEL: func.func @dsv3_up
// CHECK-SAME: moe.fused_buckets = array<i64: 1, 8, 64>
// ONE-LABEL: func.func @dsv3_up
// ONE-SAME: moe.fused_buckets = array<i64: 1>
// NONE-LABEL: func.func @dsv3_up
// NONE-NOT: moe.fused_buckets
func.func @dsv3_up(%a: tensor<?x7168xbf16>, %b: tensor<32x4096x7168xbf16>,
                   %c: tensor<32xi32>, %o: tensor<33xi32>)
    -> tensor<?x4096xbf16> attributes {moe.token_buckets = array<i64: 1, 8, 64, 128>} {
  %0 = moe.grouped_matmul %a, %b groups(%c, %o) {configs = [
      #moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, persistent = true>,
      #moe.matmul_config<tokens = 1, tile_m = 8, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, split_k = 5, swap_ab = true>,
      #moe.matmul_config<tokens = 8, tile_m = 64, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, swap_ab = true>,
      #moe.matmul_config<tokens = 64, tile_m = 64, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, swap_ab = true>,
      #moe.matmul_config<tokens = 128, tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>]}
      : (tensor<?x7168xbf16>, tensor<32x4096x7168xbf16>, tensor<32xi32>,
         tensor<33xi32>) -> tensor<?x4096xbf16>
  return %0 : tensor<?x4096xbf16>
}

// -----

// A function without buckets (its token count is fixed, or it is
// expert-parallel) is left as it is.
// CHECK-LABEL: func.func @fixed
// CHECK-NOT: moe.fused_buckets
// CHECK: return
func.func @fixed(%a: tensor<4x7168xbf16>, %b: tensor<32x4096x7168xbf16>,
                 %c: tensor<32xi32>, %o: tensor<33xi32>)
    -> tensor<4x4096xbf16> {
  %0 = moe.grouped_matmul %a, %b groups(%c, %o)
      : (tensor<4x7168xbf16>, tensor<32x4096x7168xbf16>, tensor<32xi32>,
         tensor<33xi32>) -> tensor<4x4096xbf16>
  return %0 : tensor<4x4096xbf16>
}

// -----

// A bucket whose matmul has no configuration for it, or whose tiles form
// clusters or walk a persistent schedule, keeps its chain and says so.
// CHECK-LABEL: func.func @chains
// CHECK-SAME: moe.fused_buckets = array<i64: 8>
// expected-remark @+3 {{bucket 1 keeps its chain of kernels: a grouped matmul's tiles form clusters, which a grid of one block per multiprocessor cannot launch}}
// expected-remark @+2 {{bucket 2 keeps its chain of kernels: a grouped matmul is persistent (it walks its tiles itself)}}
// expected-remark @+1 {{bucket 4 keeps its chain of kernels: a grouped matmul has no configuration for it (run moe-configure-matmuls first)}}
func.func @chains(%a: tensor<?x7168xbf16>, %b: tensor<32x4096x7168xbf16>,
                  %c: tensor<32xi32>, %o: tensor<33xi32>)
    -> tensor<?x4096xbf16> attributes {moe.token_buckets = array<i64: 1, 2, 4, 8>} {
  %0 = moe.grouped_matmul %a, %b groups(%c, %o) {configs = [
      #moe.matmul_config<tile_m = 128, tile_n = 256, tile_k = 64, stages = 4>,
      #moe.matmul_config<tokens = 1, tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, cluster_m = 2>,
      #moe.matmul_config<tokens = 2, tile_m = 128, tile_n = 256, tile_k = 64, stages = 4, persistent = true>,
      #moe.matmul_config<tokens = 8, tile_m = 8, tile_n = 128, tile_k = 64, stages = 6, warpgroups = 1, swap_ab = true>]}
      : (tensor<?x7168xbf16>, tensor<32x4096x7168xbf16>, tensor<32xi32>,
         tensor<33xi32>) -> tensor<?x4096xbf16>
  return %0 : tensor<?x4096xbf16>
}
