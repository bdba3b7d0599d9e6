#!/usr/bin/env bash
# The sru package's latest release (2.6.0) dispatches its CUDA kernels on `U.type()`, which current
# PyTorch no longer converts to a scalar type, so its kernel does not compile there ("no suitable
# conversion function from at::DeprecatedTypeProperties to c10::ScalarType", 8 times). This replaces that
# argument with `U.scalar_type()` in the installed package: the same dispatch, no kernel changed. Run it
# once after `pip install sru ninja`, before the benchmark imports sru (which builds the kernel).
set -euo pipefail
dir=$(python3 -c 'import importlib.util as u; print(u.find_spec("sru").submodule_search_locations[0])')
sed -i 's/AT_DISPATCH_FLOATING_TYPES_AND_HALF(U\.type()/AT_DISPATCH_FLOATING_TYPES_AND_HALF(U.scalar_type()/' \
    "$dir/csrc/sru_cuda_kernel.cu"
echo "patched $(grep -c 'U\.scalar_type()' "$dir/csrc/sru_cuda_kernel.cu") dispatches in $dir/csrc/sru_cuda_kernel.cu"
