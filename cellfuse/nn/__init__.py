"""The cell as a PyTorch module: `CellRNN`, whose forward and backward passes run CellFuse's Plans.

A face, like the editor and the command line: it imports the parts below it, and nothing imports it.
It is the one part of CellFuse that needs PyTorch (`pip install 'cellfuse[torch]'`)."""

try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("cellfuse.nn needs PyTorch: pip install 'cellfuse[torch]'") from None

from .cell_rnn import CellRNN
from .torch_rnn import GRU, LSTM

__all__ = ["CellRNN", "GRU", "LSTM"]
