// Input for include-cycles.test: a header that lists what two files
// define, only one of which calls the other; the traps below must not
// make a cycle.
#ifndef FIXTURE_ACYCLIC_KERNELS_H
#define FIXTURE_ACYCLIC_KERNELS_H

namespace fixture {

struct Table {
  int rows;
  int size() const;
};

int buildLow(int x);   // Low.cpp
int buildHigh(int x);  // High.cpp
int tally(int x);      // Low.cpp
int scale(int x);      // Low.cpp

} // namespace fixture

#endif // FIXTURE_ACYCLIC_KERNELS_H
