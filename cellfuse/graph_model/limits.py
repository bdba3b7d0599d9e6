"""The largest inputs CellFuse accepts, in one place.

Each is far beyond what a real cell, run or file needs, and low enough that an absurd value (a typo, a
hostile file) is refused with a message naming the limit before any work or allocation starts, rather
than ending in a hang or in running out of memory. `params.check_sizes` applies the size limits.
"""

MAX_LAYERS = 1024
MAX_WIDTH = 2**20  # the input and hidden sizes
MAX_LENGTH = 2**24  # the sequence length and the batch
# Elements of float data, counted apart for the weights of all layers and for the activations
# (the input sequence and every layer's outputs): 2**34 float32 are 64 GiB.
MAX_ELEMENTS = 2**34

MAX_NODES = 10_000  # nodes in one cell
MAX_CELL_FILE_BYTES = 16 * 2**20
MAX_EDITOR_DATA_DEPTH = 32  # nesting of the lists and objects under an `x-` key
MAX_GROUP_NAME = 80  # characters in the name of a group of the editor's
