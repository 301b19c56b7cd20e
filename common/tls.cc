#include "common/tls.h"

#include <fcntl.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <netdb.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/regular_file.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

struct KeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct CertFree {
  void operator()(X509* p) const { X509_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;
using Bio = std::unique_ptr<BIO, BioFree>;

// OpenSSL's queued errors as one line.
absl::Status OpenSslError(const std::string& what) {
  std::string detail;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof(buffer));
    absl::StrAppend(&detail, detail.empty() ? "" : "; ", buffer);
  }
  return absl::InternalError(
      absl::StrCat(what, ": ", detail.empty() ? "OpenSSL failed" : detail));
}

// A PEM file: regular (symbolic links followed, as Kubernetes mounts its
// secrets), read without blocking (a FIFO is refused), at most 1 MiB.
constexpr uint64_t kMaxPemBytes = 1 << 20;

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  absl::StatusOr<std::string> bytes =
      ReadSmallFile(path, kMaxPemBytes, /*follow_symlinks=*/true);
  // "PATH: No such file or directory", "PATH: a FIFO; expected a regular
  // file": a file the caller must provide first.
  if (!bytes.ok())
    return absl::FailedPreconditionError(bytes.status().message());
  return bytes;
}

absl::Status PosixError(const std::string& path, const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat(path, ": ", what, " (", std::strerror(errno), ")"));
}

// Writes `bytes` to `path` with `mode`: a temporary file created anew
// (O_EXCL|O_NOFOLLOW, so no link planted there is followed), its mode set
// whatever the umask, fsync, rename over `path`.
absl::Status WriteFileWithMode(const std::string& path,
                               const std::string& bytes, mode_t mode) {
  const std::string tmp = path + ".tmp";
  if (unlink(tmp.c_str()) != 0 && errno != ENOENT) {
    return PosixError(tmp, "cannot remove a stale temporary file");
  }
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
           mode & 0600);
  if (fd < 0) return PosixError(tmp, "cannot create it");
  absl::Status s;
  if (fchmod(fd, mode) != 0) s = PosixError(tmp, "cannot set its mode");
  size_t done = 0;
  while (s.ok() && done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) {
      s = PosixError(tmp, "write failed");
      break;
    }
    done += static_cast<size_t>(n);
  }
  if (s.ok() && fsync(fd) != 0) s = PosixError(tmp, "fsync failed");
  if (close(fd) != 0 && s.ok()) s = PosixError(tmp, "close failed");
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    s = PosixError(path, "cannot write it");
  }
  if (!s.ok()) unlink(tmp.c_str());
  return s;
}

absl::StatusOr<std::string> ToPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) {
    return OpenSslError("writing a certificate");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> ToPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0,
                                       nullptr, nullptr) != 1) {
    return OpenSslError("writing a private key");
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<Cert> CertFromPem(const std::string& pem,
                                 const std::string& path) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PEM certificate"));
  }
  return cert;
}

absl::StatusOr<Key> KeyFromPem(const std::string& pem,
                               const std::string& path) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a PEM private key"));
  }
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid,
                          const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError("certificate extension " + value);
  const int added = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (added != 1) return OpenSslError("certificate extension " + value);
  return absl::OkStatus();
}

