// Input for include-cycles.test: a class whose methods are defined in two
// files that call each other's.
#ifndef FIXTURE_METHODS_COUNTER_H
#define FIXTURE_METHODS_COUNTER_H

namespace fixture {

class Counter {
public:
  void add(int x);
  int total() const { return value; }
  void print() const;

private:
  int value = 0;
};

} // namespace fixture

#endif // FIXTURE_METHODS_COUNTER_H
