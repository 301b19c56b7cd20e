// Certificates as a client and a server meet them: real files from
// MakeCertificates, a real gRPC server on loopback, real handshakes. A
// handshake that succeeds reaches the server's unimplemented method
// (UNIMPLEMENTED); one the TLS layer refuses never does (UNAVAILABLE).
#include "common/tls.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

const TlsIdentity kCoordinator{TlsRole::kCoordinator};
const TlsIdentity kAdmin{TlsRole::kAdmin};
const TlsIdentity kShardA{TlsRole::kPs, 0, "job-a"};
const TlsIdentity kShardB{TlsRole::kPs, 0, "job-b"};
const TlsIdentity kShardAnyJob{TlsRole::kPs, 0, "*"};
const TlsIdentity kWorkerA{TlsRole::kWorker, 0, "job-a"};

std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  fs::remove_all(dir);
  return dir;
}

TlsOptions In(const std::string& dir) {
  TlsOptions options;
  options.dir = dir;
  return options;
}

// Folders of one CA: "a" holds job-a's shard and worker and the
// coordinator, "b" job-b's shard, "any" a shard of every job.
class TlsHandshakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = NewDir("a");
    b_ = NewDir("b");
    any_ = NewDir("any");
    ASSERT_TRUE(
        MakeCertificates(a_, {kCoordinator, kAdmin, kShardA, kWorkerA}).ok());
    for (const std::string& dir : {b_, any_}) {
      fs::create_directories(dir);
      fs::copy_file(a_ + "/ca.pem", dir + "/ca.pem");
      fs::copy_file(a_ + "/ca.key", dir + "/ca.key");
    }
    ASSERT_TRUE(MakeCertificates(b_, {kShardB}).ok());
    ASSERT_TRUE(MakeCertificates(any_, {kShardAnyJob}).ok());
  }

  // A server as `self` from `dir`; its port in *port.
  std::unique_ptr<grpc::Server> Serve(const std::string& dir,
                                      const TlsIdentity& self, int* port) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        ServerCredentials(In(dir), self);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return nullptr;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, port);
    builder.RegisterService(&service_);
    return builder.BuildAndStart();
  }

  // One call as `self` (files of `dir`) to `port`, expecting `server`.
  grpc::StatusCode Call(const std::string& dir, const TlsIdentity& self,
                        int port, const TlsIdentity& server) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        ChannelCredentials(In(dir), self);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return grpc::StatusCode::INTERNAL;
    grpc::ChannelArguments args;
    SetPeerServerName(server, &args);
    auto stub = Coordinator::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), *credentials, args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    JobRequest request;
    JobInfo response;
    return stub->GetJob(&context, request, &response).error_code();
  }

  Coordinator::Service service_;  // every method UNIMPLEMENTED
  std::string a_, b_, any_;
};

TEST_F(TlsHandshakeTest, ShardNameCarriesItsJob) {
  EXPECT_EQ(ServerName(kShardA), "job-a.ps-0.pstrain");
  EXPECT_EQ(ServerName(kShardAnyJob), "*.ps-0.pstrain");
  EXPECT_EQ(ServerName(kCoordinator), "coordinator.pstrain");
}

TEST_F(TlsHandshakeTest, WorkerReachesItsJobsShard) {
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(a_, kShardA, &port);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Call(a_, kWorkerA, port, kShardA), grpc::StatusCode::UNIMPLEMENTED);
  server->Shutdown();
}

TEST_F(TlsHandshakeTest, ShardKeyOfAnotherJobCannotStandIn) {
  // Shard 0 of job-b, with a key of the same CA, where job-a's worker
  // expects shard 0 of job-a.
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(b_, kShardB, &port);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Call(a_, kWorkerA, port, kShardA), grpc::StatusCode::UNAVAILABLE);
  server->Shutdown();
}

TEST_F(TlsHandshakeTest, ShardOfEveryJobServesAJob) {
  int port = 0;
  std::unique_ptr<grpc::Server> server =
      Serve(any_, TlsIdentity{TlsRole::kPs, 0, "job-a"}, &port);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Call(a_, kWorkerA, port, kShardA), grpc::StatusCode::UNIMPLEMENTED);
  server->Shutdown();
}

