"""fastai's weight-drop wrapper of torch's recurrent modules (AWD-LSTM's), as code that wraps
torch.nn.LSTM writes it, for the drop-ins' tests: the module's recurrent weight is deleted as a
Parameter, kept as the wrapper's, and a dropout of it set in its place before every call."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class WeightDropout(torch.nn.Module):
    """Wraps `module`, whose weight `name` becomes a dropout (probability `p`) of the wrapper's
    `{name}_raw` while training, a copy of it otherwise."""

    def __init__(self, module: torch.nn.Module, p: float, name: str = "weight_hh_l0"):
        super().__init__()
        self.module, self.p, self.name = module, p, name
        w = getattr(module, name)
        delattr(module, name)
        self.register_parameter(f"{name}_raw", torch.nn.Parameter(w.data))
        setattr(module, name, w.clone())

    def forward(self, *args):
        raw = getattr(self, f"{self.name}_raw")
        setattr(self.module, self.name, F.dropout(raw, self.p) if self.training else raw.clone())
        return self.module(*args)
