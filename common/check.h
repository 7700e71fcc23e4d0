// common/check.h — invariants that, when broken, mean a bug in Baton itself.
//
// BATON_CHECK aborts loudly in every build type. Use it only for conditions the
// program guarantees; anything that input or peers can cause returns a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

#define BATON_CHECK(cond)                                                                 \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: BATON_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
