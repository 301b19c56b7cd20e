#include "coordinator/job_spec.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "models/model.h"
#include "worker/dataset.h"

namespace pstrain {
namespace {

// Keeps the first error the text-format parser reports.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!error_.empty()) return;
    // The parser counts from 0.
    error_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

absl::Status Bad(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

absl::Status CheckHosts(
    const google::protobuf::RepeatedPtrField<HostPort>& hosts,
    const char* field, int count) {
  if (!hosts.empty() && hosts.size() != count) {
    return Bad(field, absl::StrCat(hosts.size(), " entries; expected ", count,
                                   " (one per task) or none"));
  }
  for (int i = 0; i < hosts.size(); ++i) {
    const std::string name = absl::StrCat(field, "[", i, "]");
    if (hosts[i].host().empty()) return Bad(name, "host is empty");
    if (hosts[i].port() < 0 || hosts[i].port() > 65535) {
      return Bad(name,
                 absl::StrCat("port ", hosts[i].port(), "; expected 0..65535"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void ApplyJobDefaults(JobSpec* spec) {
  if (spec->model().empty()) spec->set_model("lenet5");
  if (spec->dataset().empty()) spec->set_dataset("fashion_mnist");
  if (spec->data_dir().empty()) {
    spec->set_data_dir("/usr/share/datasets/fashion-mnist");
  }
  if (spec->backend().empty()) spec->set_backend("cpu");
  if (spec->mode().empty()) spec->set_mode("sync");
  if (spec->seed() == 0) spec->set_seed(1);
  if (spec->partition_bytes() == 0) spec->set_partition_bytes(4 << 20);
  if (spec->log_every_steps() == 0) spec->set_log_every_steps(200);
  if (spec->image_size() == 0) spec->set_image_size(224);
  if (spec->num_classes() == 0) spec->set_num_classes(1000);
  if (spec->synthetic_samples() == 0) spec->set_synthetic_samples(12800);
  if (spec->bucket_bytes() == 0) spec->set_bucket_bytes(25 << 20);
  if (spec->compute().empty()) spec->set_compute("model");
  if (spec->registration_timeout_s() == 0) {
    spec->set_registration_timeout_s(600);
  }
  if (!spec->has_max_nonfinite_steps()) spec->set_max_nonfinite_steps(10);
  if (spec->collective().empty() && spec->mode() == "allreduce") {
    spec->set_collective("gloo");
  }
  OptimizerSpec* o = spec->mutable_optimizer();
  if (!o->has_lr()) o->set_lr(1e-3);
  if (!o->has_beta1()) o->set_beta1(0.9);
  if (!o->has_beta2()) o->set_beta2(0.999);
  if (!o->has_epsilon()) o->set_epsilon(1e-8);
  if (!o->has_weight_decay()) o->set_weight_decay(0.0);
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  if (!Model::IsKnown(spec.model())) {
    return Bad("model", absl::StrCat("\"", spec.model(),
                                     "\" is not a known model; expected one "
                                     "of: ",
                                     Model::KnownModels()));
  }
  if (!IsKnownDataset(spec.dataset())) {
    return Bad("dataset", absl::StrCat("\"", spec.dataset(),
                                       "\" is not a known dataset; expected "
                                       "one of: ",
                                       KnownDatasets()));
  }
  if (spec.backend() != "cpu" && spec.backend() != "cuda") {
    return Bad("backend",
               absl::StrCat("\"", spec.backend(), "\"; expected cpu or cuda"));
  }
  const bool allreduce = spec.mode() == "allreduce";
  if (spec.mode() != "sync" && spec.mode() != "async" && !allreduce) {
    return Bad("mode", absl::StrCat("\"", spec.mode(),
                                    "\"; expected sync, async or allreduce"));
  }
  if (allreduce && spec.num_ps() != 0) {
    return Bad("num_ps", absl::StrCat(spec.num_ps(),
                                      "; expected 0 for mode allreduce (it "
                                      "has no parameter servers)"));
  }
  if (allreduce && spec.collective() != "gloo" && spec.collective() != "nccl") {
    return Bad("collective", absl::StrCat("\"", spec.collective(),
                                          "\"; expected gloo or nccl"));
  }
  if (!allreduce && !spec.collective().empty()) {
    return Bad(
        "collective",
        absl::StrCat("\"", spec.collective(), "\" with mode ", spec.mode(),
                     "; expected none (only allreduce has one)"));
  }
  if (spec.collective() == "nccl" && spec.backend() != "cuda") {
    return Bad("collective",
               absl::StrCat("nccl with backend ", spec.backend(),
                            "; expected backend cuda (NCCL runs between "
                            "GPUs)"));
  }
  if (!allreduce && spec.num_ps() < 1) {
    return Bad("num_ps", absl::StrCat(spec.num_ps(), "; expected >= 1"));
  }
  if (spec.bucket_bytes() < 4) {
    return Bad("bucket_bytes",
               absl::StrCat(spec.bucket_bytes(), "; expected >= 4"));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"num_workers", spec.num_workers()},
        {"batch_size", spec.batch_size()},
        {"epochs", spec.epochs()},
        {"log_every_steps", spec.log_every_steps()},
        {"image_size", spec.image_size()},
        {"num_classes", spec.num_classes()}}) {
    if (value < 1) return Bad(field, absl::StrCat(value, "; expected >= 1"));
  }
  if (spec.synthetic_samples() < 1) {
    return Bad("synthetic_samples",
               absl::StrCat(spec.synthetic_samples(), "; expected >= 1"));
  }
  if (spec.max_steps_per_epoch() < 0) {
    return Bad("max_steps_per_epoch",
               absl::StrCat(spec.max_steps_per_epoch(),
                            "; expected 0 (whole epochs) or more"));
  }
  if (spec.compute() == "synthetic") {
    if (spec.model_bytes() < 4 || spec.model_bytes() % 4 != 0) {
      return Bad("model_bytes",
                 absl::StrCat(spec.model_bytes(),
                              "; expected a positive multiple of 4 with "
                              "compute synthetic"));
    }
    if (!(spec.compute_ms() >= 0)) {
      return Bad("compute_ms",
                 absl::StrCat(spec.compute_ms(), "; expected >= 0"));
    }
    if (!(spec.backward_fraction() >= 0 && spec.backward_fraction() <= 1)) {
      return Bad("backward_fraction",
                 absl::StrCat(spec.backward_fraction(),
                              "; expected 0 to 1 (the share of compute_ms "
                              "that is backward)"));
    }
    if (spec.max_steps_per_epoch() < 1) {
      return Bad("max_steps_per_epoch",
                 absl::StrCat(spec.max_steps_per_epoch(),
                              "; expected >= 1 with compute synthetic (it "
                              "has no dataset to make epochs of)"));
    }
    if (!spec.init_from().empty() || !spec.checkpoint_dir().empty()) {
      return Bad(spec.init_from().empty() ? "checkpoint_dir" : "init_from",
                 "compute synthetic has no model to load or save");
    }
  } else if (spec.compute() != "model") {
    return Bad("compute", absl::StrCat("\"", spec.compute(),
                                       "\"; expected model or synthetic"));
  }
  if (spec.max_nonfinite_steps() < 0 ||
      spec.max_nonfinite_steps() > 1000000) {
    return Bad("max_nonfinite_steps",
               absl::StrCat(spec.max_nonfinite_steps(),
                            "; expected 0 to 1000000"));
  }
  if (spec.max_restarts() < 0 || spec.max_restarts() > 1000) {
    return Bad("max_restarts",
               absl::StrCat(spec.max_restarts(), "; expected 0 to 1000"));
  }
  if (!(spec.checkpoint_every_secs() >= 0 &&
        spec.checkpoint_every_secs() <= 1e7)) {
    return Bad("checkpoint_every_secs",
               absl::StrCat(spec.checkpoint_every_secs(),
                            "; expected 0 to 1e7 seconds"));
  }
  if (spec.max_restarts() > 0 && spec.mode() == "allreduce") {
    return Bad("max_restarts",
               absl::StrCat(spec.max_restarts(),
                            "; allreduce jobs do not recover from failures "
                            "(only parameter-server jobs do): expected 0"));
  }
  if (spec.registration_timeout_s() < 1 ||
      spec.registration_timeout_s() > 7 * 24 * 3600) {
    return Bad("registration_timeout_s",
               absl::StrCat(spec.registration_timeout_s(),
                            "; expected 1 to 604800 seconds (0: 600)"));
  }
  if (spec.partition_bytes() < 4 || spec.partition_bytes() % 4 != 0) {
    return Bad("partition_bytes",
               absl::StrCat(spec.partition_bytes(),
                            "; expected a positive multiple of 4"));
  }
  const OptimizerSpec& o = spec.optimizer();
  if (!(o.lr() > 0)) {
    return Bad("optimizer.lr", absl::StrCat(o.lr(), "; expected > 0"));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"optimizer.beta1", o.beta1()},
        {"optimizer.beta2", o.beta2()}}) {
    if (!(value >= 0 && value < 1)) {
      return Bad(field, absl::StrCat(value, "; expected 0 <= beta < 1"));
    }
  }
  if (!(o.epsilon() > 0)) {
    return Bad("optimizer.epsilon",
               absl::StrCat(o.epsilon(), "; expected > 0"));
  }
  if (!(o.weight_decay() >= 0)) {
    return Bad("optimizer.weight_decay",
               absl::StrCat(o.weight_decay(), "; expected >= 0"));
  }
  absl::Status s = CheckHosts(spec.ps_hosts(), "ps_hosts", spec.num_ps());
  if (!s.ok()) return s;
  s = CheckHosts(spec.worker_hosts(), "worker_hosts", spec.num_workers());
  if (!s.ok()) return s;
  // Every task needs its own address: the same host:port twice, in either
  // list, would make the second task fail to bind.
  std::map<std::pair<std::string, int>, std::string> seen;
  for (const auto& [field, hosts] :
       {std::pair<const char*,
                  const google::protobuf::RepeatedPtrField<HostPort>*>{
            "ps_hosts", &spec.ps_hosts()},
        {"worker_hosts", &spec.worker_hosts()}}) {
    for (int i = 0; i < hosts->size(); ++i) {
      const HostPort& h = (*hosts)[i];
      if (h.port() == 0) continue;
      const std::string name = absl::StrCat(field, "[", i, "]");
      auto [it, inserted] =
          seen.emplace(std::make_pair(h.host(), h.port()), name);
      if (!inserted) {
        return Bad(name,
                   absl::StrCat(h.host(), ":", h.port(),
                                " is already the address of ", it->second));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text,
                                     const std::string& source) {
  JobSpec spec;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", errors.error()));
  }
  ApplyJobDefaults(&spec);
  absl::Status s = ValidateJobSpec(spec);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return spec;
}

AdamOptions AdamOptionsOf(const OptimizerSpec& optimizer) {
  AdamOptions adam;
  adam.lr = static_cast<float>(optimizer.lr());
  adam.beta1 = static_cast<float>(optimizer.beta1());
  adam.beta2 = static_cast<float>(optimizer.beta2());
  adam.epsilon = static_cast<float>(optimizer.epsilon());
  adam.weight_decay = static_cast<float>(optimizer.weight_decay());
  return adam;
}

}  // namespace pstrain