// A certificate for `common_name` with `key`'s public half, signed by
// `issuer_key` (`issuer` null: self-signed, a CA), for extended key usage
// `usage` ("serverAuth" or "clientAuth"; ignored for a CA).
absl::StatusOr<Cert> MakeCert(const std::string& common_name, EVP_PKEY* key,
                              X509* issuer, EVP_PKEY* issuer_key,
                              const std::vector<std::string>& alt_names,
                              const std::string& usage,
                              absl::Duration validity) {
  Cert cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) {
    return OpenSslError("a new certificate");
  }
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), BN_free);
  if (!serial ||
      BN_rand(serial.get(), 120, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) ==
          nullptr) {
    return OpenSslError("a certificate serial number");
  }
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                  static_cast<long>(absl::ToInt64Seconds(validity)));
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("pstrain"),
                             -1, -1, 0);
  X509_NAME_add_entry_by_txt(
      name, "CN", MBSTRING_ASC,
      reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  X509* signer = issuer == nullptr ? cert.get() : issuer;
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  auto add = [&](int nid, const std::string& value) {
    return AddExtension(cert.get(), signer, nid, value);
  };
  absl::Status s;
  if (issuer == nullptr) {
    s.Update(add(NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
    s.Update(add(NID_key_usage, "critical,keyCertSign,cRLSign"));
    s.Update(add(NID_subject_key_identifier, "hash"));
  } else {
    s.Update(add(NID_basic_constraints, "critical,CA:FALSE"));
    s.Update(add(NID_key_usage, "critical,digitalSignature"));
    s.Update(add(NID_ext_key_usage, usage));
    s.Update(add(NID_authority_key_identifier, "keyid"));
    if (!alt_names.empty()) {
      s.Update(add(NID_subject_alt_name, absl::StrJoin(alt_names, ",")));
    }
  }
  if (!s.ok()) return s;
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) {
    return OpenSslError("signing the certificate of " + common_name);
  }
  return cert;
}

// "DNS:name" or "IP:1.2.3.4" for a subject alternative name.
std::string AltName(const std::string& host) {
  const bool ip = !host.empty() &&
                  (host.find(':') != std::string::npos ||
                   host.find_first_not_of("0123456789.") == std::string::npos);
  return absl::StrCat(ip ? "IP:" : "DNS:", host);
}

}  // namespace

namespace {

constexpr char kLockName[] = "/.lock";

// Removes the folders `tmp`/<prefix>-<pid>-* of this user whose owner is
// gone (a run killed before it could remove its own): the owner holds an
// flock on the folder's .lock for its life, which the kernel releases when
// it dies; a lock that can be taken means nobody owns the folder. Unlike
// the pid in the name, this holds across pid namespaces sharing /tmp.
// Best effort.
void RemoveStaleFolders(const std::string& tmp, const std::string& prefix) {
  const std::string start = prefix + "-";
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(tmp, error)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(start, 0) != 0) continue;
    const size_t dash = name.find('-', start.size());
    int64_t pid = 0;
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(name.substr(start.size(), dash - start.size()),
                          &pid) ||
        pid <= 0) {
      continue;
    }
    struct stat st;
    if (lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid()) {
      continue;
    }
    const std::string lock = e.path().string() + kLockName;
    const int fd = open(lock.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;  // not made by Create(), or being made now
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) fs::remove_all(e.path(), error);
    close(fd);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrivateFolder>> PrivateFolder::Create(
    const std::string& prefix) {
  const char* env = std::getenv("TMPDIR");
  const std::string tmp = env != nullptr && *env ? env : "/tmp";
  RemoveStaleFolders(tmp, prefix);
  std::string pattern =
      absl::StrCat(tmp, "/", prefix, "-", getpid(), "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {  // mode 0700
    return absl::FailedPreconditionError(
        absl::StrCat(pattern, ": cannot create a private folder (",
                     std::strerror(errno), ")"));
  }
  const std::string lock = pattern + kLockName;
  const int fd = open(lock.c_str(),
                      O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const absl::Status s = PosixError(lock, "cannot create and lock it");
    if (fd >= 0) close(fd);
    std::error_code error;
    fs::remove_all(pattern, error);
    return s;
  }
  return std::unique_ptr<PrivateFolder>(new PrivateFolder(pattern, fd));
}

PrivateFolder::~PrivateFolder() {
  std::error_code error;
  fs::remove_all(path_, error);
  close(lock_fd_);
}

std::string IdentityName(const TlsIdentity& identity) {
  switch (identity.role) {
    case TlsRole::kCoordinator:
      return "coordinator";
    case TlsRole::kAdmin:
      return "admin";
    case TlsRole::kPs:
      return absl::StrCat("ps:", identity.index, "@", identity.job);
    case TlsRole::kWorker:
      return absl::StrCat("worker:", identity.index, "@", identity.job);
  }
  return "";
}