TEST_F(TlsHandshakeTest, ServerCertificateCannotActAsClient) {
  // The coordinator's certificate (serverAuth only) presented by a client.
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(a_, kShardA, &port);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Call(a_, kCoordinator, port, kShardA),
            grpc::StatusCode::UNAVAILABLE);
  server->Shutdown();
}

TEST_F(TlsHandshakeTest, ClientCertificateCannotActAsServer) {
  // job-a's worker key, renamed into a shard's place (its certificate has
  // the shard's server name among its hosts), cannot serve: clientAuth only.
  const std::string dir = NewDir("worker_as_server");
  fs::create_directories(dir);
  fs::copy_file(a_ + "/ca.pem", dir + "/ca.pem");
  fs::copy_file(a_ + "/ca.key", dir + "/ca.key");
  ASSERT_TRUE(MakeCertificates(dir, {kWorkerA}, {ServerName(kShardA)}).ok());
  TlsIdentity self = kWorkerA;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(dir, self, &port);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Call(a_, kWorkerA, port, kShardA), grpc::StatusCode::UNAVAILABLE);
  server->Shutdown();
}

// CheckTlsPeer: why a handshake fails, in one line.
TEST_F(TlsHandshakeTest, ProbeSaysWhyAHandshakeFails) {
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(b_, kShardB, &port);
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_TRUE(CheckTlsPeer(In(a_), kWorkerA, address, kShardB).ok());

  // Another job's shard.
  absl::Status s = CheckTlsPeer(In(a_), kWorkerA, address, kShardA);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), absl::StrCat(address,
                                      " is not job-a.ps-0.pstrain (its "
                                      "certificate names \"ps:0@job-b\")"));

  // A server of another CA.
  const std::string other = NewDir("other-ca");
  ASSERT_TRUE(MakeCertificates(other, {kWorkerA}).ok());
  s = CheckTlsPeer(In(other), kWorkerA, address, kShardB);
  EXPECT_NE(s.message().find("certificate of job-b.ps-0.pstrain at " + address +
                             " not trusted by " + other + "/ca.pem"),
            std::string::npos)
      << s;

  // Our certificate of another CA, theirs trusted.
  fs::remove(other + "/ca.pem");
  fs::copy_file(a_ + "/ca.pem", other + "/ca.pem");
  s = CheckTlsPeer(In(other), kWorkerA, address, kShardB);
  EXPECT_NE(s.message().find(address + " refused our certificate " + other +
                             "/worker-0.pem"),
            std::string::npos)
      << s;
  server->Shutdown();
  server.reset();

  // Nobody there.
  s = CheckTlsPeer(In(a_), kWorkerA, address, kShardB);
  EXPECT_NE(s.message().find(address + ": cannot connect"), std::string::npos)
      << s;
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(TlsFilesTest, EveryCertificateHasOneUsage) {
  const std::string dir = NewDir("usage");
  ASSERT_TRUE(
      MakeCertificates(dir, {kCoordinator, kAdmin, kShardA, kWorkerA}).ok());
  for (const char* stem :
       {"coordinator", "admin", "ps-0", "ps-0-client", "worker-0"}) {
    EXPECT_TRUE(fs::exists(absl::StrCat(dir, "/", stem, ".pem"))) << stem;
  }
  // Each role's credentials load from its own files.
  EXPECT_TRUE(CheckTlsFiles(In(dir), kShardA).ok());
  fs::remove(dir + "/ps-0-client.key");
  const absl::Status missing = CheckTlsFiles(In(dir), kShardA);
  EXPECT_NE(missing.message().find("ps-0-client.key"), std::string::npos)
      << missing;
}

// A FIFO in a key's place is refused at once, naming it, instead of
// blocking the process until something writes to it; a certificate folder
// of symbolic links (Kubernetes' secret volumes) still loads.
TEST(TlsFilesTest, AFifoInAKeysPlaceIsRefusedWithoutBlocking) {
  const std::string dir = NewDir("fifo");
  ASSERT_TRUE(MakeCertificates(dir, {kAdmin, kWorkerA}).ok());
  const std::string linked = NewDir("linked");
  fs::create_directories(linked);
  for (const char* name : {"ca.pem", "worker-0.pem", "worker-0.key"}) {
    ASSERT_EQ(
        symlink((dir + "/" + name).c_str(), (linked + "/" + name).c_str()), 0);
  }
  EXPECT_TRUE(CheckTlsFiles(In(linked), kWorkerA).ok());
  fs::remove(dir + "/worker-0.key");
  ASSERT_EQ(mkfifo((dir + "/worker-0.key").c_str(), 0600), 0);
  const absl::Status fifo = CheckTlsFiles(In(dir), kWorkerA);
  EXPECT_EQ(fifo.code(), absl::StatusCode::kFailedPrecondition) << fifo;
  EXPECT_NE(fifo.message().find("worker-0.key: a FIFO"), std::string::npos)
      << fifo;
}

