// Stop requests (core/signals.h): the handlers record the strongest request, a later weaker one does not lower it,
// SIGTERM makes throw_if_terminated throw an InterruptedError (exit code 75). The ranks' agreement (agree_stop) is
// tested end to end under mpirun (tests/app/test_signals.cpp: the signal on one rank stops every rank).
#include <csignal>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/signals.h"

namespace tessera::core {
namespace {

class Signals : public ::testing::Test {
 protected:
  void SetUp() override {
    install_stop_handlers();
    reset_stop_request();
  }
  void TearDown() override { reset_stop_request(); }
};

TEST_F(Signals, TheStrongestRequestIsKept) {
  EXPECT_EQ(stop_requested(), StopRequest::none);
  EXPECT_NO_THROW(throw_if_terminated("shard-00001.h5"));
  std::raise(SIGUSR1);  // the handler has run when raise returns
  EXPECT_EQ(stop_requested(), StopRequest::finish_item);
  EXPECT_NO_THROW(throw_if_terminated("shard-00001.h5")) << "SIGUSR1 lets the item in hand finish";
  std::raise(SIGTERM);
  EXPECT_EQ(stop_requested(), StopRequest::now);
  std::raise(SIGUSR1);
  EXPECT_EQ(stop_requested(), StopRequest::now) << "a weaker request does not lower a stronger one";
  EXPECT_STREQ(signal_name(stop_requested()), "SIGTERM");
}

TEST_F(Signals, TermThrowsAnInterruptedErrorNamingWhatIsLeft) {
  std::raise(SIGTERM);
  try {
    throw_if_terminated("slide 'a'");
    FAIL() << "no InterruptedError";
  } catch (const InterruptedError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::interrupted);
    EXPECT_EQ(exit_code_for(e.kind()), 75);
    EXPECT_STREQ(e.what(), "SIGTERM received: stopped; slide 'a' is left to the rerun");
  }
}

}  // namespace
}  // namespace tessera::core
