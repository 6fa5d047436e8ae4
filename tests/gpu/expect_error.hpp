// The one check of "this call must fail this way", for the tests of refused arguments and of timeouts.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "epx/error.hpp"

namespace epx::test {

// Runs `call`, which must throw an epx::Error of `kind` whose message holds every one of `words`.
// `who` (say, "rank 1") starts every failure message.
inline void expect_error(ErrorKind kind, std::initializer_list<std::string> words, const std::function<void()>& call,
                         const std::string& who = "") {
  const std::string prefix = who.empty() ? "" : who + ": ";
  std::string all;
  for (const std::string& w : words) all += (all.empty() ? "'" : " and '") + w + "'";
  try {
    call();
    ADD_FAILURE() << prefix << "returned; expected an error mentioning " << all;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << prefix << e.what();
    for (const std::string& w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << prefix << "want '" << w << "' in: " << e.what();
    }
  }
}

}  // namespace epx::test
