"""Syntax colours for CUDA C: keywords, types, CUDA qualifiers and built-ins, numbers, strings,
preprocessor lines and comments (line and block)."""

from __future__ import annotations

from PySide6 import QtCore, QtGui

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
        words = lambda text: r"\b(" + "|".join(text.split()) + r")\b"  # noqa: E731
        self._rules = [
            (QtCore.QRegularExpression(words(KEYWORDS)), _fmt("#c792ea", bold=True)),
            (QtCore.QRegularExpression(words(TYPES)), _fmt("#82aaff")),
            (QtCore.QRegularExpression(r"(__global__|__device__|__host__|__shared__|__constant__|"
                                       r"__forceinline__|__launch_bounds__|__syncthreads)"
                                       r"|\b(threadIdx|blockIdx|blockDim|gridDim|warpSize)\b"),
             _fmt("#ffcb6b", bold=True)),
            (QtCore.QRegularExpression(r"\b(cublas\w+|cuda\w+|cf_\w+)\b"), _fmt("#89ddff")),
            (QtCore.QRegularExpression(r"\b[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?[fFuUlL]*\b"), _fmt("#f78c6c")),
            (QtCore.QRegularExpression(r'"([^"\\]|\\.)*"'), _fmt("#c3e88d")),
            (QtCore.QRegularExpression(r"^\s*#\s*\w+.*$"), _fmt("#f07178")),
            (QtCore.QRegularExpression(r"//[^\n]*"), _fmt("#7f8c98", italic=True)),
        ]
        self._comment = _fmt("#7f8c98", italic=True)
        self._start = QtCore.QRegularExpression(r"/\*")
        self._end = QtCore.QRegularExpression(r"\*/")

    def highlightBlock(self, text: str) -> None:  # noqa: N802 (Qt's name)
        for regex, fmt in self._rules:
            it = regex.globalMatch(text)
            while it.hasNext():
                m = it.next()
                self.setFormat(m.capturedStart(), m.capturedLength(), fmt)
        # Block comments, which may span lines.
        self.setCurrentBlockState(0)
        start = 0
        if self.previousBlockState() != 1:
            m = self._start.match(text)
            start = m.capturedStart() if m.hasMatch() else -1
        while start >= 0:
            end = self._end.match(text, start)
            if end.hasMatch():
                length = end.capturedEnd() - start
                self.setFormat(start, length, self._comment)
                m = self._start.match(text, start + length)
                start = m.capturedStart() if m.hasMatch() else -1
            else:
                self.setCurrentBlockState(1)
                self.setFormat(start, len(text) - start, self._comment)
                break