TEST(TlsFilesTest, KeyFileIsCreatedNotFollowed) {
  const std::string dir = NewDir("planted");
  ASSERT_TRUE(MakeCertificates(dir, {kAdmin}).ok());
  const std::string victim = NewDir("victim.txt");
  { std::ofstream(victim) << "keep me"; }
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/worker-0.key.tmp").c_str()), 0);
  ASSERT_TRUE(MakeCertificates(dir, {kWorkerA}).ok());
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "keep me");
  struct stat st;
  ASSERT_EQ(lstat((dir + "/worker-0.key").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(TlsFilesTest, MintingKeysRemovedAndNotRemade) {
  const std::string dir = NewDir("minted");
  ASSERT_TRUE(MakeCertificates(dir, {kCoordinator, kAdmin, kWorkerA}).ok());
  ASSERT_TRUE(RemoveMintingKeys(dir).ok());
  EXPECT_FALSE(fs::exists(dir + "/ca.key"));
  EXPECT_FALSE(fs::exists(dir + "/admin.key"));
  EXPECT_TRUE(fs::exists(dir + "/worker-0.key"));
  // A CA certificate without its key is not silently replaced (that would
  // orphan every certificate made so far).
  const absl::Status again = MakeCertificates(dir, {kShardA});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_NE(again.message().find("ca.key"), std::string::npos) << again;
}

TEST(TlsFilesTest, JobMustBeOneDnsLabel) {
  EXPECT_TRUE(CheckCertificateJob("job-3").ok());
  EXPECT_TRUE(CheckCertificateJob("*").ok());
  for (const char* bad : {"", "job/3", "a.b", "a b", "-x", "job-*"}) {
    EXPECT_FALSE(CheckCertificateJob(bad).ok()) << bad;
  }
  EXPECT_FALSE(
      MakeCertificates(NewDir("badjob"), {TlsIdentity{TlsRole::kPs, 0, "a.b"}})
          .ok());
}

TEST(PrivateFolderTest, RemovesFoldersOfDeadRuns) {
  const std::string tmp = NewDir("tmpdir");
  fs::create_directories(tmp);
  ASSERT_EQ(setenv("TMPDIR", tmp.c_str(), 1), 0);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  // A run killed with SIGKILL (its lock released), one still running (its
  // lock held; the pid in its name means nothing in another pid
  // namespace), one whose lock is not made yet.
  const std::string dead = absl::StrCat(tmp, "/run-tls-", child, "-abc123");
  const std::string alive = absl::StrCat(tmp, "/run-tls-", child, "-xyz");
  const std::string starting = absl::StrCat(tmp, "/run-tls-", child, "-new");
  fs::create_directories(dead + "/inner");
  std::ofstream(dead + "/.lock").close();
  fs::create_directories(alive);
  std::ofstream(alive + "/.lock").close();
  fs::create_directories(starting);
  const int held = open((alive + "/.lock").c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(flock(held, LOCK_EX), 0);
  {
    absl::StatusOr<std::unique_ptr<PrivateFolder>> folder =
        PrivateFolder::Create("run-tls");
    ASSERT_TRUE(folder.ok()) << folder.status();
    EXPECT_FALSE(fs::exists(dead));
    EXPECT_TRUE(fs::exists(alive));
    EXPECT_TRUE(fs::exists(starting));
    // Its own folder is locked: another Create() leaves it.
    absl::StatusOr<std::unique_ptr<PrivateFolder>> second =
        PrivateFolder::Create("run-tls");
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_TRUE(fs::exists((*folder)->path()));
    EXPECT_NE((*folder)->path().find(absl::StrCat("run-tls-", getpid(), "-")),
              std::string::npos);
    EXPECT_EQ(fs::status((*folder)->path()).permissions(),
              fs::perms::owner_all);
  }
  close(held);
  unsetenv("TMPDIR");
}

}  // namespace
}  // namespace pstrain
