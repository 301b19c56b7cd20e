#include "common/utf8.h"

#include "gtest/gtest.h"
#include "proto/job.pb.h"

namespace pstrain {
namespace {

TEST(Utf8Test, NamesTheFirstFieldThatIsNotUtf8ByPath) {
  JobSpec spec;
  spec.set_model("lenet5");
  spec.set_data_dir("/données/€/😀");  // 2-, 3- and 4-byte sequences
  spec.add_ps_hosts()->set_host("a");
  spec.add_ps_hosts()->set_host("b");
  spec.mutable_optimizer()->set_name("sgd");
  EXPECT_TRUE(CheckUtf8Fields(spec).ok());

  JobSpec bad = spec;
  bad.set_data_dir("/data\xff");
  absl::Status s = CheckUtf8Fields(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "data_dir: \"/data\\xff\" is not UTF-8; expected UTF-8 text");

  bad = spec;
  bad.mutable_ps_hosts(1)->set_host("b\xc3");  // cut 2-byte sequence
  EXPECT_EQ(CheckUtf8Fields(bad).message(),
            "ps_hosts[1].host: \"b\\xc3\" is not UTF-8; expected UTF-8 text");

  bad = spec;
  bad.mutable_optimizer()->set_lr_schedule("\xc0\xaf");  // overlong '/'
  EXPECT_EQ(CheckUtf8Fields(bad).message(),
            "optimizer.lr_schedule: \"\\xc0\\xaf\" is not UTF-8; expected "
            "UTF-8 text");

  bad = spec;
  bad.set_model("\xed\xa0\x80");  // a UTF-16 surrogate, U+D800
  EXPECT_FALSE(CheckUtf8Fields(bad).ok());
  bad.set_model(std::string(1000, '\x80'));  // one line, cut
  s = CheckUtf8Fields(bad);
  EXPECT_EQ(s.message().find('\n'), absl::string_view::npos);
  EXPECT_LT(s.message().size(), 1300u);
  EXPECT_NE(s.message().find("...\" is not UTF-8"), absl::string_view::npos);
}

}  // namespace
}  // namespace pstrain