absl::StatusOr<TlsIdentity> ParseIdentityName(const std::string& name) {
  TlsIdentity id;
  if (name == "coordinator") {
    id.role = TlsRole::kCoordinator;
    return id;
  }
  if (name == "admin") {
    id.role = TlsRole::kAdmin;
    return id;
  }
  const size_t colon = name.find(':');
  const size_t at = name.find('@');
  const std::string role = name.substr(0, colon);
  if (colon != std::string::npos && at != std::string::npos && at > colon &&
      (role == "ps" || role == "worker") &&
      absl::SimpleAtoi(name.substr(colon + 1, at - colon - 1), &id.index) &&
      id.index >= 0 && at + 1 < name.size()) {
    id.role = role == "ps" ? TlsRole::kPs : TlsRole::kWorker;
    id.job = name.substr(at + 1);
    return id;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("certificate name \"", name,
                   "\": expected coordinator, admin, ps:<i>@<job> or "
                   "worker:<j>@<job>"));
}

std::string IdentityStem(const TlsIdentity& identity) {
  switch (identity.role) {
    case TlsRole::kPs:
      return absl::StrCat("ps-", identity.index);
    case TlsRole::kWorker:
      return absl::StrCat("worker-", identity.index);
    default:
      return IdentityName(identity);
  }
}

std::string ClientStem(const TlsIdentity& identity) {
  return identity.role == TlsRole::kPs
             ? absl::StrCat(IdentityStem(identity), "-client")
             : IdentityStem(identity);
}

std::string ServerName(const TlsIdentity& identity) {
  switch (identity.role) {
    case TlsRole::kCoordinator:
      return "coordinator.pstrain";
    case TlsRole::kPs:
      return absl::StrCat(identity.job, ".ps-", identity.index, ".pstrain");
    default:
      return "";
  }
}

absl::Status CheckCertificateJob(const std::string& job) {
  if (job == "*") return absl::OkStatus();
  const bool label =
      !job.empty() && job.size() <= 63 && job.front() != '-' &&
      job.back() != '-' &&
      job.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyz"
          "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") == std::string::npos;
  if (label) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job \"", job,
      "\": expected a job id (job-3: letters, digits and '-', at most 63) "
      "or * for every job"));
}

namespace {

bool IsServer(TlsRole role) {
  return role == TlsRole::kCoordinator || role == TlsRole::kPs;
}
bool IsClient(TlsRole role) { return role != TlsRole::kCoordinator; }

// `dir` made (0700) or found as this user's own folder, not a link.
absl::Status MakePrivateDir(const std::string& dir) {
  std::error_code error;
  fs::create_directories(dir, error);
  struct stat st;
  if (error || lstat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot create it as a private folder (",
                     error ? error.message() : std::strerror(errno), ")"));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": expected a folder of this user (not a link or another's)"));
  }
  if (chmod(dir.c_str(), 0700) != 0) {
    return PosixError(dir, "cannot make it private (mode 0700)");
  }
  return absl::OkStatus();
}

// The CA of `dir`: loaded from ca.pem and ca.key, or made and written when
// neither is there.
absl::Status LoadOrMakeCa(const std::string& dir, absl::Duration validity,
                          Cert* ca, Key* ca_key) {
  const std::string ca_pem_path = dir + "/ca.pem";
  const std::string ca_key_path = dir + "/ca.key";
  std::error_code error;
  const bool have_pem = fs::exists(ca_pem_path, error);
  const bool have_key = fs::exists(ca_key_path, error);
  if (have_pem != have_key) {
    return absl::FailedPreconditionError(absl::StrCat(
        have_pem ? ca_key_path : ca_pem_path, ": missing beside ",
        have_pem ? ca_pem_path : ca_key_path,
        "; expected both (to mint with this CA) or neither (a new CA)"));
  }
  if (have_pem) {
    absl::StatusOr<std::string> pem = ReadAll(ca_pem_path);
    if (!pem.ok()) return pem.status();
    absl::StatusOr<Cert> cert = CertFromPem(*pem, ca_pem_path);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key_pem = ReadAll(ca_key_path);
    if (!key_pem.ok()) return key_pem.status();
    absl::StatusOr<Key> key = KeyFromPem(*key_pem, ca_key_path);
    if (!key.ok()) return key.status();
    *ca = *std::move(cert);
    *ca_key = *std::move(key);
    return absl::OkStatus();
  }
  ca_key->reset(EVP_EC_gen("P-256"));
  if (!*ca_key) return OpenSslError("the CA's key");
  absl::StatusOr<Cert> cert =
      MakeCert("pstrain cluster CA", ca_key->get(), nullptr, ca_key->get(), {},
               "", validity);
  if (!cert.ok()) return cert.status();
  *ca = *std::move(cert);
  absl::StatusOr<std::string> key_pem = ToPem(ca_key->get());
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> pem = ToPem(ca->get());
  if (!pem.ok()) return pem.status();
  absl::Status s = WriteFileWithMode(ca_key_path, *key_pem, 0600);
  if (s.ok()) s = WriteFileWithMode(ca_pem_path, *pem, 0644);
  return s;
}

