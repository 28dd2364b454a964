// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir | moe-opt | FileCheck %s --check-prefix=PARSE
// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir -moe-decompose | FileCheck %s

// PARSE: moe.layer {{.*}} router({{.*}}, {{.*}}) experts({{.*}}) shared({{.*}}) {config = #moe.config<experts = 256, top_k = 8, hidden = 7168, intermediate = 2048, router = <kind = sigmoid_grouped_topk, renormalize = true, n_group = 8, topk_group = 4, scaling = 2.5>, activation = <kind = swiglu>, shared_intermediate = 2048>}

// CHECK: moe.route {{.*}} bias {{.*}} -> (tensor<?x8xi32>, tensor<?x8xf32>)
// CHECK: moe.dispatch {{.*}} -> (tensor<?x7168xbf16>, tensor<256xi32>, tensor<257xi32>, tensor<?x8xi32>)
// CHECK: moe.grouped_matmul {{.*}} : (tensor<?x7168xbf16>, tensor<256x4096x7168xbf16>, tensor<256xi32>, tensor<257xi32>) -> tensor<?x2048xbf16>
// CHECK: moe.grouped_matmul {{.*}} : (tensor<?x2048xbf16>, tensor<256x7168x2048xbf16>, tensor<256xi32>, tensor<257xi32>) -> tensor<?x7168xbf16>
// CHECK: moe.grouped_matmul {{.*}} : (tensor<?x7168xbf16>, tensor<4096x7168xbf16>) -> tensor<?x2048xbf16>
// CHECK: moe.grouped_matmul {{.*}} : (tensor<?x2048xbf16>, tensor<7168x2048xbf16>) -> tensor<?x7168xbf16>
// CHECK: moe.combine {{.*}} weights {{.*}} shared {{.*}} -> tensor<?x7168xbf16>
// CHECK-NOT: moe.layer
