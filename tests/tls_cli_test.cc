// Issue 35 (items 4, 5, 8), through the binaries a user runs: `pstrain
// certs` says when its certificates serve every job and splits the nodes'
// files from the operator's; a task whose TLS files do not load exits 2
// naming the file (no plaintext fallback); `pstrain run` keeps no key that
// mints identities while it runs, its certificates expire within a day,
// and a run killed with SIGKILL leaves its key folder only until the next.
#include <dirent.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/cli_test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using testing::HaveFashionMnist;
using testing::Process;
using testing::RunCommand;
using testing::TempDir;

int Lines(const std::string& text, const std::string& needle) {
  int n = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.substr(start, end - start).find(needle) != std::string::npos) ++n;
    start = end + 1;
  }
  return n;
}

TEST(CertsCliTest, CertificatesOfEveryJobSaySoInOneLine) {
  const std::string dir = TempDir() + "/any-job";
  auto r = RunCommand("cli/pstrain certs --out=" + dir +
                      " --num_ps=1 --num_workers=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Lines(r.output, "serve EVERY job"), 1) << r.output;

  r = RunCommand("cli/pstrain certs --out=" + TempDir() +
                 "/one-job --job=job-3 --num_ps=1 --num_workers=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("EVERY"), std::string::npos) << r.output;

  r = RunCommand("cli/pstrain certs --out=" + TempDir() +
                 "/bad-job --job=job.3 --num_ps=1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--job=job.3"), std::string::npos) << r.output;
}

TEST(CertsCliTest, NodesFolderHoldsNoMintingKey) {
  const std::string ops = TempDir() + "/ops";
  const std::string nodes = TempDir() + "/nodes";
  const auto r =
      RunCommand("cli/pstrain certs --out=" + ops + " --nodes_out=" + nodes +
                 " --job=job-1 --num_ps=2 --num_workers=2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* name : {"ca.pem", "ps-1.pem", "ps-1.key", "ps-1-client.pem",
                           "ps-1-client.key", "worker-1.pem", "worker-1.key"}) {
    EXPECT_TRUE(fs::exists(nodes + "/" + name)) << name;
  }
  for (const char* name :
       {"ca.key", "admin.key", "admin.pem", "coordinator.key"}) {
    EXPECT_FALSE(fs::exists(nodes + "/" + name)) << name;
    EXPECT_TRUE(fs::exists(ops + "/" + name)) << name;
  }
  // A job's task certificates later leave the running coordinator's key.
  const std::string coordinator_key =
      testing::ReadTextFile(ops + "/coordinator.key");
  ASSERT_EQ(RunCommand("cli/pstrain certs --out=" + ops + " --nodes_out=" +
                       nodes + "-2 --job=job-2 --num_ps=1 --num_workers=1")
                .exit_code,
            0);
  EXPECT_EQ(testing::ReadTextFile(ops + "/coordinator.key"), coordinator_key);
  EXPECT_TRUE(fs::exists(nodes + "-2/worker-0.key"));
  EXPECT_FALSE(fs::exists(nodes + "-2/worker-1.key"));
  struct stat st;
  ASSERT_EQ(stat(nodes.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((nodes + "/worker-1.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// The key, certificate and CA files of `dir`, by name, to check that a
// refused command changed none of them.
std::vector<std::pair<std::string, std::string>> Snapshot(
    const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    files.emplace_back(entry.path().filename().string(),
                       testing::ReadTextFile(entry.path().string()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

// --nodes_out never replaces a key or certificate: not --out's own folder
// (however spelled), not another CA's folder, not an earlier nodes folder;
// each refusal is one line naming the flag, exit 2, before anything is
// written to either folder.
TEST(CertsCliTest, NodesOutNeverReplacesKeysOrCertificates) {
  const std::string ops = TempDir() + "/refuse-ops";
  const std::string other_ca = TempDir() + "/refuse-other-ca";
  const std::string nodes = TempDir() + "/refuse-nodes";
  const std::string tasks = " --job=job-1 --num_ps=1 --num_workers=1";
  ASSERT_EQ(RunCommand("cli/pstrain certs --out=" + ops +
                       " --nodes_out=" + nodes + tasks)
                .exit_code,
            0);
  ASSERT_EQ(RunCommand("cli/pstrain certs --out=" + other_ca + tasks).exit_code,
            0);
  fs::create_symlink(ops, TempDir() + "/refuse-ops-link");
  fs::create_directories(TempDir() + "/refuse-empty");
  fs::create_symlink(TempDir() + "/refuse-empty",
                     TempDir() + "/refuse-empty-link");
  const auto ops_files = Snapshot(ops);
  const auto other_files = Snapshot(other_ca);
  const auto nodes_files = Snapshot(nodes);
  struct Case {
    std::string nodes_out;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {ops + "/.", "the same folder as --out"},
           {TempDir() + "/refuse-ops-link/", "the same folder as --out"},
           {other_ca, "holds ca.key"},
           {nodes, "already holds ca.pem"},
           {ops + "/ca.key", "not a folder"},
           // A folder holding --out would put ca.key on the nodes' share.
           {TempDir(), "holds --out=" + ops},
           // A trailing slash does not get a link past the check.
           {TempDir() + "/refuse-empty-link/", "a link"}}) {
    const auto r = RunCommand("cli/pstrain certs --out=" + ops +
                              " --nodes_out=" + c.nodes_out + tasks);
    EXPECT_EQ(r.exit_code, 2) << c.nodes_out << ": " << r.output;
    EXPECT_EQ(r.output.rfind("pstrain certs: error: --nodes_out=" +
                                 c.nodes_out + ": " + c.says,
                             0),
              0u)
        << r.output;
    EXPECT_EQ(Lines(r.output, ""), 1) << r.output;
    EXPECT_EQ(Snapshot(ops), ops_files) << c.nodes_out;
    EXPECT_EQ(Snapshot(other_ca), other_files) << c.nodes_out;
    EXPECT_EQ(Snapshot(nodes), nodes_files) << c.nodes_out;
  }
  // A new --out spelled two ways is refused before either is made.
  const std::string fresh = TempDir() + "/refuse-fresh";
  const auto r = RunCommand("cli/pstrain certs --out=" + fresh +
                            " --nodes_out=" + fresh + "/" + tasks);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_FALSE(fs::exists(fresh));
  // Every file the nodes get is private when a key, and none is left over.
  const std::string nodes2 = TempDir() + "/refuse-nodes-2";
  ASSERT_EQ(RunCommand("cli/pstrain certs --out=" + ops +
                       " --nodes_out=" + nodes2 + tasks)
                .exit_code,
            0);
  for (const auto& [name, text] : Snapshot(nodes2)) {
    struct stat st;
    ASSERT_EQ(lstat((nodes2 + "/" + name).c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << name;
    EXPECT_EQ(st.st_mode & 0777,
              name.find(".key") != std::string::npos ? 0600u : 0644u)
        << name;
  }
}

TEST(TlsCliTest, TaskWithoutItsKeyExitsTwoNamingIt) {
  const std::string dir = TempDir() + "/broken";
  ASSERT_EQ(RunCommand("cli/pstrain certs --out=" + dir +
                       " --job=job-1 --num_ps=1 --num_workers=1")
                .exit_code,
            0);
  fs::remove(dir + "/ps-0-client.key");
  { std::ofstream(dir + "/worker-0.key") << "not a key\n"; }
  const std::string common =
      " --coordinator=127.0.0.1:1 --job=job-1 --task_index=0 "
      "--coordinator_timeout_s=1 --tls_dir=" +
      dir;
  auto r = RunCommand("server/pstrain_ps" + common);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir + "/ps-0-client.key"), std::string::npos)
      << r.output;
  r = RunCommand("worker/pstrain_worker" + common);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir + "/worker-0.key"), std::string::npos)
      << r.output;
}

TEST(TlsCliTest, HandshakeFailureSaysSoWithinTheTimeout) {
  testing::CoordinatorProcess coordinator(TempDir() + "/jobs.pb", 30);
  ASSERT_TRUE(coordinator.up());
  // The task's folder is of another CA than the coordinator's.
  const std::string dir = TempDir() + "/other-ca";
  ASSERT_EQ(RunCommand("cli/pstrain certs --out=" + dir +
                       " --job=job-1 --num_ps=1 --num_workers=1")
                .exit_code,
            0);
  const auto start = std::chrono::steady_clock::now();
  const auto r = RunCommand(
      "worker/pstrain_worker --coordinator=" + coordinator.address() +
      " --job=job-1 --task_index=0 "
      "--coordinator_timeout_s=5 --tls_dir=" +
      dir);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("certificate of coordinator.pstrain at " +
                          coordinator.address() + " not trusted by " + dir +
                          "/ca.pem"),
            std::string::npos)
      << r.output;
  EXPECT_LT(seconds, 15) << r.output;
}

// The folders `pstrain run` made under `tmp`.
std::vector<std::string> RunFolders(const std::string& tmp) {
  std::vector<std::string> found;
  std::error_code error;
  for (const auto& e : fs::directory_iterator(tmp, error)) {
    if (e.path().filename().string().rfind("pstrain-tls-", 0) == 0) {
      found.push_back(e.path().string());
    }
  }
  return found;
}

// Seconds from now until `pem`'s certificate expires.
double SecondsLeft(const std::string& pem) {
  FILE* f = std::fopen(pem.c_str(), "r");
  if (f == nullptr) return -1;
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (cert == nullptr) return -1;
  int days = 0, seconds = 0;
  ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert));
  X509_free(cert);
  return days * 86400.0 + seconds;
}

// The pids whose parent is `parent`.
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    char state;
    int ppid = 0;
    if (std::sscanf(line.c_str() + paren + 1, " %c %d", &state, &ppid) == 2 &&
        ppid == parent) {
      children.push_back(std::stoi(name));
    }
  }
  return children;
}