// A new key and certificate for `identity`, signed by `ca`, written to
// `dir`/`stem`.key and .pem, for extended key usage `usage`.
absl::Status MintOne(const std::string& dir, const std::string& stem,
                     const TlsIdentity& identity, const std::string& usage,
                     const std::vector<std::string>& hosts, X509* ca,
                     EVP_PKEY* ca_key, absl::Duration validity) {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("the key of " + IdentityName(identity));
  std::vector<std::string> alt_names;
  if (usage == "serverAuth") {
    alt_names.push_back("DNS:" + ServerName(identity));
  }
  for (const std::string& host : hosts) alt_names.push_back(AltName(host));
  absl::StatusOr<Cert> cert = MakeCert(IdentityName(identity), key.get(), ca,
                                       ca_key, alt_names, usage, validity);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key_pem = ToPem(key.get());
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> pem = ToPem(cert->get());
  if (!pem.ok()) return pem.status();
  const std::string path = absl::StrCat(dir, "/", stem);
  absl::Status s = WriteFileWithMode(path + ".key", *key_pem, 0600);
  if (s.ok()) s = WriteFileWithMode(path + ".pem", *pem, 0644);
  return s;
}

}  // namespace

absl::Status MakeCertificates(const std::string& dir,
                              const std::vector<TlsIdentity>& identities,
                              const std::vector<std::string>& hosts,
                              absl::Duration validity) {
  for (const TlsIdentity& identity : identities) {
    if (identity.role == TlsRole::kPs || identity.role == TlsRole::kWorker) {
      if (absl::Status s = CheckCertificateJob(identity.job); !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s = MakePrivateDir(dir); !s.ok()) return s;
  Key ca_key;
  Cert ca;
  if (absl::Status s = LoadOrMakeCa(dir, validity, &ca, &ca_key); !s.ok()) {
    return s;
  }
  for (const TlsIdentity& identity : identities) {
    absl::Status s;
    if (IsServer(identity.role)) {
      s.Update(MintOne(dir, IdentityStem(identity), identity, "serverAuth",
                       hosts, ca.get(), ca_key.get(), validity));
    }
    if (IsClient(identity.role)) {
      s.Update(MintOne(dir, ClientStem(identity), identity, "clientAuth", hosts,
                       ca.get(), ca_key.get(), validity));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::vector<std::string> NodeFileNames(
    const std::vector<TlsIdentity>& identities) {
  std::vector<std::string> names = {"ca.pem"};
  for (const TlsIdentity& identity : identities) {
    if (identity.role != TlsRole::kPs && identity.role != TlsRole::kWorker) {
      continue;
    }
    for (const std::string& stem :
         {IdentityStem(identity), ClientStem(identity)}) {
      for (const char* suffix : {".pem", ".key"}) {
        const std::string name = stem + suffix;
        if (std::find(names.begin(), names.end(), name) == names.end()) {
          names.push_back(name);
        }
      }
    }
  }
  return names;
}

absl::Status CopyForNodes(const std::string& from, const std::string& to,
                          const std::vector<TlsIdentity>& identities) {
  std::error_code error;
  if (fs::exists(to, error) && fs::equivalent(from, to, error)) {
    return absl::InvalidArgumentError(absl::StrCat(
        to, ": is the folder of the CA's key; expected another for the nodes"));
  }
  if (absl::Status s = MakePrivateDir(to); !s.ok()) return s;
  for (const std::string& name : NodeFileNames(identities)) {
    absl::StatusOr<std::string> bytes = ReadAll(absl::StrCat(from, "/", name));
    if (!bytes.ok()) return bytes.status();
    const bool key = absl::EndsWith(name, ".key");
    if (absl::Status s = WriteFileWithMode(absl::StrCat(to, "/", name), *bytes,
                                           key ? 0600 : 0644);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status RemoveMintingKeys(const std::string& dir) {
  for (const char* name : {"/ca.key", "/admin.key"}) {
    const std::string path = dir + name;
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return PosixError(path, "cannot remove it");
    }
  }
  return absl::OkStatus();
}

namespace {

// Checks `options.dir`/`file_stem`.pem and .key as `self`'s.
absl::Status CheckStemFiles(const TlsOptions& options, const TlsIdentity& self,
                            const std::string& file_stem) {
  const std::string stem = absl::StrCat(options.dir, "/", file_stem);
  absl::StatusOr<std::string> ca_pem = ReadAll(options.dir + "/ca.pem");
  if (!ca_pem.ok()) return ca_pem.status();
  absl::StatusOr<Cert> ca = CertFromPem(*ca_pem, options.dir + "/ca.pem");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> pem = ReadAll(stem + ".pem");
  if (!pem.ok()) return pem.status();
  absl::StatusOr<Cert> cert = CertFromPem(*pem, stem + ".pem");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key_pem = ReadAll(stem + ".key");
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<Key> key = KeyFromPem(*key_pem, stem + ".key");
  if (!key.ok()) return key.status();
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(stem, ".key: not the private key of ", stem, ".pem"));
  }
  std::unique_ptr<EVP_PKEY, KeyFree> ca_public(X509_get_pubkey(ca->get()));
  if (X509_verify(cert->get(), ca_public.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(stem, ".pem: not signed by ", options.dir, "/ca.pem"));
  }
  char name[256] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert->get()), NID_commonName,
                            name, sizeof(name));
  if (name != IdentityName(self)) {
    absl::StatusOr<TlsIdentity> named = ParseIdentityName(name);
    // A certificate for any job serves a task of every job.
    if (!named.ok() || named->role != self.role || named->index != self.index ||
        named->job != "*") {
      return absl::InvalidArgumentError(absl::StrCat(stem, ".pem: names \"",
                                                     name, "\"; expected \"",
                                                     IdentityName(self), "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTlsFiles(const TlsOptions& options, const TlsIdentity& self) {
  if (options.insecure) return absl::OkStatus();
  if (options.dir.empty()) {
    return absl::InvalidArgumentError(
        "--tls_dir (or PSTRAIN_TLS_DIR) is not set: expected the folder of "
        "`pstrain certs`, or --insecure for plaintext");
  }
  if (IsServer(self.role)) {
    if (absl::Status s = CheckStemFiles(options, self, IdentityStem(self));
        !s.ok()) {
      return s;
    }
  }
  if (IsClient(self.role) && ClientStem(self) != IdentityStem(self)) {
    return CheckStemFiles(options, self, ClientStem(self));
  }
  if (IsClient(self.role) && !IsServer(self.role)) {
    return CheckStemFiles(options, self, IdentityStem(self));
  }
  return absl::OkStatus();
}

namespace {

// The identity a certificate file names; errors name the file.
absl::StatusOr<TlsIdentity> IdentityOfFile(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadAll(path);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<Cert> cert = CertFromPem(*pem, path);
  if (!cert.ok()) return cert.status();
  char name[256] = {0};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert->get()), NID_commonName,
                            name, sizeof(name));
  absl::StatusOr<TlsIdentity> id = ParseIdentityName(name);
  if (!id.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", id.status().message()));
  }
  return id;
}

}  // namespace

absl::StatusOr<TlsIdentity> TaskIdentityInFolder(const TlsOptions& options,
                                                 TlsRole role, int index) {
  TlsIdentity wanted;
  wanted.role = role;
  wanted.index = index;
  const std::string path =
      absl::StrCat(options.dir, "/", IdentityStem(wanted), ".pem");
  std::error_code error;
  if (!fs::exists(path, error)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such certificate"));
  }
  return IdentityOfFile(path);
}

absl::StatusOr<TlsIdentity> AnyTaskIdentityOfJob(const TlsOptions& options,
                                                 const std::string& job) {
  std::error_code error;
  for (const fs::directory_entry& e :
       fs::directory_iterator(options.dir, error)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".pem" ||
        (name.rfind("ps-", 0) != 0 && name.rfind("worker-", 0) != 0)) {
      continue;
    }
    absl::StatusOr<TlsIdentity> id = IdentityOfFile(e.path().string());
    if (id.ok() && (id->job == "*" || id->job == job)) return id;
  }
  return absl::NotFoundError(absl::StrCat(
      options.dir, ": no certificate of a task of ", job,
      " (ps-<i>.pem or worker-<j>.pem; pstrain certs makes them)"));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsOptions& options, const TlsIdentity& self) {
  if (options.insecure) return grpc::InsecureServerCredentials();
  if (absl::Status s = CheckTlsFiles(options, self); !s.ok()) return s;
  const std::string stem = absl::StrCat(options.dir, "/", IdentityStem(self));
  auto provider =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          stem + ".key", stem + ".pem", options.dir + "/ca.pem",
          options.refresh_s);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsOptions& options, const TlsIdentity& self) {
  if (options.insecure) return grpc::InsecureChannelCredentials();
  if (absl::Status s = CheckTlsFiles(options, self); !s.ok()) return s;
  const std::string stem = absl::StrCat(options.dir, "/", ClientStem(self));
  auto provider =
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          stem + ".key", stem + ".pem", options.dir + "/ca.pem",
          options.refresh_s);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(tls);
}

void SetPeerServerName(const TlsIdentity& server,
                       grpc::ChannelArguments* args) {
  args->SetSslTargetNameOverride(ServerName(server));
}

namespace {

struct SslCtxFree {
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
};
struct SslFree {
  void operator()(SSL* p) const { SSL_free(p); }
};

// A TCP connection to `host`:`port` whose connect, reads and writes give up
// after `timeout`; -1 with errno set when none.
int ConnectWithTimeout(const std::string& host, const std::string& port,
                       absl::Duration timeout) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0) {
    errno = EHOSTUNREACH;
    return -1;
  }
  int fd = -1;
  const timeval tv = absl::ToTimeval(timeout);
  for (const addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      const int saved = errno;
      close(fd);
      fd = -1;
      errno = saved;
    }
  }
  freeaddrinfo(found);
  return fd;
}

// OpenSSL's first queued error reason, for a one-line message.
std::string SslReason() {
  const unsigned long e = ERR_peek_error();
  const char* reason = e == 0 ? nullptr : ERR_reason_error_string(e);
  std::string text = reason != nullptr ? reason : "handshake failed";
  ERR_clear_error();
  return text;
}

// The common name of the certificate the peer presented, remembered by
// RememberPeer() during the handshake (OpenSSL keeps no peer certificate
// after a failed one).
thread_local std::string peer_common_name;

int RememberPeer(int ok, X509_STORE_CTX* ctx) {
  X509* cert = X509_STORE_CTX_get_current_cert(ctx);
  if (cert != nullptr && X509_STORE_CTX_get_error_depth(ctx) == 0) {
    char name[256] = {0};
    X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, name,
                              sizeof(name));
    peer_common_name = name;
  }
  return ok;
}

}  // namespace

