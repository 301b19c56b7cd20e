#include "bench/transport_baselines.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace pstrain {
namespace {

// Calls `some(at, left)`, which moves up to `left` bytes from offset `at`
// and returns how many (0: the connection ended or failed), until `bytes`
// have moved; false if a call moved none.
template <typename Some>
bool MoveAll(int64_t bytes, Some some) {
  for (int64_t at = 0; at < bytes;) {
    const size_t n = some(at, static_cast<size_t>(bytes - at));
    if (n == 0) return false;
    at += static_cast<int64_t>(n);
  }
  return true;
}

// One echo connection of the TCP and TLS baselines: a socket, and over
// it, for the TLS one, an OpenSSL session (blocking; one thread at a time,
// as OpenSSL requires of an SSL object).
struct EchoConnection {
  int fd = -1;
  SSL* ssl = nullptr;  // null: plain TCP

  // Reads exactly `bytes` bytes into `data`; false if the connection ends
  // or fails first.
  bool ReadAll(char* data, int64_t bytes) const {
    return MoveAll(bytes, [&](int64_t at, size_t left) -> size_t {
      size_t n = 0;
      if (ssl != nullptr) {
        return SSL_read_ex(ssl, data + at, left, &n) == 1 ? n : 0;
      }
      const ssize_t r = read(fd, data + at, left);
      return r > 0 ? static_cast<size_t>(r) : 0;
    });
  }

  // Writes the `bytes` bytes at `data`; false if it fails first.
  bool WriteAll(const char* data, int64_t bytes) const {
    return MoveAll(bytes, [&](int64_t at, size_t left) -> size_t {
      size_t n = 0;
      if (ssl != nullptr) {
        return SSL_write_ex(ssl, data + at, left, &n) == 1 ? n : 0;
      }
      const ssize_t w = write(fd, data + at, left);
      return w > 0 ? static_cast<size_t>(w) : 0;
    });
  }

  void Close() {
    if (ssl != nullptr) {
      SSL_shutdown(ssl);
      SSL_free(ssl);
      ssl = nullptr;
    }
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

// Exits 1 naming `what` and OpenSSL's first queued error.
[[noreturn]] void OpenSslFailed(const std::string& what) {
  char error[256] = "no error queued";
  if (const unsigned long code = ERR_get_error(); code != 0) {
    ERR_error_string_n(code, error, sizeof(error));
  }
  std::fprintf(stderr, "ps_bench: raw TLS: %s: %s\n", what.c_str(), error);
  std::exit(1);
}

// A TLS 1.3 context of `stem`.pem and .key in `dir`, which requires and
// checks the peer's certificate against `dir`/ca.pem (mutual TLS, as
// pstrain's gRPC channels: common/tls.h). Exits 1 if OpenSSL refuses.
SSL_CTX* MutualTlsContext(const std::string& dir, const std::string& stem,
                          bool server) {
  SSL_CTX* ctx =
      SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  const std::string pem = absl::StrCat(dir, "/", stem, ".pem");
  const std::string key = absl::StrCat(dir, "/", stem, ".key");
  const std::string ca = absl::StrCat(dir, "/ca.pem");
  if (ctx == nullptr ||
      SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_use_certificate_chain_file(ctx, pem.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) {
    OpenSslFailed(absl::StrCat("context of ", pem));
  }
  // Whole socket reads of many records, not a header and a body apiece.
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, 1 << 20);
  SSL_CTX_set_verify(
      ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0),
      nullptr);
  return ctx;
}

// Segments go out as written (TCP_NODELAY, as gRPC sets on its sockets):
// without it a TLS record shorter than the loopback MSS can wait on
// Nagle's algorithm for the peer's delayed ACK.
void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

double CipherSecondsPerByte(const EVP_CIPHER* cipher) {
  constexpr int kRecord = 16 << 10, kRecords = 2048;
  std::vector<unsigned char> plain(int64_t{kRecord} * kRecords, 7);
  std::vector<unsigned char> sealed(plain.size()), tags(16 * kRecords);
  const unsigned char key[32] = {1};
  EVP_CIPHER_CTX* seal = EVP_CIPHER_CTX_new();
  EVP_CIPHER_CTX* open = EVP_CIPHER_CTX_new();
  auto fail = [] {
    std::fprintf(stderr, "ps_bench: OpenSSL's AES-GCM failed\n");
    std::exit(1);
  };
  if (seal == nullptr || open == nullptr ||
      EVP_CipherInit_ex(seal, cipher, nullptr, key, nullptr, 1) != 1 ||
      EVP_CipherInit_ex(open, cipher, nullptr, key, nullptr, 0) != 1) {
    fail();
  }
  auto run = [&](bool encrypt) {
    EVP_CIPHER_CTX* ctx = encrypt ? seal : open;
    for (int r = 0; r < kRecords; ++r) {
      unsigned char iv[12] = {2};
      std::memcpy(iv + 8, &r, sizeof(r));
      unsigned char* in =
          (encrypt ? plain : sealed).data() + int64_t{r} * kRecord;
      unsigned char* out =
          (encrypt ? sealed : plain).data() + int64_t{r} * kRecord;
      unsigned char* tag = tags.data() + 16 * r;
      int n = 0, last = 0;
      const bool ok =
          EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, iv, -1) == 1 &&
          (encrypt ||
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, tag) == 1) &&
          EVP_CipherUpdate(ctx, out, &n, in, kRecord) == 1 &&
          EVP_CipherFinal_ex(ctx, out + n, &last) == 1 &&
          (!encrypt ||
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1);
      if (!ok) fail();
    }
  };
  auto thread_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * t.tv_nsec;
  };
  double best = 1e30;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const double start = thread_seconds();
    run(true);
    run(false);
    best = std::min(best, (thread_seconds() - start) / 2);
  }
  EVP_CIPHER_CTX_free(seal);
  EVP_CIPHER_CTX_free(open);
  return best / static_cast<double>(plain.size());
}

