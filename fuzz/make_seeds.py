#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/ (small valid inputs).

Run from the repository root: python3 fuzz/make_seeds.py. Protobuf seeds are
encoded from text format by the system protoc (protoc --encode), so they
follow proto/*.proto as it is. Regression inputs of fixed crashes are kept
beside the seeds under names beginning with "crash-" and are not written
here.
"""
import json
import os
import struct
import subprocess
import zlib

CORPUS = "fuzz/corpus"


def write(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data)


def encode(proto, message, text):
    return subprocess.run(
        ["protoc", "-I.", "--encode=pstrain." + message, proto],
        input=text.encode(), check=True, capture_output=True).stdout


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def pb_bytes(data):
    """A protobuf text-format string literal for raw bytes."""
    return '"' + "".join("\\%03o" % b for b in data) + '"'


def chunk_message():
    vals = pb_bytes(f32([1.5, -2.0, 3.25, 0.0]))
    push = encode("proto/ps.proto", "PushPullRequest",
                  'header { job_id: "job-1" worker_id: 1 } push { key { '
                  'param_id: 2 chunk_index: 1 } dtype: DTYPE_FLOAT32 '
                  'num_elements: 4 data: %s version: 7 }' % vals)
    pull = encode("proto/ps.proto", "PushPullResponse",
                  'chunk { key { param_id: 0 chunk_index: 0 } dtype: '
                  'DTYPE_FLOAT32 num_elements: 4 data: %s version: 8 } '
                  'last_of_pull: true' % vals)
    pull_req = encode("proto/ps.proto", "PushPullRequest",
                      'header { job_id: "job-1" worker_id: 0 } '
                      'pull { min_version: 3 }')
    chunk = encode("proto/ps.proto", "TensorChunk",
                   'key { param_id: 1 chunk_index: 0 } dtype: DTYPE_FLOAT32 '
                   'num_elements: 4 data: %s version: 2' % vals)
    # A top-k push (offsets 0, 3, 9 as varint gaps) and a row-sparse one
    # (rows 1 and 3 of 4 rows of 2 elements).
    sparse = encode("proto/ps.proto", "PushPullRequest",
                    'header { job_id: "job-1" worker_id: 1 } push { key { '
                    'param_id: 2 chunk_index: 0 } dtype: DTYPE_FLOAT32 '
                    'num_elements: 10 sparse: true index_gaps: [0, 3, 6] '
                    'data: %s version: 7 }' % pb_bytes(f32([1.5, -2.0, 3.25])))
    rows = encode("proto/ps.proto", "PushPullRequest",
                  'header { job_id: "job-1" worker_id: 1 } push { key { '
                  'param_id: 0 chunk_index: 0 } dtype: DTYPE_FLOAT32 '
                  'num_elements: 8 sparse: true row_elements: 2 '
                  'index_gaps: [1, 2] data: %s version: 3 }'
                  % pb_bytes(f32([1.0, 2.0, 3.0, 4.0])))
    # Two leading bytes choose where the input is cut into slices.
    write("chunk_message_fuzzer", "push", b"\x00\x00" + push)
    write("chunk_message_fuzzer", "push_sliced", b"\x05\x11" + push)
    write("chunk_message_fuzzer", "pull_answer", b"\x03\x00" + pull)
    write("chunk_message_fuzzer", "pull_request", b"\x00\x00" + pull_req)
    write("chunk_message_fuzzer", "tensor_chunk", b"\x00\x00" + chunk)
    write("chunk_message_fuzzer", "sparse_push", b"\x00\x00" + sparse)
    write("chunk_message_fuzzer", "row_sparse_push", b"\x07\x03" + rows)


JOB_SPECS = {
    "minimal": "num_ps: 1 num_workers: 2 batch_size: 64 epochs: 1\n",
    "resnet18_hosts": """model: "resnet18"
dataset: "fashion_mnist"
num_ps: 2
num_workers: 2
batch_size: 64
epochs: 1
optimizer { lr: 0.001 beta1: 0.9 beta2: 0.999 epsilon: 1e-8 weight_decay: 0.01 }
ps_hosts { host: "10.0.0.2" port: 7000 }
ps_hosts { host: "10.0.0.3" port: 7000 }
worker_hosts { host: "10.0.0.4" port: 7001 }
worker_hosts { host: "10.0.0.4" port: 7002 }
""",
    "async_synthetic": """mode: "async"
num_ps: 1
num_workers: 3
batch_size: 32
epochs: 2
partition_bytes: 1048576
log_every_steps: 10
max_steps_per_epoch: 50
dataset: "synthetic"
synthetic_samples: 1280
""",
    "allreduce": """mode: "allreduce"
num_ps: 0
num_workers: 2
batch_size: 16
epochs: 1
bucket_bytes: 1000000
""",
    "checkpointing": """num_ps: 1 num_workers: 1 batch_size: 8 epochs: 1
checkpoint_dir: "/tmp/ckpt" checkpoint_every_steps: 100 seed: 7
""",
}


def job_spec():
    for name, text in JOB_SPECS.items():
        write("job_spec_fuzzer", name, text)


def job_file():
    spec = JOB_SPECS["minimal"].strip()
    table = f"""next_id: 3
jobs {{
  id: "job-1"
  spec {{ {spec} model: "lenet5" dataset: "fashion_mnist" mode: "sync" }}
  state: JOB_RUNNING
  tasks {{ role: ROLE_PS index: 0 address: "127.0.0.1:7000" state: TASK_REGISTERED last_heartbeat_ms: 1700000000000 }}
  tasks {{ role: ROLE_WORKER index: 0 address: "127.0.0.1:7001" state: TASK_REGISTERED steps: 10 }}
  tasks {{ role: ROLE_WORKER index: 1 state: TASK_WAITING }}
  submit_ms: 1699999990000
  kv {{ key: "gloo/0" value: "abc" }}
  log {{ seq: 0 text: "worker 0: Step10: 120.70 data/sec" }}
  next_log_seq: 1
}}
jobs {{
  id: "job-2"
  spec {{ {spec} }}
  state: JOB_SUCCEEDED
  submit_ms: 1699999000000
  end_ms: 1699999500000
}}
"""
    write("job_file_fuzzer", "two_jobs", encode("proto/coordinator.proto",
                                                 "JobTableFile", table))
    write("job_file_fuzzer", "empty_table",
          encode("proto/coordinator.proto", "JobTableFile", "next_id: 1"))


def partition():
    # num_shards (i16), num_buffers (i8), kind, partition_bytes, then
    # (kind byte, size) per parameter; see partition_fuzzer.cc.
    def plan(shards, buffers, chunk_words, sizes):
        out = struct.pack("<hbbH", shards, buffers, 0, chunk_words)
        for s in sizes:
            out += struct.pack("<BH", 0, s)
        return out
    write("partition_fuzzer", "lenet5_2shards",
          plan(2, 0, 256, [150, 6, 2400, 16, 30720 % 65536, 120, 10080, 84,
                           840, 10]))
    write("partition_fuzzer", "bn_buffers", plan(3, 2, 16, [100, 7, 7, 7, 7]))
    write("partition_fuzzer", "one_shard", plan(1, 0, 1, [3, 1, 2]))


def safetensors_file(tensors, metadata):
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    buf = b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(buf), len(buf) + len(data)]}
        buf += data
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + buf


def safetensors():
    with open("testdata/tiny.safetensors", "rb") as f:
        write("safetensors_fuzzer", "tiny", f.read())
    # A shard checkpoint (server/shard_checkpoint.cc): "chunks" rows of
    # (param_id, offset, num_elements, version, is_buffer) and each chunk's
    # "p:offset:n:w" weights, plus m and v unless a buffer.
    rows = [(0, 0, 4, 3, 0), (0, 4, 2, 3, 0), (1, 0, 2, 3, 1)]
    tensors = [("chunks", "I64", [len(rows), 5],
                b"".join(struct.pack("<5q", *r) for r in rows))]
    for p, off, n, _, buf in rows:
        kinds = "w" if buf else "wmv"
        for k in kinds:
            tensors.append(("%d:%d:%d:%s" % (p, off, n, k), "F32", [n],
                            f32([0.25 * (i + 1) for i in range(n)])))
    write("safetensors_fuzzer", "shard_checkpoint",
          safetensors_file(tensors, {"format": "pstrain-shard-checkpoint/1",
                                     "shard": "0", "num_shards": "1",
                                     "step": "3"}))


def manifest():
    j = {
        "format": "pstrain-checkpoint/1", "step": 7, "mode": "sync",
        "model": "lenet5", "dataset": "fashion_mnist", "num_shards": 2,
        "partition_bytes": 4194304,
        "optimizer": {"name": "adam", "lr": 0.001, "beta1": 0.9,
                      "beta2": 0.999, "epsilon": 1e-8, "weight_decay": 0.0,
                      "step_count": 7},
        "data_position": {"epoch": 0, "step_in_epoch": 7,
                          "steps_per_epoch": 100, "seed": 1,
                          "batch_size": 64, "num_workers": 2},
        "tensors": [{"name": "conv1.weight", "shape": [6, 1, 5, 5],
                     "buffer": False},
                    {"name": "conv1.bias", "shape": [6], "buffer": False},
                    {"name": "bn.running_mean", "shape": [6],
                     "buffer": True}],
        "shards": [{"file": "shard-0.safetensors", "size_bytes": 1000,
                    "crc32": 1, "min_version": 7, "max_version": 7},
                   {"file": "shard-1.safetensors", "size_bytes": 2000,
                    "crc32": 2, "min_version": 7, "max_version": 7}],
        "model_file": {"file": "model.safetensors", "size_bytes": 3000,
                       "crc32": 3},
    }
    # The fuzzer sets "crc32" itself (see checkpoint_manifest_fuzzer.cc).
    write("checkpoint_manifest_fuzzer", "lenet5", json.dumps(j, indent=1))
    j2 = dict(j, crc32=zlib.crc32(b"wrong"))
    write("checkpoint_manifest_fuzzer", "bad_crc", "#" + json.dumps(j2))


def checkpoint_files():
    """A whole checkpoint of one shard: a 4-element parameter "a" and a
    2-element buffer "b" at step 7 (epoch 1, step 2 of 5), packed as
    checkpoint_files_fuzzer.cc reads it (flags 3: the fuzzer sets the
    manifest's crc32 and the files' sizes and crc32 itself)."""
    rows = [(0, 0, 4, 7, 0), (1, 0, 2, 7, 1)]
    tensors = [("chunks", "I64", [len(rows), 5],
                b"".join(struct.pack("<5q", *r) for r in rows))]
    for p, off, n, _, buf in rows:
        for k in ("w" if buf else "wmv"):
            tensors.append(("%d:%d:%d:%s" % (p, off, n, k), "F32", [n],
                            f32([0.25 * (i + 1) for i in range(n)])))
    shard = safetensors_file(tensors, {
        "format": "pstrain-shard-checkpoint/1", "shard": "0",
        "num_shards": "1", "step": "7"})
    model = safetensors_file(
        [("a", "F32", [4], f32([0.25, 0.5, 0.75, 1.0])),
         ("b", "F32", [2], f32([0.25, 0.5]))],
        {"format": "pstrain.model/1", "model": "synthetic",
         "input_chw": "1,1,1", "num_classes": "2", "steps": "7",
         "dataset": "synthetic"})
    j = {
        "format": "pstrain-checkpoint/1", "step": 7, "mode": "sync",
        "model": "synthetic", "dataset": "synthetic", "num_shards": 1,
        "partition_bytes": 4194304,
        "optimizer": {"name": "adam", "lr": 0.001, "beta1": 0.9,
                      "beta2": 0.999, "epsilon": 1e-8, "weight_decay": 0.0,
                      "step_count": 7},
        "data_position": {"epoch": 1, "step_in_epoch": 2,
                          "steps_per_epoch": 5, "seed": 1,
                          "batch_size": 4, "num_workers": 1},
        "tensors": [{"name": "a", "shape": [4], "buffer": False},
                    {"name": "b", "shape": [2], "buffer": True}],
        "shards": [{"file": "shard-0.safetensors", "size_bytes": 0,
                    "crc32": 0, "min_version": 7, "max_version": 7}],
        "model_file": {"file": "model.safetensors", "size_bytes": 0,
                       "crc32": 0},
    }
    text = json.dumps(j, separators=(",", ":")).encode()

    def pack(flags):
        return (bytes([flags]) + struct.pack("<H", len(text)) + text +
                struct.pack("<H", len(shard)) + shard + model)

    write("checkpoint_files_fuzzer", "synthetic", pack(3))
    # The same with a FIFO for the shard, /dev/zero for the model file.
    write("checkpoint_files_fuzzer", "fifo_shard", pack(3 | 4))
    write("checkpoint_files_fuzzer", "dev_zero_model", pack(3 | 8))


def parameter_shard():
    # Header: workers-1, mode, shards-1, shard index, params-1, sizes...,
    # partition words-1, buffers, init flags, then operations (see
    # parameter_shard_fuzzer.cc); values of style 0 are int8 / 8.
    def header(workers, mode, params, sizes, words, buffers):
        out = bytes([workers - 1, mode, 0, 0, params - 1])
        out += bytes(s - 1 for s in sizes) + bytes([words - 1, buffers, 0])
        out += bytes(range(1, 1 + sum(sizes)))  # initial values
        return out

    def push(chunk, n, worker=0, style=0):
        return bytes([0, style << 6, chunk, worker]) + bytes(
            (3 * i + 1) % 256 for i in range(n))
    sync = header(2, 0, 2, [6, 2], 4, 0)
    ops = b""
    for step in range(3):
        for w in range(2):
            ops += push(0, 4, w) + push(1, 2, w) + push(2, 2, w)
        ops += bytes([4, 1, 0])  # pull version step+1
    write("parameter_shard_fuzzer", "sync_two_workers",
          sync + ops + bytes([5, 3, 7, 0x10, 0]))
    asyn = header(1, 1, 3, [5, 3, 2], 2, 1)
    ops = b"".join(push(c, 2) for c in range(5)) + bytes([4, 0, 0])
    write("parameter_shard_fuzzer", "async_buffers", asyn + ops)
    write("parameter_shard_fuzzer", "nonfinite",
          sync + push(0, 16, 0, 1) + bytes([0, 0x40, 0, 0]) +
          b"\x00\x00\xc0\x7f" * 4 + bytes([6, 0, 4, 0, 0]))


def image_decode():
    # Window bytes (top, left, height, width fractions of 255), then a small
    # file as PIL writes them: 4:2:0, 4:4:4, progressive, gray and CMYK
    # JPEGs, RGB and palette PNGs.
    import io
    from PIL import Image
    pixels = bytes((7 * x + 11 * y + 60 * c + (x * y) % 13) % 256
                   for y in range(21) for x in range(37) for c in range(3))
    rgb = Image.frombytes("RGB", (37, 21), pixels)
    files = {
        "jpeg_420": (rgb, "JPEG", dict(quality=80)),
        "jpeg_444": (rgb, "JPEG", dict(quality=80, subsampling=0)),
        "jpeg_progressive": (rgb, "JPEG", dict(quality=80, progressive=True)),
        "jpeg_gray": (rgb.convert("L"), "JPEG", dict(quality=80)),
        "jpeg_cmyk": (rgb.convert("CMYK"), "JPEG", dict(quality=80)),
        "png_rgb": (rgb, "PNG", {}),
        "png_palette": (rgb.convert("P"), "PNG", {}),
    }
    for i, (name, (image, fmt, options)) in enumerate(sorted(files.items())):
        out = io.BytesIO()
        image.save(out, fmt, **options)
        window = bytes([(40 * i) % 256, (90 * i) % 256, 128, 200])
        write("image_decode_fuzzer", name, window + out.getvalue())


if __name__ == "__main__":
    chunk_message()
    job_spec()
    job_file()
    partition()
    safetensors()
    manifest()
    checkpoint_files()
    parameter_shard()
    image_decode()
