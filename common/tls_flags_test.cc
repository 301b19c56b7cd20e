#include "common/tls_flags.h"

#include <cstdlib>

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

TEST(TlsOptionsTest, CliPrefersTheAdminFolder) {
  setenv("PSTRAIN_TLS_DIR", "/nodes", 1);
  auto tasks = TlsOptionsFromFlags("test");
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  EXPECT_EQ(tasks->dir, "/nodes");
  auto admin = AdminTlsOptionsFromFlags("test");
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ(admin->dir, "/nodes");
  setenv("PSTRAIN_ADMIN_TLS_DIR", "/head", 1);
  admin = AdminTlsOptionsFromFlags("test");
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ(admin->dir, "/head");
  tasks = TlsOptionsFromFlags("test");
  ASSERT_TRUE(tasks.ok()) << tasks.status();
  EXPECT_EQ(tasks->dir, "/nodes");  // a task never reads the admin's folder
  unsetenv("PSTRAIN_ADMIN_TLS_DIR");
  unsetenv("PSTRAIN_TLS_DIR");
}

}  // namespace
}  // namespace pstrain
