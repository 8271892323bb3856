"""Reading and writing safetensors files by hand, as models/checkpoint.hpp lays them out.

  bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
  bytes [8, 8 + N)    a JSON object: {"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}}
                      padded with spaces so that the data section starts at a multiple of 8
  bytes [8 + N, end)  each tensor's elements, row-major, little-endian, at [begin, end) of the data section

The writer also records tapegrad's checksum (FNV-1a 64 of the data section, "tapegrad.checksum") so that
tapegrad verifies the file; the reader checks it when present.
"""

import json
import struct

import numpy as np

DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "I32": np.dtype("<i4")}
CHECKSUM_KEY = "tapegrad.checksum"


def fnv1a64(data):
    """FNV-1a 64 of a byte string, as models/checkpoint.cpp computes it."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def save(path, tensors, metadata=None):
    """tensors: {name: numpy array of float32, float64 or int32}, written in the given order."""
    header = {"__metadata__": dict(metadata or {})}
    chunks, offset = [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        code = next((c for c, dt in DTYPES.items() if array.dtype == dt), None)
        if code is None:
            raise ValueError(f"{name}: unsupported dtype {array.dtype} (F32, F64 and I32 only)")
        raw = array.astype(DTYPES[code], copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    data = b"".join(chunks)
    header["__metadata__"][CHECKSUM_KEY] = f"{fnv1a64(data):016x}"
    text = json.dumps(header, ensure_ascii=False).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(data)


def load(path):
    """Returns ({name: numpy array}, {metadata key: value}); checks the tapegrad checksum when present."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    data = blob[8 + n :]
    metadata = header.pop("__metadata__", {})
    if CHECKSUM_KEY in metadata and metadata[CHECKSUM_KEY] != f"{fnv1a64(data):016x}":
        raise ValueError(f"{path}: checksum mismatch")
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = DTYPES[entry["dtype"]]
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"]).copy()
    return tensors, metadata
