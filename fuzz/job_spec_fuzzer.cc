// Fuzzes a submitted job spec (protobuf text format, proto/job.proto) as
// the CLI and the coordinator read it: ParseJobSpec, then, for a spec it
// accepts, what the coordinator does next (JobTable::Submit, the Adam
// options the shards get). An accepted spec must validate again after a
// print-and-parse round trip.
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "coordinator/job_spec.h"
#include "coordinator/job_table.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/text_format.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Malformed text makes protobuf log each error; keep the fuzzer quiet.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<pstrain::JobSpec> spec =
      pstrain::ParseJobSpec(text, "fuzz.pbtxt");
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(pstrain::ValidateJobSpec(*spec).ok());
  std::string printed;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(*spec, &printed));
  absl::StatusOr<pstrain::JobSpec> again =
      pstrain::ParseJobSpec(printed, "printed.pbtxt");
  FUZZ_CHECK(again.ok());
  const pstrain::AdamOptions adam = pstrain::AdamOptionsOf(spec->optimizer());
  FUZZ_CHECK(std::isfinite(adam.lr) && adam.lr > 0);
  FUZZ_CHECK(std::isfinite(adam.epsilon) && adam.epsilon > 0);
  FUZZ_CHECK(adam.beta1 >= 0 && adam.beta1 < 1);
  FUZZ_CHECK(adam.beta2 >= 0 && adam.beta2 < 1);
  // The coordinator stores the job with one entry per task.
  pstrain::JobTable table;
  absl::StatusOr<std::string> id =
      table.Submit(*spec, absl::FromUnixSeconds(1700000000));
  if (id.ok()) FUZZ_CHECK(table.Get(*id).ok());
  return 0;
}