namespace {

// "host:port" or "[v6]:port" into its parts; false for anything else (a
// gRPC target such as dns:///host:port).
bool SplitHostPort(const std::string& address, std::string* host,
                   std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !host->empty() && host->find_first_of("/[]") == std::string::npos;
}

// What a TLS probe says its messages about.
struct Probe {
  std::string address;      // host:port
  std::string server_name;  // "coordinator.pstrain"
  std::string ca_path;      // DIR/ca.pem
  std::string stem;         // DIR/worker-0: our certificate and key
  std::string self_name;    // "worker:0@job-1"
};

// Why SSL_connect failed, from the verification result.
absl::Status FailedHandshake(const Probe& p, long verify,
                             const std::string& reason) {
  const std::string peer = peer_common_name;
  if (verify == X509_V_ERR_HOSTNAME_MISMATCH) {
    return absl::UnavailableError(
        absl::StrCat(p.address, " is not ", p.server_name,
                     " (its certificate names \"", peer, "\")"));
  }
  if (verify == X509_V_ERR_INVALID_PURPOSE) {
    return absl::UnavailableError(absl::StrCat(
        "certificate of ", p.server_name, " at ", p.address,
        " is not a server's certificate (\"", peer, "\", extended key usage)"));
  }
  if (verify != X509_V_OK) {
    return absl::UnavailableError(absl::StrCat(
        "certificate of ", p.server_name, " at ", p.address, " not trusted by ",
        p.ca_path, " (", X509_verify_cert_error_string(verify), ")"));
  }
  return absl::UnavailableError(
      absl::StrCat(p.address, " refused the TLS handshake as ", p.self_name,
                   " with ", p.stem, ".pem (", reason, ")"));
}

// After a handshake that succeeded: TLS 1.3 servers judge the client's
// certificate after it, and their alert, if any, is the first thing read.
absl::Status RefusedAfterHandshake(const Probe& p, SSL* ssl, int fd,
                                   absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(std::min(timeout, absl::Seconds(1)));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  const int peeked = SSL_peek(ssl, &byte, 1);
  absl::Status result;
  if (peeked <= 0 && SSL_get_error(ssl, peeked) == SSL_ERROR_SSL) {
    result = absl::UnavailableError(
        absl::StrCat(p.address, " refused our certificate ", p.stem, ".pem (",
                     SslReason(), ")"));
  }
  ERR_clear_error();
  return result;
}

}  // namespace

