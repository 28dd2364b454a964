// Input for include-cycles.test: one header declares what two files
// define, and each calls the other's function through it.
#ifndef FIXTURE_TWO_SHARED_H
#define FIXTURE_TWO_SHARED_H

namespace fixture::two {

int first(int x);
int second(int x);

} // namespace fixture::two

#endif // FIXTURE_TWO_SHARED_H
