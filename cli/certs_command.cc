#include "cli/certs_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags_util.h"
#include "common/tls.h"

ABSL_FLAG(std::string, nodes_out, "",
          "certs: also a folder for the nodes: ca.pem and the shards' and "
          "workers' certificates and keys, without ca.key, admin.key and the "
          "coordinator's key (those stay in --out, on the head node).");
ABSL_FLAG(std::string, hosts, "",
          "certs: host names or IP addresses, comma-separated, added to "
          "every certificate.");
// cli/job_commands.cc's (shared with trace).
ABSL_DECLARE_FLAG(std::string, out);
// Shared with run and launch-lines.
ABSL_DECLARE_FLAG(std::string, num_ps);
ABSL_DECLARE_FLAG(int, num_workers);
ABSL_DECLARE_FLAG(std::string, job);

namespace pstrain {
namespace {

constexpr char kProgram[] = "pstrain certs";

// --job: an id, or "*" when none was named (launch-lines' placeholder
// default "$JOB" means none), said in a warning line when it applies to
// any task certificate.
absl::StatusOr<std::string> JobFromFlag(int num_tasks) {
  std::string job = absl::GetFlag(FLAGS_job);
  if (job.empty() || job == "$JOB") job = "*";
  if (absl::Status s = CheckCertificateJob(job); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--job=", job, ": ", s.message()));
  }
  if (job == "*" && num_tasks > 0) {
    std::fprintf(stderr,
                 "%s: warning: no --job: these task certificates serve EVERY "
                 "job of this CA (a stolen task key reaches them all); pass "
                 "--job=ID (the id `pstrain submit` printed) to confine them "
                 "to one job\n",
                 kProgram);
  }
  return job;
}

// The identities to mint in `out`: the coordinator and the administrator
// once (a job's task certificates minted later do not replace a running
// coordinator's key; remove them to renew), and the tasks of `job`.
std::vector<TlsIdentity> IdentitiesToMint(const std::string& out, int num_ps,
                                          int num_workers,
                                          const std::string& job) {
  std::vector<TlsIdentity> identities;
  for (const TlsIdentity& id :
       {TlsIdentity{TlsRole::kCoordinator}, TlsIdentity{TlsRole::kAdmin}}) {
    const std::string pem = absl::StrCat(out, "/", IdentityStem(id), ".pem");
    if (access(pem.c_str(), F_OK) != 0) identities.push_back(id);
  }
  for (int i = 0; i < num_ps; ++i) {
    identities.push_back(TlsIdentity{TlsRole::kPs, i, job});
  }
  for (int j = 0; j < num_workers; ++j) {
    identities.push_back(TlsIdentity{TlsRole::kWorker, j, job});
  }
  return identities;
}

// `path` made absolute with its existing part's links resolved, to compare
// two spellings of a folder that may not exist yet.
std::filesystem::path Resolved(const std::string& path) {
  std::error_code error;
  std::filesystem::path p = std::filesystem::weakly_canonical(
      std::filesystem::absolute(path, error), error);
  if (error) return std::filesystem::path(path).lexically_normal();
  // "a/b/" and "a/b" name the same folder.
  return p.has_filename() ? p : p.parent_path();
}

// OK when --nodes_out=`nodes_out` can take the nodes' files without
// replacing anything: it is not --out's folder however spelled, not a link
// or a file, holds no CA's key and none of the files it would get (every
// nodes folder is a new one: one per job). Checked before anything is
// written, so that a refused command leaves both folders as they were.
absl::Status CheckNodesOut(const std::string& out, const std::string& nodes_out,
                           const std::vector<TlsIdentity>& identities) {
  namespace fs = std::filesystem;
  const std::string flag = absl::StrCat("--nodes_out=", nodes_out);
  std::error_code error;
  if (Resolved(out) == Resolved(nodes_out) ||
      fs::equivalent(out, nodes_out, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the same folder as --out=", out,
                     " (the head node's, with ca.key); expected a folder of "
                     "its own for the nodes"));
  }
  // --out inside it would put ca.key on the nodes' share.
  const fs::path head = Resolved(out);
  const fs::path nodes = Resolved(nodes_out);
  if (std::mismatch(nodes.begin(), nodes.end(), head.begin(), head.end())
          .first == nodes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": holds --out=", out,
                     " (the head node's keys); expected a folder of its own "
                     "for the nodes, outside --out"));
  }
  // "link/" would name the folder it points to: the link itself is looked
  // at.
  std::string bare = nodes_out;
  while (bare.size() > 1 && bare.back() == '/') bare.pop_back();
  struct stat st;
  if (lstat(bare.c_str(), &st) != 0) return absl::OkStatus();  // made
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
      access(nodes_out.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ",
        S_ISLNK(st.st_mode)      ? "a link"
        : !S_ISDIR(st.st_mode)   ? "not a folder"
        : st.st_uid != geteuid() ? "another user's folder"
                                 : "a folder this user cannot write in",
        "; expected a new folder, or one of this user's"));
  }
  for (const char* key : {"ca.key", "admin.key", "coordinator.key"}) {
    if (fs::exists(fs::symlink_status(fs::path(nodes_out) / key, error))) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": holds ", key,
          " (a head node's folder); expected a folder of its own for the "
          "nodes"));
    }
  }
  for (const std::string& name : NodeFileNames(identities)) {
    if (fs::exists(fs::symlink_status(fs::path(nodes_out) / name, error))) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, ": already holds ", name,
          "; expected a new folder (certs never replaces a certificate or "
          "key: one nodes folder per job, or remove the old one first)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int CertsCommand(const std::vector<std::string>& args) {
  if (!args.empty()) {
    PrintError(kProgram, absl::StrCat("unexpected argument \"", args[0],
                                      "\"; expected flags only"));
    return 2;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    PrintError(kProgram, "--out is not set; expected a folder to write to");
    return 2;
  }
  int num_ps = 0;
  if (!absl::SimpleAtoi(absl::GetFlag(FLAGS_num_ps), &num_ps) || num_ps < 0 ||
      num_ps > 4096) {
    PrintError(kProgram, absl::StrCat("--num_ps=", absl::GetFlag(FLAGS_num_ps),
                                      ": expected one number, 0 to 4096"));
    return 2;
  }
  const int num_workers = absl::GetFlag(FLAGS_num_workers);
  if (num_workers < 0 || num_workers > 4096) {
    PrintError(kProgram, absl::StrCat("--num_workers=", num_workers,
                                      ": expected 0 to 4096"));
    return 2;
  }
  const absl::StatusOr<std::string> job = JobFromFlag(num_ps + num_workers);
  if (!job.ok()) {
    PrintError(kProgram, job.status().message());
    return 2;
  }
  std::vector<std::string> hosts;
  for (absl::string_view h :
       absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipEmpty())) {
    hosts.emplace_back(h);
  }
  const std::vector<TlsIdentity> identities =
      IdentitiesToMint(out, num_ps, num_workers, *job);
  const std::string nodes_out = absl::GetFlag(FLAGS_nodes_out);
  if (!nodes_out.empty()) {
    if (absl::Status s = CheckNodesOut(out, nodes_out, identities); !s.ok()) {
      PrintError(kProgram, s.message());
      return 2;
    }
  }
  if (absl::Status s = MakeCertificates(out, identities, hosts); !s.ok()) {
    PrintError(kProgram, s.message());
    return 2;
  }
  std::printf(
      "wrote %s/: ca.pem, ca.key, the coordinator's and admin's certificate "
      "and key (unless there already), and those of ps-0..%d (and "
      "ps-<i>-client) and worker-0..%d of job %s (folder 0700, keys 0600). "
      "Give every node ca.pem and its tasks' .pem and .key (--nodes_out); "
      "keep ca.key, admin.key and coordinator.key off the nodes.\n",
      out.c_str(), num_ps - 1, num_workers - 1, job->c_str());
  if (nodes_out.empty()) return 0;
  if (absl::Status s = CopyForNodes(out, nodes_out, identities); !s.ok()) {
    PrintError(kProgram,
               absl::StrCat("--nodes_out=", nodes_out, ": ", s.message()));
    return 2;
  }
  std::printf(
      "wrote %s/: the nodes' files (ca.pem and the tasks' keys; no ca.key, "
      "admin or coordinator key): every node's PSTRAIN_TLS_DIR.\n",
      nodes_out.c_str());
  return 0;
}

}  // namespace pstrain
