"""CellRNN trained with torch.distributed's DistributedDataParallel over NCCL on two GPUs: a few steps of
a language model on a global batch split between the ranks end at the parameters one GPU reaches on the
whole batch. No gradient exchange of CellFuse's own: DDP's hooks on the parameters do it."""

from __future__ import annotations

import socket

import pytest
import torch

pytestmark = pytest.mark.gpu

STEPS, VOCAB, T, B = 4, 40, 12, 8


class LanguageModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        from cellfuse.nn import CellRNN

        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.rnn = CellRNN("lstm", 32, 48, 2, schedule="persistent", seed=11)
        self.head = torch.nn.Linear(48, VOCAB)

    def forward(self, tokens):
        y, _ = self.rnn(self.embed(tokens))
        return self.head(y)


def _data():
    """The same batch at every step: its loss must fall."""
    tokens = torch.randint(0, VOCAB, (T + 1, B), generator=torch.Generator().manual_seed(5))
    return [tokens] * STEPS


def _train(model, batches, device) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for tokens in batches:
        tokens = tokens.to(device)
        optimizer.zero_grad()
        logits = model(tokens[:-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[1:].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _rank(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        torch.manual_seed(0)
        model = LanguageModel().to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        half = B // 2
        _train(ddp, [tokens[:, rank * half:(rank + 1) * half] for tokens in _data()], device)
        if rank == 0:
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_on_two_gpus_matches_one_gpu_on_the_whole_batch(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    out = str(tmp_path / "ddp.pt")
    torch.multiprocessing.spawn(_rank, args=(_free_port(), out), nprocs=2, join=True)
    torch.manual_seed(0)
    single = LanguageModel().to("cuda:0")
    losses = _train(single, _data(), torch.device("cuda:0"))
    assert losses[-1] < losses[0]
    ddp = torch.load(out)
    for name, value in single.state_dict().items():
        torch.testing.assert_close(ddp[name], value.cpu(), rtol=1e-4, atol=1e-5, msg=name)
