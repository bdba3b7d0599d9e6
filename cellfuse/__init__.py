"""CellFuse: draw a recurrent cell, get a fused CUDA schedule for the whole sequence."""

__version__ = "0.1.0"
