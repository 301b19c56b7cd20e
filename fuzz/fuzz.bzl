"""pstrain_fuzzer: one libFuzzer target and its corpus regression test.

`bazel build --config=fuzz //fuzz:NAME` (clang-14, see .bazelrc) links
libFuzzer's main: `bazel-bin/fuzz/NAME fuzz/corpus/NAME` fuzzes. Any other
build (gcc, --config=asan) links fuzz/standalone_main.cc instead, which runs
the inputs it is given once each. NAME_corpus_test runs every committed input
of fuzz/corpus/NAME (seeds and regression inputs of fixed crashes) in
`bazel test //...`.
"""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_test")

def pstrain_fuzzer(name, srcs, deps):
    cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:standalone_main"],
        }),
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = srcs,
        deps = deps + ["//fuzz:standalone_main"],
        data = native.glob(["corpus/" + name + "/**"]),
        args = ["fuzz/corpus/" + name],
    )
