# Sourced by scripts/gpu_bundle.sh and tests/gpu_bundle_test.sh: the shared
# libraries a GPU host provides, which the bundle therefore leaves out:
# glibc's, and NVIDIA's (the driver's libcuda; cudart, cuBLAS, cuDNN, NCCL,
# NVRTC and nvJitLink from its CUDA toolkit or PyTorch's nvidia-* packages).
# A regular expression over sonames ("libcudnn.so.9").
# shellcheck disable=SC2034
host_lib_re='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libcudnn[a-z_]*\.so|libnccl\.so|libnvrtc[a-z-]*\.so|libnvJitLink\.so)'
