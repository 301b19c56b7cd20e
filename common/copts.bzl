"""Compiler options that more than one package's BUILD file gives a library.

VECTORIZE_LOOPS: GCC 12 at -O2 vectorises only loops whose trip count it
knows to be a multiple of the vector length ("very cheap" cost model), so a
loop over a tensor's elements runs one element at a time;
-fvect-cost-model=dynamic lets it vectorise them. For libraries whose loops
are element-wise float operations (no reduction is reordered), so the
vectorised values are the scalar ones, bit for bit (docs/ARCHITECTURE.md,
"Hot loops and the build"). A gcc flag: clang, in the fuzz build, would
warn, so that build leaves it out.
"""

VECTORIZE_LOOPS = select({
    "//fuzz:libfuzzer": [],
    "//conditions:default": ["-fvect-cost-model=dynamic"],
})
