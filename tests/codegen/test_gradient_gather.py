"""The gradients' gathering kernel (codegen.gradient_gather): its source compiles with nvcc, and its
arithmetic (emulated here in numpy from the kernel's own text, branch by branch) writes every output
element as the sum of its sources' elements, covering each output once."""

from __future__ import annotations

import re

import numpy as np
import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.dtypes import BFLOAT16
from cellfuse.codegen.gradient_gather import Gather, Source, gather_kernel_source, total_elements
from cellfuse.codegen.kernel_abi import grid_blocks

GATHERS = [Gather(0, 0, 3, 2, (Source(0, 8),)),                      # a column block of a stacked buffer
           Gather(0, 6, 3, 2, (Source(8, 8), Source(96, 2))),          # a key read by two launches
           Gather(1, 0, 1, 4, (Source(64, 4),)),                       # a key's own tensor
           Gather(2, 0, 1, 5, (Source(120, 5),)),                      # a state's gradient, layer 0
           Gather(2, 5, 1, 5, (Source(140, 5),))]                      # and layer 1
SIZES = (12, 4, 10)  # of the outputs
MEMORY_FLOATS = 40


def test_the_kernel_compiles(tmp_path):
    nvcc_cubin(gather_kernel_source(GATHERS), tmp_path)


def _want(memory: np.ndarray) -> list[np.ndarray]:
    outputs = [np.full(n, np.nan, np.float32) for n in SIZES]
    for g in GATHERS:
        place = np.zeros((g.rows, g.width), np.float32)
        for s in g.sources:
            for r in range(g.rows):
                place[r] += memory[s.at // 4 + r * s.ld:s.at // 4 + r * s.ld + g.width]
        outputs[g.out][g.start:g.start + g.elements] = place.reshape(-1)
    return outputs


def test_each_element_is_the_sum_of_its_sources():
    source = gather_kernel_source(GATHERS)
    branches = re.findall(r"if \(e < (\d+)LL\) \{\n(.*?)\n\s+(?=\}|\Z)", source, re.S)
    assert len(branches) == len(GATHERS)
    memory = np.random.default_rng(0).standard_normal(MEMORY_FLOATS).astype(np.float32)
    got = [np.full(n, np.nan, np.float32) for n in SIZES]
    previous_end = 0
    for end, body in branches:  # the kernel's own numbers: each element's place and its sum
        for e in range(previous_end, int(end)):
            names = {"e": e}
            index = re.search(r"const long long (.*?);", body)
            for assignment in index[1].split(", "):  # "k = e - 6LL", "r = k / 2", "col = k - r * 2"
                name, expr = assignment.split(" = ")
                names[name] = eval(expr.replace("LL", "").replace("/", "//"), {}, names)  # noqa: S307
            out, at, value = re.search(r"o(\d+)\[(.*?)\] = (.*?);", body).groups()
            terms = re.findall(r"\(\(const float\*\)\(memory \+ (\d+)LL\)\)\[r \* (\d+)LL \+ col\]", value)
            total = np.float32(0.0)
            for byte, ld in terms:
                total += memory[int(byte) // 4 + names["r"] * int(ld) + names["col"]]
            assert terms
            place = eval(at.replace("LL", ""), {}, names)  # noqa: S307 (the kernel's own text)
            assert np.isnan(got[int(out)][place]), "an element written twice"
            got[int(out)][place] = total
        previous_end = int(end)
    assert previous_end == total_elements(GATHERS)
    for g, w in zip(got, _want(memory), strict=True):
        np.testing.assert_array_equal(g, w)


def test_the_grid_covers_the_elements_or_strides():
    assert grid_blocks(total_elements(GATHERS)) == 1


def test_no_gathers_or_one_without_a_source_is_refused():
    with pytest.raises(ValueError):
        gather_kernel_source([])
    with pytest.raises(ValueError):
        gather_kernel_source([*GATHERS, Gather(0, 12, 1, 4, ())])


def test_a_16_bit_callers_state_gradients_are_rounded_as_they_are_stored(tmp_path):
    """Outputs given a type (the initial states' gradients of a bf16 or fp16 caller) are pointers of it,
    each sum rounded to it as the type's store does; the others stay float32."""
    source = gather_kernel_source(GATHERS, {2: BFLOAT16})
    assert "float* __restrict__ o0" in source and "__nv_bfloat16* __restrict__ o2" in source
    stores = re.findall(r"(o\d)\[.*?\] = (.*?);\n", source)
    assert [name for name, value in stores if value.startswith("__float2bfloat16_rn(")] == ["o2", "o2"]
    nvcc_cubin(source, tmp_path)
