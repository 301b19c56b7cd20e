#include "cli/trace_merge.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags_util.h"
#include "common/status_macros.h"

namespace pstrain {

absl::StatusOr<TraceMergeSummary> MergeTraces(const std::string& trace_dir,
                                              const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code error;
  TraceMergeSummary summary;
  const fs::path out_path = fs::weakly_canonical(out, error);
  for (fs::directory_iterator it(trace_dir, error), end; !error && it != end;
       it.increment(error)) {
    const fs::path& p = it->path();
    if (p.extension() != ".json" || fs::weakly_canonical(p) == out_path) {
      continue;
    }
    summary.files.push_back(p.string());
  }
  if (error) {
    return ErrnoToStatus(error.value(),
                         absl::StrCat(trace_dir, ": cannot list"));
  }
  std::sort(summary.files.begin(), summary.files.end());
  if (summary.files.empty()) {
    return absl::NotFoundError(absl::StrCat(
        trace_dir,
        ": no task trace (*.json); was the job run with --trace (trace: "
        "true and a metrics_dir)?"));
  }
  nlohmann::json metadata = nlohmann::json::array();
  std::vector<nlohmann::json> events;
  nlohmann::json tasks = nlohmann::json::array();
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const std::string& path : summary.files) {
    // A regular file, read without blocking (common/flags_util.h).
    std::string body;
    RETURN_IF_ERROR(ReadFile(path, &body));
    // A task still running (or killed) has not closed its array yet.
    nlohmann::json file =
        nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (file.is_discarded()) {
      while (!body.empty() && (body.back() == '\n' || body.back() == ' ' ||
                               body.back() == ',')) {
        body.pop_back();
      }
      file = nlohmann::json::parse(body + "]", nullptr,
                                   /*allow_exceptions=*/false);
    }
    if (file.is_discarded() || !file.is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path,
          ": not a task trace (expected a JSON array of trace events, "
          "as common/trace.h writes)"));
    }
    int64_t offset = 0;
    int64_t rtt = -1;
    int64_t dropped = 0;
    std::string task;
    for (const nlohmann::json& e : file) {
      if (!e.is_object() || e.value("ph", "") != "M") continue;
      const nlohmann::json args = e.value("args", nlohmann::json::object());
      const std::string name = e.value("name", "");
      if (name == "pstrain_clock") {
        offset = args.value("offset_us", int64_t{0});
        rtt = args.value("rtt_us", int64_t{-1});
      } else if (name == "pstrain_dropped") {
        dropped = args.value("events", int64_t{0});
      } else if (name == "process_name") {
        task = args.value("name", "");
      }
    }
    summary.max_rtt_us = std::max(summary.max_rtt_us, rtt);
    tasks.push_back({{"file", fs::path(path).filename().string()},
                     {"task", task},
                     {"clock_offset_us", offset},
                     {"clock_rtt_us", rtt},
                     {"dropped_events", dropped}});
    for (nlohmann::json& e : file) {
      if (!e.is_object()) continue;
      if (e.value("ph", "") != "X") {
        metadata.push_back(std::move(e));
        continue;
      }
      if (!e.contains("ts") || !e["ts"].is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": an X event without an integer ts"));
      }
      const int64_t ts = e["ts"].get<int64_t>() + offset;
      e["ts"] = ts;
      origin = std::min(origin, ts);
      events.push_back(std::move(e));
    }
  }
  if (events.empty()) origin = 0;
  std::sort(events.begin(), events.end(),
            [](const nlohmann::json& a, const nlohmann::json& b) {
              return a["ts"].get<int64_t>() < b["ts"].get<int64_t>();
            });
  nlohmann::json merged_events = std::move(metadata);
  for (nlohmann::json& e : events) {
    e["ts"] = e["ts"].get<int64_t>() - origin;
    merged_events.push_back(std::move(e));
  }
  summary.events = static_cast<int64_t>(events.size());
  const nlohmann::json merged = {
      {"traceEvents", std::move(merged_events)},
      {"displayTimeUnit", "ms"},
      {"otherData", {{"origin_unix_us", origin}, {"tasks", std::move(tasks)}}}};
  const std::string tmp = out + ".tmp";
  {
    std::ofstream file(tmp);
    if (!file) return ErrnoToStatus(errno, tmp);
    file << merged.dump();
    file.close();
    if (!file) return ErrnoToStatus(errno, absl::StrCat(tmp, ": write"));
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat(out, ": rename"));
  }
  return summary;
}

}  // namespace pstrain
