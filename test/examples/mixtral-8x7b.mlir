// RUN: moe-opt %moe_src_root/examples/mixtral-8x7b.mlir | moe-opt | FileCheck %s --check-prefix=PARSE
// RUN: moe-opt %moe_src_root/examples/mixtral-8x7b.mlir -moe-decompose | FileCheck %s

// PARSE: {config = #moe.config<experts = 8, top_k = 2, hidden = 4096, intermediate = 14336, router = <kind = softmax_topk, renormalize = true>, activation = <kind = swiglu>>}

// CHECK: moe.route {{.*}} -> (tensor<?x2xi32>, tensor<?x2xf32>)
// CHECK: moe.dispatch {{.*}} -> (tensor<?x4096xbf16>, tensor<8xi32>, tensor<9xi32>, tensor<?x2xi32>)
// CHECK: moe.grouped_matmul {{.*}} -> tensor<?x14336xbf16>
// CHECK: moe.grouped_matmul {{.*}} -> tensor<?x4096xbf16>
// CHECK: moe.combine {{.*}} weights {{.*}} -> tensor<?x4096xbf16>
// CHECK-NOT: moe.grouped_matmul
