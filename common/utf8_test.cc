#include "common/utf8.h"

#include <random>
#include <string>

#include "google/protobuf/stubs/common.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
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

bool IsUtf8(const std::string& text) {
  return google::protobuf::internal::IsStructurallyValidUTF8(
      text.data(), static_cast<int>(text.size()));
}

TEST(Utf8Test, EscapeNonUtf8EscapesEachByteThatBeginsNoCharacter) {
  EXPECT_EQ(EscapeNonUtf8(""), "");
  EXPECT_EQ(EscapeNonUtf8("/données/€/😀"), "/données/€/😀");
  EXPECT_EQ(EscapeNonUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(EscapeNonUtf8("photo-\xff.jpg"), "photo-\\xff.jpg");
  EXPECT_EQ(EscapeNonUtf8("b\xc3"), "b\\xc3");  // cut short at the end
  EXPECT_EQ(EscapeNonUtf8("\xc3x\xc3\xa9"), "\\xc3x\xc3\xa9");
  // An overlong '/', a UTF-16 surrogate (U+D800), past U+10FFFF.
  EXPECT_EQ(EscapeNonUtf8("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(EscapeNonUtf8("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(EscapeNonUtf8("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(EscapeNonUtf8("\xf4\x8f\xbf\xbf"), "\xf4\x8f\xbf\xbf");
}

// Against protobuf's own check, on random bytes biased to UTF-8's lead and
// continuation bytes: the result is always UTF-8, and equal to the input
// exactly when the input was UTF-8.
TEST(Utf8Test, EscapeNonUtf8AgreesWithProtobufsCheck) {
  std::mt19937 rng(7);
  const unsigned char kBytes[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f,
                                  0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0,
                                  0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1,
                                  0xf3, 0xf4, 0xf5, 0xff};
  int valid = 0;
  for (int trial = 0; trial < 200000; ++trial) {
    std::string text(rng() % 6, '\0');
    for (char& c : text) {
      c = static_cast<char>(kBytes[rng() % sizeof(kBytes)]);
    }
    const std::string escaped = EscapeNonUtf8(text);
    ASSERT_TRUE(IsUtf8(escaped)) << testing::PrintToString(text);
    ASSERT_EQ(escaped == text, IsUtf8(text)) << testing::PrintToString(text);
    valid += IsUtf8(text);
  }
  EXPECT_GT(valid, 1000);  // both kinds were tried
}

TEST(Utf8Test, EscapeNonUtf8FieldsMakesEveryStringFieldUtf8) {
  HeartbeatRequest request;
  request.mutable_task()->set_job_id("job-1");
  request.add_log_lines("fine");
  request.add_log_lines("cannot open photo-\xff.jpg");
  request.mutable_result()->set_model("m\xc3");
  request.mutable_result()->add_epoch_results()->set_test_accuracy(0.5);
  EXPECT_EQ(EscapeNonUtf8Fields(&request), 2);
  EXPECT_EQ(request.log_lines(0), "fine");
  EXPECT_EQ(request.log_lines(1), "cannot open photo-\\xff.jpg");
  EXPECT_EQ(request.result().model(), "m\\xc3");
  EXPECT_EQ(request.task().job_id(), "job-1");
  HeartbeatRequest reparsed;  // proto3 refuses a string that is not UTF-8
  EXPECT_TRUE(reparsed.ParseFromString(request.SerializeAsString()));
  EXPECT_EQ(EscapeNonUtf8Fields(&request), 0);

  // `bytes` fields hold anything and are left as they are.
  KvSetRequest kv;
  kv.set_key("gloo/0");
  kv.set_value(std::string("\xff\x00\x01", 3));
  EXPECT_EQ(EscapeNonUtf8Fields(&kv), 0);
  EXPECT_EQ(kv.value(), std::string("\xff\x00\x01", 3));
}

}  // namespace
}  // namespace pstrain
