//===- EpProcesses.h - expert-parallel ranks as local processes -*- C++ -*-===//
//
// An expert-parallel layer runs as one process per rank on this host,
// connected over libfabric (the provider FI_PROVIDER names, else shm).
// Rank r takes the r-th of N near-equal contiguous slices of the tokens
// (the first T mod N ranks one more) and its experts' slice of each expert
// weight; a GPU layer's rank r runs on GPU r mod (GPUs present). The ranks
// write their outputs in place into memory shared with the parent, which
// gathers them whole, in token order.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TOOLS_MOE_EXEC_EPPROCESSES_H
#define MOE_TOOLS_MOE_EXEC_EPPROCESSES_H

#include <string>

namespace moe::exec {

struct EpOptions;
struct HostTensors;
struct LayerLibrary;

/// Runs the expert-parallel layer `repeat` times on `tensors` (its inputs
/// whole, all experts' weights included), its outputs gathered into
/// `tensors`. Returns why it failed (a line per failed rank), or "" with
/// `microseconds` the slowest rank's mean time per run.
std::string runExpertParallel(LayerLibrary &layer, const EpOptions &options,
                              long repeat, HostTensors &tensors,
                              double &microseconds);

} // namespace moe::exec

#endif // MOE_TOOLS_MOE_EXEC_EPPROCESSES_H