TEST(TlsCliTest, RunKeepsNoMintingKeyAndKilledRunsFolderGoes) {
  if (!HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
  const std::string tmp = TempDir() + "/run-tmp";
  fs::create_directories(tmp);
  std::string folder;
  {
    Process run({"cli/pstrain", "run", "--epochs=1",
                 "--max_steps_per_epoch=100000", "--log_every_steps=1000"},
                TempDir() + "/run.log", {"TMPDIR=" + tmp, "OMP_NUM_THREADS=1"});
    // Wait for the tasks' certificates.
    for (int i = 0; i < 600 && folder.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      for (const std::string& f : RunFolders(tmp)) {
        if (fs::exists(f + "/worker-1.pem") && !Children(run.pid()).empty()) {
          folder = f;
        }
      }
    }
    ASSERT_FALSE(folder.empty())
        << testing::ReadTextFile(TempDir() + "/run.log");
    EXPECT_NE(folder.find("pstrain-tls-" + std::to_string(run.pid()) + "-"),
              std::string::npos)
        << folder;
    EXPECT_FALSE(fs::exists(folder + "/ca.key"));
    EXPECT_FALSE(fs::exists(folder + "/admin.key"));
    EXPECT_TRUE(fs::exists(folder + "/worker-1.key"));
    for (const char* pem : {"coordinator.pem", "ps-0.pem", "worker-1.pem"}) {
      const double left = SecondsLeft(folder + "/" + pem);
      EXPECT_GT(left, 0) << pem;
      EXPECT_LE(left, 86400) << pem;
    }
    const std::vector<pid_t> tasks = Children(run.pid());
    run.Kill(SIGKILL);
    run.Wait(10);
    for (pid_t task : tasks) kill(task, SIGKILL);  // started by this test
  }
  ASSERT_TRUE(fs::exists(folder));  // nobody was left to remove it
  // The next run removes the dead one's folder before making its own.
  const auto r = RunCommand("TMPDIR=" + tmp +
                            " OMP_NUM_THREADS=1 cli/pstrain run --epochs=1 "
                            "--max_steps_per_epoch=2 --log_every_steps=1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_TRUE(RunFolders(tmp).empty());
}

}  // namespace
}  // namespace pstrain