Timings TimeEcho(int64_t bytes, int repeats, int connections,
                 const EchoTls* tls, std::string* cipher) {
  SSL_CTX* server_ctx = nullptr;
  std::vector<SSL_CTX*> client_ctx;
  if (tls != nullptr) {
    server_ctx = MutualTlsContext(
        tls->dir, IdentityStem(TlsIdentity{TlsRole::kPs, 0, "local"}), true);
    // One context per worker's certificate; connection c is worker
    // c % workers's.
    for (int w = 0; w < std::min(connections, tls->workers); ++w) {
      client_ctx.push_back(MutualTlsContext(
          tls->dir, ClientStem(TlsIdentity{TlsRole::kWorker, w, "local"}),
          false));
    }
  }
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, connections);
  // The echo side: one thread per connection.
  std::vector<std::thread> servers;
  for (int c = 0; c < connections; ++c) {
    servers.emplace_back([&, bytes] {
      EchoConnection conn;
      conn.fd = accept(listener, nullptr, nullptr);
      NoDelay(conn.fd);
      if (server_ctx != nullptr) {
        conn.ssl = SSL_new(server_ctx);
        if (conn.ssl == nullptr || SSL_set_fd(conn.ssl, conn.fd) != 1 ||
            SSL_accept(conn.ssl) != 1) {
          OpenSslFailed("the echo server's handshake");
        }
      }
      std::vector<char> buffer(bytes);
      for (int r = 0; r < repeats + 1; ++r) {
        if (!conn.ReadAll(buffer.data(), bytes) ||
            !conn.WriteAll(buffer.data(), bytes)) {
          break;
        }
      }
      conn.Close();
    });
  }
  const std::string host = ServerName(TlsIdentity{TlsRole::kPs, 0, "local"});
  std::vector<EchoConnection> conns(connections);
  for (int c = 0; c < connections; ++c) {
    EchoConnection& conn = conns[c];
    conn.fd = socket(AF_INET, SOCK_STREAM, 0);
    NoDelay(conn.fd);
    connect(conn.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    if (tls != nullptr) {
      conn.ssl = SSL_new(client_ctx[c % client_ctx.size()]);
      if (conn.ssl == nullptr || SSL_set_fd(conn.ssl, conn.fd) != 1 ||
          SSL_set1_host(conn.ssl, host.c_str()) != 1 ||
          SSL_connect(conn.ssl) != 1) {
        OpenSslFailed("the client's handshake");
      }
      if (cipher != nullptr) *cipher = SSL_get_cipher_name(conn.ssl);
    }
  }
  // A pattern that a lost, repeated or reordered record would change.
  std::vector<char> out(bytes);
  for (int64_t i = 0; i < bytes; ++i) out[i] = static_cast<char>(i * 131 % 251);
  std::vector<std::vector<char>> in(connections, std::vector<char>(bytes));
  Timings times;
  for (int r = 0; r < repeats + 1; ++r) {  // the first is warm-up
    if (r == repeats) {                    // the round whose bytes are checked
      for (std::vector<char>& back : in) {
        std::fill(back.begin(), back.end(), 0);
      }
    }
    const absl::Time start = absl::Now();
    const double cpu_start = ProcessCpuSeconds();
    std::vector<std::thread> clients;
    for (int c = 0; c < connections; ++c) {
      clients.emplace_back([&, c] {
        if (!conns[c].WriteAll(out.data(), bytes) ||
            !conns[c].ReadAll(in[c].data(), bytes)) {
          std::fprintf(stderr, "ps_bench: the echo baseline failed\n");
          std::exit(1);
        }
      });
    }
    for (std::thread& t : clients) t.join();
    if (r > 0) {
      times.Add(absl::ToDoubleSeconds(absl::Now() - start),
                ProcessCpuSeconds() - cpu_start);
    }
  }
  for (const std::vector<char>& back : in) {
    for (int64_t i = 0; i < bytes; ++i) times.wrong_bytes += back[i] != out[i];
  }
  for (EchoConnection& conn : conns) conn.Close();
  for (std::thread& t : servers) t.join();
  close(listener);
  SSL_CTX_free(server_ctx);
  for (SSL_CTX* ctx : client_ctx) SSL_CTX_free(ctx);
  return times;
}

}  // namespace pstrain
