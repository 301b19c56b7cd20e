#!/usr/bin/env python3
"""Raw TCP baseline for the emulated-link runs (scripts/emulated_links.sh).

Moves the bytes of one training step's exchange over plain TCP sockets,
with no gRPC, no aggregation and no dependency between directions, so that
what it measures is what the shaped links and TCP itself allow:

  serve   --bind IP --port P --peers N --recv_bytes R --send_bytes S
      accepts N connections; once all N are connected, sends each peer one
      "go" byte, then S bytes, while reading R bytes from it.
  connect --servers IP:P,... --send_bytes S --recv_bytes R
      connects to every server, waits for every "go", then sends S bytes to
      and reads R bytes from each, all at once; prints the seconds from the
      last "go" to the last byte.

The PS pattern: each of k shard hosts serves n workers (reads M/k from each,
sends M/k to each); each worker connects to the k shards. The ring pattern:
each worker serves its predecessor and connects to its successor, 2(n-1)/n
of M each way. Errors (refused connections, short transfers, a peer that
never connects within --timeout_s) exit 1 with one line naming the peer.
"""
import argparse
import socket
import sys
import threading
import time

BLOCK = 1 << 20


def send_all(sock, n):
    block = bytes(BLOCK)
    while n > 0:
        k = min(n, BLOCK)
        sock.sendall(memoryview(block)[:k])
        n -= k


def recv_all(sock, n, what):
    while n > 0:
        data = sock.recv(min(n, BLOCK))
        if not data:
            raise IOError("%s closed with %d bytes still to come" % (what, n))
        n -= len(data)


def run_threads(targets):
    errors = []

    def wrap(fn):
        try:
            fn()
        except Exception as e:  # reported below, one line
            errors.append(str(e))

    threads = [threading.Thread(target=wrap, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise IOError(errors[0])


def serve(args):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(args.peers)
    listener.settimeout(args.timeout_s)
    peers = []
    try:
        while len(peers) < args.peers:
            conn, addr = listener.accept()
            conn.settimeout(args.timeout_s)
            peers.append((conn, addr))
    except socket.timeout:
        raise IOError("%s:%d: %d of %d peers connected in %.0f s" %
                      (args.bind, args.port, len(peers), args.peers,
                       args.timeout_s))
    for conn, _ in peers:
        conn.sendall(b"g")
    targets = []
    for conn, addr in peers:
        what = "peer %s" % addr[0]
        targets.append(lambda c=conn: send_all(c, args.send_bytes))
        targets.append(
            lambda c=conn, w=what: recv_all(c, args.recv_bytes, w))
    run_threads(targets)
    for conn, _ in peers:
        conn.close()


def connect(args):
    socks = []
    deadline = time.time() + args.timeout_s
    for server in args.servers.split(","):
        host, port = server.rsplit(":", 1)
        while True:
            try:
                s = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError as e:
                if time.time() > deadline:
                    raise IOError("server %s: %s" % (server, e))
                time.sleep(0.05)
        s.settimeout(args.timeout_s)
        socks.append((s, server))
    for s, server in socks:
        recv_all(s, 1, "server %s" % server)
    start = time.time()
    targets = []
    for s, server in socks:
        targets.append(lambda c=s: send_all(c, args.send_bytes))
        targets.append(lambda c=s, w="server %s" % server: recv_all(
            c, args.recv_bytes, w))
    run_threads(targets)
    print("%.4f" % (time.time() - start))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--peers", type=int, required=True)
    c = sub.add_parser("connect")
    c.add_argument("--servers", required=True)
    for p in (s, c):
        p.add_argument("--send_bytes", type=int, required=True)
        p.add_argument("--recv_bytes", type=int, required=True)
        p.add_argument("--timeout_s", type=float, default=120)
    args = parser.parse_args()
    try:
        serve(args) if args.command == "serve" else connect(args)
    except (IOError, OSError) as e:
        print("tcp_exchange.py: error: %s" % e, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
