"""Syntax colours for CUDA C: keywords, types, CUDA qualifiers and built-ins, numbers, strings,
preprocessor lines and comments (line and block).

Matching uses Python's `re` (the generated source is ASCII, so string offsets are Qt's offsets):
iterating QRegularExpression matches from Python corrupts reference counts in PySide6 6.12.
"""

from __future__ import annotations

import re

from PySide6 import QtGui

KEYWORDS = ("if else for while do return break continue switch case default sizeof struct typedef "
            "const static extern inline namespace using template typename enum union goto volatile "
            "restrict __restrict__ nullptr true false")
TYPES = ("void int float double char bool unsigned signed long short size_t dim3 float2 float4 "
         "cudaError_t cudaStream_t cudaEvent_t cublasHandle_t cublasStatus_t")
CUDA_WORDS = ("__global__ __device__ __host__ __shared__ __constant__ __forceinline__ __launch_bounds__ "
              "threadIdx blockIdx blockDim gridDim warpSize __syncthreads")


def _fmt(color: str, bold: bool = False, italic: bool = False) -> QtGui.QTextCharFormat:
    f = QtGui.QTextCharFormat()
    f.setForeground(QtGui.QColor(color))
    if bold:
        f.setFontWeight(QtGui.QFont.Weight.Bold)
    f.setFontItalic(italic)
    return f


class CudaHighlighter(QtGui.QSyntaxHighlighter):
    def __init__(self, document: QtGui.QTextDocument) -> None:
        super().__init__(document)

        def words(text: str) -> re.Pattern[str]:
            return re.compile(r"\b(" + "|".join(text.split()) + r")\b")

        self._rules = [
            (words(KEYWORDS), _fmt("#c792ea", bold=True)),
            (words(TYPES), _fmt("#82aaff")),
            (words(CUDA_WORDS), _fmt("#ffcb6b", bold=True)),
            (re.compile(r"\b(cublas\w+|cuda\w+|cf_\w+)\b"), _fmt("#89ddff")),
            (re.compile(r"\b[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?[fFuUlL]*\b"), _fmt("#f78c6c")),
            (re.compile(r'"([^"\\]|\\.)*"'), _fmt("#c3e88d")),
            (re.compile(r"^\s*#\s*\w+.*$"), _fmt("#f07178")),
            (re.compile(r"//.*$"), _fmt("#7f8c98", italic=True)),
        ]
        self._comment = _fmt("#7f8c98", italic=True)

    def highlightBlock(self, text: str) -> None:  # noqa: N802 (Qt's name)
        for regex, fmt in self._rules:
            for m in regex.finditer(text):
                self.setFormat(m.start(), m.end() - m.start(), fmt)
        # Block comments, which may span lines.
        self.setCurrentBlockState(0)
        start = 0 if self.previousBlockState() == 1 else text.find("/*")
        while start >= 0:
            end = text.find("*/", start + (0 if self.previousBlockState() == 1 and start == 0 else 2))
            if end >= 0:
                self.setFormat(start, end + 2 - start, self._comment)
                start = text.find("/*", end + 2)
            else:
                self.setCurrentBlockState(1)
                self.setFormat(start, len(text) - start, self._comment)
                break
