#ifndef FIXTURE_ACYCLIC_HIGH_H
#define FIXTURE_ACYCLIC_HIGH_H

namespace fixture {
int highest(int x);
} // namespace fixture

#endif // FIXTURE_ACYCLIC_HIGH_H
