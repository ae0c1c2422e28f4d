// doctest's main(), shared by every test executable. Checkpoint keys go to a
// key store of the test run's own (DPGRAD_KEY_STORE, optim/checkpoint/checkpoint_key.hpp),
// inherited by the programs the tests start, and removed at the end.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/key_store.hpp"

int main(int argc, char** argv) {
  dpgrad::test::KeyStoreForTests store;
  doctest::Context context(argc, argv);
  return context.run();
}
