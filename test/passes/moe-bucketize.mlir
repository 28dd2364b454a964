// RUN: moe-opt %s -split-input-file -moe-decompose -moe-bucketize -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file -moe-decompose -moe-bucketize="buckets=1,16,256" 2>/dev/null | FileCheck %s --check-prefix=ASKED
// RUN: moe-opt %s -split-input-file -moe-decompose -moe-bucketize="buckets=1,16,256" -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK
// RUN: not moe-opt %s -split-input-file -moe-bucketize="buckets=4,2" 2>&1 | FileCheck %s --check-prefix=BAD

// A layer whose token count is dynamic gets buckets: by default the powers
// of two up to 4096, or the ones asked for. Its ops are untouched: the
// kernels are specialized per bucket when they are built.
// CHECK-LABEL: func.func @decode
// CHECK-SAME: moe.token_buckets = array<i64: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096>
// CHECK: moe.route
// ASKED-LABEL: func.func @decode
// ASKED-SAME: moe.token_buckets = array<i64: 1, 16, 256>
// BAD: error: token buckets must be ascending counts of at least 1; bucket 1 is 2
func.func @decode(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}

// -----

// A fixed token count needs no buckets; asked for, the pass says why.
// CHECK-LABEL: func.func @fixed
// CHECK-NOT: moe.token_buckets
// REMARK: remark: no token buckets: the token count is fixed
// ASKED-LABEL: func.func @fixed
// ASKED-NOT: moe.token_buckets
func.func @fixed(%x: tensor<3x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<4x16x8xbf16>, %w2: tensor<4x8x8xbf16>) -> tensor<3x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>>}
      : (tensor<3x8xbf16>, tensor<4x8xbf16>, tensor<4x16x8xbf16>, tensor<4x8x8xbf16>) -> tensor<3x8xbf16>
  return %0 : tensor<3x8xbf16>
}

// -----

// An expert-parallel layer takes buckets too, picked by each rank's own
// token count.
// CHECK-LABEL: func.func @expert_parallel
// CHECK-SAME: moe.token_buckets = array<i64: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096>
// CHECK: moe.dispatch {{.*}}ep_size = 2
// ASKED-LABEL: func.func @expert_parallel
// ASKED-SAME: moe.token_buckets = array<i64: 1, 16, 256>
func.func @expert_parallel(%x: tensor<?x8xbf16>, %rw: tensor<4x8xbf16>, %w13: tensor<2x16x8xbf16>, %w2: tensor<2x8x8xbf16>) -> tensor<?x8xbf16> {
  %0 = moe.layer %x router(%rw) experts(%w13, %w2) {config = #moe.config<experts = 4, top_k = 2, hidden = 8, intermediate = 8, router = <kind = softmax_topk>, activation = <kind = swiglu>, ep_size = 2>}
      : (tensor<?x8xbf16>, tensor<4x8xbf16>, tensor<2x16x8xbf16>, tensor<2x8x8xbf16>) -> tensor<?x8xbf16>
  return %0 : tensor<?x8xbf16>
}
