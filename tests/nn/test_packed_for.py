"""A runner packs its weights again unless they are the call's parameters as they are now: the same
Parameter objects (or views of them) at the same addresses and versions."""

from __future__ import annotations

import gc

import torch

from cellfuse.nn.packed_for import PackedFor


def params():
    w = torch.nn.Parameter(torch.randn(4, 6))
    b = torch.nn.Parameter(torch.randn(6))
    return w, b


def test_the_same_parameters_match_until_one_changes_in_place():
    w, b = params()
    packed = PackedFor()
    assert not packed.matches([w, b])  # nothing packed yet
    packed.remember([w, b])
    assert packed.matches([w, b])
    assert packed.matches([w[:, :3].t(), b])  # a view made anew is the same parameter's
    with torch.no_grad():
        w.mul_(2.0)  # an optimizer's step: the version moves on
    assert not packed.matches([w, b])


def test_the_tensors_packed_given_again_match_without_asking_for_their_parameters(monkeypatch):
    """A module's views kept from call to call: the same objects are the same Parameters' (the owners'
    check, slow, is made only for tensors other than those given last: a module's views made again after
    a change of grad mode are checked once)."""
    from cellfuse.nn import packed_for

    w, b = params()
    views = [w[:, :3].t(), b]
    packed = PackedFor()
    packed.remember(views)
    asked, owner = [], packed_for.owner

    def counted(p):
        asked.append(p)
        return owner(p)
    monkeypatch.setattr(packed_for, "owner", counted)
    assert packed.matches(views) and not asked
    again = [w[:, :3].t(), b]
    assert packed.matches(again) and len(asked) == 1  # (a view made anew: its owner checked)
    assert packed.matches(again) and len(asked) == 1  # (the views given last are those asked for next)
    with torch.no_grad():
        w.mul_(2.0)
    assert not packed.matches(again)


def test_other_parameters_at_the_same_addresses_and_versions_do_not_match():
    """A module made after another was freed may get its memory, at the same versions: other objects."""
    w, b = params()
    packed = PackedFor()
    packed.remember([w, b])
    twin = torch.nn.Parameter(w.data)  # the same memory and version counter, another Parameter
    assert twin.data_ptr() == w.data_ptr() and twin._version == w._version
    assert not packed.matches([twin, b])


def test_a_freed_parameter_never_matches_again():
    w, b = params()
    packed = PackedFor()
    packed.remember([w, b])
    key_w = (w.data_ptr(), w._version)
    del w
    gc.collect()
    stand_in = torch.nn.Parameter(torch.empty(4, 6))
    if (stand_in.data_ptr(), stand_in._version) == key_w:  # the allocator gave its memory back: still no
        assert not packed.matches([stand_in, b])
    assert packed._owners[0]() is None  # the weak reference is dead


def test_tensors_of_their_own_are_packed_at_every_call():
    w, b = params()
    computed = w * 1.0  # torch.func.functional_call's kind: not a Parameter, nor a view of one
    packed = PackedFor()
    packed.remember([computed, b])
    assert not packed.matches([computed, b])
    packed.remember([w, b])
    packed.forget()
    assert not packed.matches([w, b])


def test_parameters_made_under_inference_mode_are_packed_at_every_call():
    """An inference tensor keeps no version counter (asking for it raises): it cannot be told unchanged."""
    with torch.inference_mode():
        w, b = params()
        packed = PackedFor()
        packed.remember([w, b])
        assert not packed.matches([w, b])


def runner_packings():
    """A CUDA runner's choice of packed weights per module, on the CPU's memory (no programs)."""
    from collections import OrderedDict

    from cellfuse.nn.cuda_runner import CudaRunner

    runner = CudaRunner.__new__(CudaRunner)
    runner._packings, runner._captured, runner._images, runner._uses = OrderedDict(), set(), {}, {}
    runner.weight_bytes, runner.device = 64, torch.device("cpu")
    return runner


def test_each_module_keeps_its_own_packed_weights_in_a_shared_runner():
    runner = runner_packings()
    a, b = params(), params()
    memory_a, for_a = runner._packing(a)
    for_a.remember(a)
    memory_b, for_b = runner._packing(b)
    assert memory_b.data_ptr() != memory_a.data_ptr()
    assert runner._packing(a) == (memory_a, for_a)  # called in turn: a's are still packed
    assert for_a.matches(a) and not for_b.matches(a)


def test_freed_modules_packings_go_first_then_the_least_recently_used_but_never_a_captured_one():
    from cellfuse.nn import cuda_runner
    from cellfuse.nn.cuda_runner import MAX_PACKINGS

    runner = runner_packings()
    modules = [params() for _ in range(MAX_PACKINGS)]
    for m in modules:
        runner._packing(m)[1].remember(m)
    captured = runner._packing(modules[0])[0]
    runner._captured.add(captured.data_ptr())
    runner._packing(modules[1])  # modules[2] is now the least recently used but one that is captured
    evicted = runner._packings[id(modules[2][0])][0].data_ptr()
    runner._uses[evicted] = cuda_runner._Uses({1}, 1)  # the streams its runs were put on
    newcomer = params()
    runner._packing(newcomer)
    held = {id(m[0]) for m in modules if id(m[0]) in runner._packings}
    assert len(runner._packings) == MAX_PACKINGS
    assert id(modules[0][0]) in held and id(modules[2][0]) not in held
    assert evicted not in runner._uses  # (its address may be another packing's next)
    later = params()  # made first, so that it cannot take the freed one's id
    freed = id(modules[5][0])
    del modules[5]
    gc.collect()
    runner._packing(later)  # a freed module's packing goes before any one in use
    assert freed not in runner._packings and id(modules[3][0]) in runner._packings
