#include "common/tls_flags.h"

#include "gtest/gtest.h"

namespace pstrain {
namespace {

TEST(IsLoopbackTest, LoopbackAddressesAndNames) {
  for (const char* host :
       {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"}) {
    EXPECT_TRUE(IsLoopback(host)) << host;
  }
}

TEST(IsLoopbackTest, NamesAreResolvedNotReadAsText) {
  // Looks like 127.x, but is a name anyone can point anywhere (and here
  // resolves to nothing): not loopback.
  for (const char* host :
       {"127.evil.example", "127.0.0.1.nip.example", "localhost.evil.example",
        "0.0.0.0", "::", "10.0.0.5", "", "[::1", "127.0.0.1:80"}) {
    EXPECT_FALSE(IsLoopback(host)) << host;
  }
}

}  // namespace
}  // namespace pstrain
