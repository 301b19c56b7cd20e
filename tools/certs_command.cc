#include "tools/certs_command.h"

#include <unistd.h>

#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
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
// tools/job_commands.cc's (shared with trace).
ABSL_DECLARE_FLAG(std::string, out);
// Shared with run and launch-lines.
ABSL_DECLARE_FLAG(std::string, num_ps);
ABSL_DECLARE_FLAG(int, num_workers);
ABSL_DECLARE_FLAG(std::string, job);

namespace pstrain {

int CertsCommand(const std::vector<std::string>& args) {
  constexpr char kProgram[] = "pstrain certs";
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
  // launch-lines' placeholder default means no job was named.
  std::string job = absl::GetFlag(FLAGS_job);
  if (job.empty() || job == "$JOB") job = "*";
  if (absl::Status s = CheckCertificateJob(job); !s.ok()) {
    PrintError(kProgram, absl::StrCat("--job=", job, ": ", s.message()));
    return 2;
  }
  if (job == "*" && num_ps + num_workers > 0) {
    std::fprintf(stderr,
                 "%s: warning: no --job: these task certificates serve EVERY "
                 "job of this CA (a stolen task key reaches them all); pass "
                 "--job=ID (the id `pstrain submit` printed) to confine them "
                 "to one job\n",
                 kProgram);
  }
  std::vector<std::string> hosts;
  for (absl::string_view h :
       absl::StrSplit(absl::GetFlag(FLAGS_hosts), ',', absl::SkipEmpty())) {
    hosts.emplace_back(h);
  }
  // The coordinator's and the administrator's keys are made once: minting
  // a job's task certificates later does not replace them under a running
  // coordinator (remove them to renew).
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
      out.c_str(), num_ps - 1, num_workers - 1, job.c_str());
  const std::string nodes_out = absl::GetFlag(FLAGS_nodes_out);
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
