// `pstrain launch-lines --launcher=kubernetes`: the job as Kubernetes
// manifests (KubernetesManifests in launch_lines.h). YAML is written as text:
// every string is a double-quoted YAML (and JSON) scalar, so no value can
// change the document's structure.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/launch_lines.h"

namespace pstrain {
namespace {

// Where the containers find the Secret of TLS files and the coordinator's
// job file.
constexpr char kTlsMount[] = "/etc/pstrain/tls";
constexpr char kJobFileDir[] = "/var/lib/pstrain";
// Every PS pod listens on this port (each pod has its own address).
constexpr int kPsPort = 7000;

// `s` as a double-quoted YAML scalar.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\x%02x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A DNS-1123 label (lowercase letters, digits, '-'; starts and ends with a
// letter or digit; at most 63 characters).
bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') {
    return false;
  }
  for (char c : s) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '-') {
      return false;
    }
  }
  return true;
}

// The job id as part of a DNS label: lowercase, runs of other characters
// as one '-'.
std::string LabelOf(const std::string& id) {
  std::string out;
  for (char c : absl::AsciiStrToLower(id)) {
    const bool ok = absl::ascii_isalnum(c);
    if (ok) {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

// A Kubernetes quantity of memory: digits, an optional fraction, an optional
// suffix (Ki Mi Gi Ti, k M G T).
bool IsMemoryQuantity(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
  if (i == 0) return false;
  if (i < s.size() && s[i] == '.') {
    const size_t start = ++i;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
    if (i == start) return false;
  }
  const std::string suffix = s.substr(i);
  for (const char* allowed : {"", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"}) {
    if (suffix == allowed) return true;
  }
  return false;
}

std::string Labels(const std::string& indent, const std::string& job,
                   const std::string& component) {
  std::string out =
      absl::StrCat(indent, "app.kubernetes.io/name: \"pstrain\"\n", indent,
                   "app.kubernetes.io/component: ", Quote(component), "\n");
  if (!job.empty()) {
    absl::StrAppend(&out, indent, "pstrain.io/job: ", Quote(job), "\n");
  }
  return out;
}

// The start of one object: "---", apiVersion, kind, and metadata with its
// name and labels (Labels(job, component)), then "spec:".
std::string ObjectHead(const char* api_version, const char* kind,
                       const std::string& name, const std::string& job,
                       const std::string& component) {
  return absl::StrCat("---\napiVersion: ", api_version, "\nkind: ", kind,
                      "\nmetadata:\n  name: ", Quote(name), "\n  labels:\n",
                      Labels("    ", job, component), "spec:\n");
}

// `name: NAME` and the TLS Secret's volume, at the pod spec's indent.
std::string TlsVolume(const std::string& indent, const std::string& secret) {
  // 0400 (256): the keys readable by the container's user only.
  return absl::StrCat(indent, "- name: \"tls\"\n", indent, "  secret:\n",
                      indent, "    secretName: ", Quote(secret), "\n", indent,
                      "    defaultMode: 256\n");
}

std::string Command(const std::string& indent,
                    const std::vector<std::string>& argv) {
  std::string out = absl::StrCat(indent, "command:\n");
  for (const std::string& arg : argv) {
    absl::StrAppend(&out, indent, "- ", Quote(arg), "\n");
  }
  return out;
}

// The coordinator: a Deployment of one replica (Recreate: never two at once
// on one job file) and a Service in front of it.
std::string CoordinatorObjects(const LaunchOptions& options,
                               const std::string& service, int port) {
  const std::string labels = Labels("      ", "", "coordinator");
  std::string out = absl::StrCat(
      ObjectHead("v1", "Service", service, "", "coordinator"), "  selector:\n",
      Labels("    ", "", "coordinator"),
      "  ports:\n"
      "  - name: \"grpc\"\n"
      "    port: ",
      port, "\n    targetPort: ", port, "\n",
      ObjectHead("apps/v1", "Deployment", service, "", "coordinator"),
      "  replicas: 1\n"
      "  strategy:\n"
      "    type: \"Recreate\"\n"
      "  selector:\n"
      "    matchLabels:\n",
      labels,
      "  template:\n"
      "    metadata:\n"
      "      labels:\n",
      Labels("        ", "", "coordinator"),
      "    spec:\n"
      "      containers:\n"
      "      - name: \"coordinator\"\n"
      "        image: ",
      Quote(options.image), "\n");
  absl::StrAppend(
      &out,
      Command(
          "        ",
          {options.coordinator_binary, absl::StrCat("--tls_dir=", kTlsMount),
           "--bind=0.0.0.0", absl::StrCat("--port=", port),
           absl::StrCat("--job_file=", kJobFileDir, "/jobs.pb")}),
      "        ports:\n"
      "        - name: \"grpc\"\n"
      "          containerPort: ",
      port,
      "\n"
      "        volumeMounts:\n"
      "        - name: \"tls\"\n"
      "          mountPath: ",
      Quote(kTlsMount),
      "\n"
      "          readOnly: true\n"
      "        - name: \"jobs\"\n"
      "          mountPath: ",
      Quote(kJobFileDir),
      "\n"
      "      volumes:\n",
      TlsVolume("      ", options.coordinator_tls_secret),
      "      - name: \"jobs\"\n"
      "        emptyDir: {}\n");
  return out;
}

struct RoleTasks {
  const char* role;  // "ps", "worker"
  int count;
  std::string binary;
  int gpus;
};

// One role: a headless Service (pod DNS names
// NAME-I.NAME, NAME = pstrain-JOB-ROLE) and an Indexed Job whose pod I runs
// task I (JOB_COMPLETION_INDEX).
//
// max_restarts = 0: each task runs once (restartPolicy Never, backoffLimit
// 0). N > 0: a container that dies is restarted in its pod (OnFailure: same
// index, same DNS name) and, told by PSTRAIN_SELF_RESTART=1, reports its own
// restart to the coordinator before registering again
// (coordinator/task_agent.h), which keeps the job's budget of N. A Job's
// backoffLimit counts every container restart (and failed pod) of all its
// indexes together, and one restart the coordinator counts restarts at most
// every task of a Job once (allreduce: every worker), so N x the Job's tasks
// never stops a restart the budget allows; past the budget the coordinator
// fails the job. (backoffLimitPerIndex is Kubernetes 1.28+.)
std::string RoleManifests(const LaunchOptions& options, const RoleTasks& role,
                          const std::string& job_label, int max_restarts) {
  const std::string name = absl::StrCat("pstrain-", job_label, "-", role.role);
  const bool ps = std::string(role.role) == "ps";
  std::string out = absl::StrCat(
      ObjectHead("v1", "Service", name, job_label, role.role),
      "  clusterIP: \"None\"\n"
      "  publishNotReadyAddresses: true\n"
      "  selector:\n",
      Labels("    ", job_label, role.role),
      ps ? absl::StrCat("  ports:\n"
                        "  - name: \"grpc\"\n"
                        "    port: ",
                        kPsPort, "\n")
         : "",
      ObjectHead("batch/v1", "Job", name, job_label, role.role),
      "  completionMode: \"Indexed\"\n"
      "  completions: ",
      role.count, "\n  parallelism: ", role.count,
      "\n  backoffLimit: ", max_restarts * role.count,
      "\n"
      "  template:\n"
      "    metadata:\n"
      "      labels:\n",
      Labels("        ", job_label, role.role),
      "    spec:\n"
      "      subdomain: ",
      Quote(name), "\n      restartPolicy: ",
      Quote(max_restarts > 0 ? "OnFailure" : "Never"),
      "\n"
      "      containers:\n"
      "      - name: ",
      Quote(role.role), "\n        image: ", Quote(options.image), "\n");
  std::vector<std::string> argv = {
      role.binary, absl::StrCat("--coordinator=", options.coordinator),
      absl::StrCat("--job=", options.job)};
  if (ps) {
    argv.push_back("--bind=0.0.0.0");
    argv.push_back(absl::StrCat("--port=", kPsPort));
  }
  // The pod's DNS name; Kubernetes expands $(JOB_COMPLETION_INDEX), which
  // the Job controller puts in the container's environment.
  argv.push_back(
      absl::StrCat("--advertise=", name, "-$(JOB_COMPLETION_INDEX).", name));
  absl::StrAppend(&out, Command("        ", argv),
                  "        env:\n"
                  "        - name: \"PSTRAIN_TLS_DIR\"\n"
                  "          value: ",
                  Quote(kTlsMount),
                  "\n"
                  "        - name: \"OMP_NUM_THREADS\"\n"
                  "          value: ",
                  Quote(absl::StrCat(options.cpus_per_task)), "\n");
  if (max_restarts > 0) {
    // coordinator/task_agent.h's kSelfRestartVariable.
    absl::StrAppend(&out,
                    "        - name: \"PSTRAIN_SELF_RESTART\"\n"
                    "          value: \"1\"\n");
  }
  if (ps) {
    absl::StrAppend(&out,
                    "        ports:\n"
                    "        - name: \"grpc\"\n"
                    "          containerPort: ",
                    kPsPort, "\n");
  }
  absl::StrAppend(&out,
                  "        resources:\n"
                  "          requests:\n"
                  "            cpu: ",
                  Quote(absl::StrCat(options.cpus_per_task)), "\n");
  if (!options.memory_per_task.empty()) {
    absl::StrAppend(
        &out, "            memory: ", Quote(options.memory_per_task), "\n");
  }
  if (!options.memory_per_task.empty() || role.gpus > 0) {
    absl::StrAppend(&out, "          limits:\n");
    if (!options.memory_per_task.empty()) {
      absl::StrAppend(
          &out, "            memory: ", Quote(options.memory_per_task), "\n");
    }
    if (role.gpus > 0) {
      absl::StrAppend(&out, "            nvidia.com/gpu: ",
                      Quote(absl::StrCat(role.gpus)), "\n");
    }
  }
  absl::StrAppend(&out,
                  "        volumeMounts:\n"
                  "        - name: \"tls\"\n"
                  "          mountPath: ",
                  Quote(kTlsMount),
                  "\n"
                  "          readOnly: true\n"
                  "      volumes:\n",
                  TlsVolume("      ", options.tls_secret));
  return out;
}

}  // namespace

absl::StatusOr<std::string> KubernetesManifests(const JobSpec& spec,
                                                const LaunchOptions& options) {
  if (!spec.ps_hosts().empty() || !spec.worker_hosts().empty()) {
    return absl::InvalidArgumentError(
        "--launcher=kubernetes: the job spec lists hosts; Kubernetes places "
        "the pods, each reached by its DNS name: remove ps_hosts and "
        "worker_hosts");
  }
  if (options.image.empty()) {
    return absl::InvalidArgumentError(
        "--launcher=kubernetes: expected --image=IMAGE, a container image "
        "holding the binaries in --bin_dir (default /opt/pstrain/bin)");
  }
  if (options.k8s_objects != "coordinator" && options.k8s_objects != "tasks") {
    return absl::InvalidArgumentError(
        absl::StrCat("--k8s_objects=", options.k8s_objects,
                     ": expected coordinator or tasks"));
  }
  if (options.cpus_per_task < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cpus_per_task=", options.cpus_per_task, ": expected >= 1"));
  }
  if (options.gpus_per_worker < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpus_per_worker=", options.gpus_per_worker, ": expected >= 0"));
  }
  if (!options.memory_per_task.empty() &&
      !IsMemoryQuantity(options.memory_per_task)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_per_task=", options.memory_per_task,
                     ": expected a Kubernetes quantity such as 4Gi or 512Mi"));
  }
  const size_t colon = options.coordinator.rfind(':');
  int port = 0;
  const std::string service = options.coordinator.substr(0, colon);
  if (colon == std::string::npos || !IsDnsLabel(service) ||
      !absl::SimpleAtoi(options.coordinator.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator=", options.coordinator,
        ": expected SERVICE:PORT, the coordinator's Service (a DNS label, "
        "e.g. pstrain-coordinator:7070)"));
  }
  std::string out = absl::StrCat(
      "# Printed by `pstrain launch-lines --launcher=kubernetes "
      "--k8s_objects=",
      options.k8s_objects, "`; apply with `kubectl apply -f FILE`.\n");
  if (options.k8s_objects == "coordinator") {
    absl::StrAppend(
        &out, "# The coordinator ", options.coordinator,
        ": a Deployment of one replica and its Service. It reads its\n"
        "# certificate from the Secret ",
        Quote(options.coordinator_tls_secret),
        " (ca.pem, coordinator.pem, coordinator.key).\n",
        CoordinatorObjects(options, service, port));
    return out;
  }
  if (options.job.empty() || options.job == "$JOB") {
    return absl::InvalidArgumentError(
        "--launcher=kubernetes --k8s_objects=tasks: expected --job=ID, the "
        "id `pstrain submit` printed (manifests have no shell to read $JOB)");
  }
  const std::string job_label = LabelOf(options.job);
  // "pstrain-" + label + "-worker-" + index within a 63-character hostname.
  if (job_label.empty() || job_label.size() > 40) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job=", options.job,
        ": expected an id with letters or digits, at most 40 characters"));
  }
  absl::StrAppend(&out, "# The ", spec.num_ps(), " ps and ",
                  LaunchedWorkers(spec), " worker tasks of ", spec.model(),
                  " job ", options.job, " on coordinator ", options.coordinator,
                  ": per role a headless\n# Service and an Indexed Job; each "
                  "task reads its certificate from the Secret ",
                  Quote(options.tls_secret), ".\n");
  const RoleTasks roles[] = {{"ps", spec.num_ps(), options.ps_binary, 0},
                             {"worker", LaunchedWorkers(spec),
                              options.worker_binary, options.gpus_per_worker}};
  for (const RoleTasks& role : roles) {
    if (role.count > 0) {
      absl::StrAppend(
          &out, RoleManifests(options, role, job_label, spec.max_restarts()));
    }
  }
  return out;
}

}  // namespace pstrain