absl::Status CheckTlsPeer(const TlsOptions& options, const TlsIdentity& self,
                          const std::string& address, const TlsIdentity& server,
                          absl::Duration timeout) {
  std::string host, port;
  if (options.insecure || options.dir.empty() ||
      !SplitHostPort(address, &host, &port)) {
    return absl::OkStatus();
  }
  const Probe p = {address, ServerName(server), options.dir + "/ca.pem",
                   absl::StrCat(options.dir, "/", ClientStem(self)),
                   IdentityName(self)};
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx ||
      SSL_CTX_load_verify_locations(ctx.get(), p.ca_path.c_str(), nullptr) !=
          1 ||
      SSL_CTX_use_certificate_file(ctx.get(), (p.stem + ".pem").c_str(),
                                   SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), (p.stem + ".key").c_str(),
                                  SSL_FILETYPE_PEM) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(p.stem, ".pem, .key or ", p.ca_path,
                     ": cannot load them (", SslReason(), ")"));
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, RememberPeer);
  peer_common_name = "?";
  const int fd = ConnectWithTimeout(host, port, timeout);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(address, ": cannot connect (", std::strerror(errno), ")"));
  }
  std::unique_ptr<SSL, SslFree> ssl(SSL_new(ctx.get()));
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  absl::Status result;
  if (!ssl || SSL_set_fd(ssl.get(), fd) != 1 ||
      SSL_set1_host(ssl.get(), p.server_name.c_str()) != 1 ||
      SSL_set_alpn_protos(ssl.get(), kAlpn, sizeof(kAlpn)) != 0) {
    result = OpenSslError("a TLS probe");
  } else if (SSL_connect(ssl.get()) != 1) {
    const long verify = SSL_get_verify_result(ssl.get());
    result = FailedHandshake(p, verify, SslReason());
  } else {
    result = RefusedAfterHandshake(p, ssl.get(), fd, timeout);
  }
  close(fd);
  return result;
}

absl::StatusOr<TlsIdentity> PeerIdentity(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "no verified client certificate: expected one of this cluster's");
  }
  const std::vector<grpc::string_ref> names =
      auth->FindPropertyValues("x509_common_name");
  if (names.size() != 1) {
    return absl::UnauthenticatedError(
        "the client certificate names no single identity");
  }
  absl::StatusOr<TlsIdentity> identity =
      ParseIdentityName(std::string(names[0].data(), names[0].size()));
  if (!identity.ok()) {
    return absl::UnauthenticatedError(identity.status().message());
  }
  return identity;
}

}  // namespace pstrain
