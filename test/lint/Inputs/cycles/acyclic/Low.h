#ifndef FIXTURE_ACYCLIC_LOW_H
#define FIXTURE_ACYCLIC_LOW_H

namespace fixture {
int lowest(int x);
} // namespace fixture

#endif // FIXTURE_ACYCLIC_LOW_H
