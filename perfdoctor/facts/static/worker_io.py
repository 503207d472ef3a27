"""File I/O at the DataLoader workers' hot line (PD024): for a `worker_hotspot` the run measured
(py-spy on the workers) in this file, the open / read / decode call on that line, as written
(`worker_hotspot.io_call`). The run measures where the workers spend their time; the source says
what that line does."""

from __future__ import annotations

import ast

from perfdoctor.facts.model import Facts
from perfdoctor.facts.static.index import SourceIndex, put

# calls that open, read or decode a file
IO_CALLS = frozenset({
    "open", "io.open", "PIL.Image.open", "cv2.imread", "cv2.imdecode", "numpy.load", "numpy.fromfile",
    "numpy.loadtxt", "torch.load", "torchvision.io.read_image", "torchvision.io.decode_image",
    "torchvision.io.read_file", "torchvision.io.decode_jpeg", "imageio.imread", "imageio.v3.imread",
    "skimage.io.imread", "soundfile.read", "torchaudio.load", "librosa.load", "h5py.File", "json.load",
    "pickle.load", "pandas.read_csv", "pandas.read_parquet", "scipy.io.wavfile.read", "tifffile.imread",
})
IO_METHODS = frozenset({"read", "read_bytes", "read_text", "readlines"})


def _io_call(index: SourceIndex, call: ast.Call) -> bool:
    q = index.qual(call.func)
    if q in IO_CALLS:
        return True
    f = call.func
    if isinstance(f, ast.Name) and f.id == "open" and f.id not in index.aliases:
        return True
    return isinstance(f, ast.Attribute) and f.attr in IO_METHODS


def detect(index: SourceIndex, facts: Facts) -> None:
    for s in facts.of_kind("worker_hotspot"):
        if not s.locations or s.locations[0].file != index.file:
            continue
        line = s.locations[0].line
        calls = [c for c in index.calls if c.lineno <= line <= (c.end_lineno or c.lineno) and _io_call(index, c)]
        if calls:
            outer = min(calls, key=lambda c: (c.lineno, c.col_offset))
            put(s, "io_call", index.text(outer))
