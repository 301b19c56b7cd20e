// The baselines ps_bench times pstrain's push+pull against, in the same run
// and process: a loopback echo over raw TCP sockets and over mutual TLS 1.3
// of OpenSSL straight on the sockets (what a transport adding only TLS to
// TCP reaches), and one core's AES-GCM speed (the floor mTLS could reach).
//
// Thread-safety: each call is self-contained (its own sockets, threads and
// OpenSSL contexts); calls running at once would share the cores and skew
// each other's times. Errors: these are benchmark helpers and exit(1) with
// a one-line message on stderr when a socket, OpenSSL or the echo fails.
#ifndef PSTRAIN_BENCH_TRANSPORT_BASELINES_H_
#define PSTRAIN_BENCH_TRANSPORT_BASELINES_H_

#include <openssl/evp.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pstrain {

// Timed steps: wall seconds and process CPU seconds of each.
struct Timings {
  std::vector<double> seconds, cpu_seconds;
  // TimeEcho only: bytes of the last round that came back different from
  // those sent, over every connection (0 expected).
  int64_t wrong_bytes = 0;
  void Add(double wall, double cpu) {
    seconds.push_back(wall);
    cpu_seconds.push_back(cpu);
  }
};

// The process's user+system CPU seconds so far, every thread's
// (getrusage(RUSAGE_SELF)).
double ProcessCpuSeconds();

// One core's seconds per byte of `cipher` (an AES-GCM of OpenSSL's EVP),
// the mean of sealing and opening 32 MiB as 16-KiB TLS records, each with
// its own 12-byte nonce (a counter, as TLS's per-record nonce) and 16-byte
// tag, the key set once as a connection does; the best of 3.
double CipherSecondsPerByte(const EVP_CIPHER* cipher);

// The TLS baseline's certificates: `dir` as MakeTlsFolder made it, shard
// 0's server certificate and worker c's client certificate.
struct EchoTls {
  std::string dir;
  int workers = 1;
};

// Sends `bytes` to a loopback echo server and reads them back over each of
// `connections` connections at once (each client writes all, then reads
// all: the server echoes only once it has every byte); wall and CPU
// seconds per round (until the last connection has its bytes back), after
// one untimed round. `tls`: each connection is a mutual TLS 1.3 session of
// OpenSSL over its socket (`tls->dir`'s ca.pem, shard 0's server and
// worker c % `tls->workers`'s client certificate, the client checking the
// server's name), the handshake done before the timing; null: plain TCP.
// `cipher` (when not null) gets the suite the TLS sessions negotiated.
Timings TimeEcho(int64_t bytes, int repeats, int connections,
                 const EchoTls* tls, std::string* cipher = nullptr);

}  // namespace pstrain

#endif  // PSTRAIN_BENCH_TRANSPORT_BASELINES_H_
