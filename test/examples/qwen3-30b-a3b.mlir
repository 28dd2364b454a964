// RUN: moe-opt %moe_src_root/examples/qwen3-30b-a3b.mlir | moe-opt | FileCheck %s --check-prefix=PARSE
// RUN: moe-opt %moe_src_root/examples/qwen3-30b-a3b.mlir -moe-decompose | FileCheck %s

// PARSE: {config = #moe.config<experts = 128, top_k = 8, hidden = 2048, intermediate = 768, router = <kind = softmax_topk, renormalize = true>, activation = <kind = swiglu>>}

// CHECK: moe.route {{.*}} -> (tensor<?x8xi32>, tensor<?x8xf32>)
// CHECK: moe.dispatch {{.*}} -> (tensor<?x2048xbf16>, tensor<128xi32>, tensor<129xi32>, tensor<?x8xi32>)
// CHECK: moe.grouped_matmul {{.*}} -> tensor<?x768xbf16>
// CHECK: moe.grouped_matmul {{.*}} -> tensor<?x2048xbf16>
// CHECK: moe.combine {{.*}} weights {{.*}} -> tensor<?x2048xbf16>
// CHECK-NOT: moe.grouped_matmul
