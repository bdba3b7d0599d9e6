"""The conversion kernels of a run's edges (codegen.conversions): one for every ordered pair of element
types, named apart, each rounding as the type's store does; their source compiles with nvcc."""

from __future__ import annotations

import itertools
import re

import pytest
from compile_cuda import nvcc_ptx

from cellfuse.codegen.conversions import conversion_name, conversions_source
from cellfuse.codegen.dtypes import DTYPES


def test_every_pair_of_types_has_a_kernel_of_its_own():
    source = conversions_source()
    pairs = list(itertools.permutations(DTYPES.values(), 2))
    names = {conversion_name(dst, src) for dst, src in pairs}
    assert len(names) == len(pairs) == 6
    assert set(re.findall(r'extern "C" __global__ void (\w+)\(', source)) == names
    for dst, src in pairs:
        body = source.split(conversion_name(dst, src), 1)[1].split("}", 1)[0]
        assert f"({dst.c}* dst, const {src.c}* src, int n)" in body
        assert f"dst[i] = {dst.store(src.load('src[i]'))};" in body


@pytest.mark.nvcc
def test_the_conversions_compile(tmp_path):
    ptx = nvcc_ptx(conversions_source(), tmp_path)
    assert ptx.count(".entry cf_convert_") == 6
