// RUN: moe-opt %s -split-input-file --moe-build-kernels=ep-max-tokens=64 -verify-diagnostics | FileCheck %s
// RUN: moe-opt %s -split-input-file --moe-sm90a-pipeline=stop-after=ptx -verify-diagnostics | FileCheck %s --check-prefix=PTX

// The combine's two kernels. The send: 264 blocks of 512 threads stride
// over the rows that arrived, and each row goes back in bf16, 16 bytes at a
// time, to its token's rank at the return row the dispatch gave it; a row
// whose rank or return row is outside the combine area (2 ranks, 4096
// tokens x top-2 = 8192 rows) is dropped. After a system-scope fence the
// blocks count themselves done, and the last (the 264th) raises each rank's
// flag. A row whose stamp is not this forward's (no record of this forward
// filled it: stamps at state byte 887552) is not sent. Before raising the
// flags the last block checks each rank's rows as its counts claimed them
// (filled and found-no-row counts at 953088 and 953096 against the rows
// owed it at 832): on a mismatch it records kRowsMismatch (3) and writes a
// nonzero word beside the rank's flag (flag at 821504, word at 821512).
// The wait: one block, a thread per rank, spins on its flag against a time
// limit, then records kRowsRefused (4) where a rank refused its rows.
// CHECK-LABEL: func.func @exchange
// CHECK-SAME: #moe.launch<kernel = @moe_ep_combine_send, work = 264, block = 512
// CHECK-SAME: #moe.launch<kernel = @moe_ep_combine_wait, work = 1, block = 64
// CHECK: gpu.func @moe_ep_combine_send(
// CHECK: gpu.func @moe_ep_combine_wait(
// PTX-LABEL: .visible .entry moe_ep_combine_send(
// PTX: .maxntid 512, 1, 1
// PTX: setp.lt.u32 {{[^,]*}}, {{[^,]*}}, 2;
// PTX: setp.lt.u32 {{[^,]*}}, {{[^,]*}}, 8192;
// PTX: ld.global.b32 {{[^,]*}}, [{{[^]]*}}+887552];
// Every row's loads before its stores.
// PTX: ld.global.v4.b32
// PTX: ld.global.v4.b32
// PTX: st.v4.b32
// PTX: fence.sc.sys;
// PTX: atom.global.add.u32 {{[^,]*}}, {{[^,]*}}, 1;\0A\09setp.ne.b32 {{[^,]*}}, {{[^,]*}}, 263;
// PTX: ld.global.b32 {{[^,]*}}, [{{[^]]*}}+832];
// PTX: ld.global.b32 {{[^,]*}}, [{{[^]]*}}+953088];
// PTX: ld.global.b32 {{[^,]*}}, [{{[^]]*}}+953096];
// PTX: atom.acq_rel.sys.global.cas.b32 {{[^,]*}}, [{{[^]]*}}+4], 0, 3;
// PTX: st.b32 \09[{{[^]]*}}+821512]
// PTX: fence.sc.sys;
// PTX: st.volatile.b32 \09[{{[^]]*}}+821504]
// PTX: st.volatile.b32 \09[{{[^]]*}}+821504]
// PTX-LABEL: .visible .entry moe_ep_combine_wait(
// PTX: .maxntid 64, 1, 1
// PTX: %globaltimer;
// PTX: ld.volatile.global.b32
// PTX: fence.acq_rel.sys;
// PTX: atom.acq_rel.sys.global.cas.b32 {{[^,]*}}, [{{[^]]*}}+4], 0, 1;
// PTX: ld.global.b32 {{[^,]*}}, [{{[^]]*}}+821512];
// PTX: atom.acq_rel.sys.global.cas.b32 {{[^,]*}}, [{{[^]]*}}+4], 0, 4;
func.func @exchange(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16> {
  %sent, %rows = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  %back = moe.ep_combine_send %d, %origin : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
  %g = moe.ep_combine_recv %back, %rows : (tensor<2xi32>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  %out = moe.combine %g, %rows : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  return %out : tensor<?x8xbf16>
}

// -----

// The send returns rows to where a receive took them from: rows from
// elsewhere have no return rows.
func.func @rows_not_received(%d: tensor<?x8xbf16>, %origin: tensor<?x2xi32>) -> tensor<2xi32> {
  // expected-error @below {{must return rows that a moe.ep_dispatch_recv of the same function gave}}
  %back = moe.ep_combine_send %d, %origin : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
  return %back : tensor<2xi32>
}

// -----

// The send's two forms: a bucket of at most 264 tokens (8 here) takes a
// block a token and one more; the plan for any count strides over 264
// blocks, each walking tokens.
// CHECK-LABEL: func.func @exchange_buckets
// CHECK-SAME: moe.bucket_plans = [#moe.launch_plan<
// CHECK-SAME: #moe.launch<kernel = @moe_ep_dispatch_send_1, work = 1 * T, extra_blocks = 1, block = 512
// CHECK-SAME: max_tokens = 8>]
// CHECK-SAME: #moe.launch<kernel = @moe_ep_dispatch_send, work = 264, block = 512
func.func @exchange_buckets(%x: tensor<?x8xbf16>, %ids: tensor<?x2xi32>) -> tensor<?x8xbf16>
    attributes {moe.token_buckets = array<i64: 8>} {
  %sent, %rows = moe.ep_dispatch_send %x, %ids {local_experts = 2 : i64} : (tensor<?x8xbf16>, tensor<?x2xi32>) -> (tensor<2xi32>, tensor<?x2xi32>)
  %d, %c, %o, %origin = moe.ep_dispatch_recv %sent : (tensor<2xi32>) -> (tensor<?x8xbf16>, tensor<2xi32>, tensor<3xi32>, tensor<?x2xi32>)
  %back = moe.ep_combine_send %d, %origin : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<2xi32>
  %g = moe.ep_combine_recv %back, %rows : (tensor<2xi32>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  %out = moe.combine %g, %rows : (tensor<?x8xbf16>, tensor<?x2xi32>) -> tensor<?x8xbf16>
  return %out : tensor<?x8xbf16>
}
