"""A state tree as JSON plus named tensors: a checkpoint format that nothing can execute code from.

`encode_tree(tree)` -> (json_text, tensors): every tensor (and numpy array) is taken out of the tree and replaced by a
key into `tensors` (a flat name -> tensor dict, saved with safetensors); everything else must be plain data.
`decode_tree(json_text, tensors)` rebuilds the tree. Neither side unpickles, imports or calls anything named by the
file: the JSON holds only the node kinds below, and safetensors holds raw numbers behind a JSON header.

    node                            JSON
    None, bool, int, str            itself
    float (finite)                  a JSON number (Python's repr: reads back to the same bits)
    float nan / inf / -inf          {"$float": "nan" | "inf" | "-inf"}       (strict JSON has no NaN)
    list                            [node, ...]
    tuple                           {"$tuple": [node, ...]}                  (random.setstate needs tuples)
    dict, str keys not "$..."       {key: node, ...}
    any other dict                  {"$dict": [[key node, value node], ...]} (optimizer state has int keys)
    torch.Tensor                    {"$tensor": name}                        (dtype and shape: safetensors)
    numpy.ndarray (numeric)         {"$ndarray": name, "dtype": "<u4", "shape": [624]}  (bytes as a uint8 tensor)
    numpy scalar (bool/int/float)   {"$npscalar": "<f4", "value": number}

Anything else (an object, a function, a set, a complex number, an object array) is refused by `encode_tree` with its
place in the tree (`state['optimizer']['state'][0]['foo']`), so a bad state fails at save time, not at resume.
Tensor names are the tree path joined by "/" (e.g. `weights/lm_head.weight`), made unique if two paths collide.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch

TAGS = ("$float", "$tuple", "$dict", "$tensor", "$ndarray", "$npscalar")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class TreeCodecError(ValueError):
    """A value cannot be stored (at encode) or a file does not describe a tree (at decode); names the place."""


def _where(path: tuple[Any, ...]) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


def encode_tree(tree: Any) -> tuple[str, dict[str, torch.Tensor]]:
    """(JSON text, tensors by name) of `tree`; raises TreeCodecError naming the first value it cannot store."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[tuple[str, int]] = set()

    def put(tensor: torch.Tensor, path: tuple[Any, ...]) -> str:
        name = "/".join(str(p) for p in path) or "root"
        base, n = name, 1
        while name in tensors:
            name, n = f"{base}#{n}", n + 1
        if tensor.is_sparse or tensor.is_quantized or tensor.is_complex():
            raise TreeCodecError(f"{_where(path)}: a {tensor.layout} / {tensor.dtype} tensor cannot be stored; "
                                 "convert it to a dense real tensor first")
        t = tensor.detach().to("cpu").contiguous()
        storage = (str(tensor.device), t.untyped_storage().data_ptr())
        if storage in storages and t.numel():  # safetensors refuses tensors that share memory
            t = t.clone()
        storages.add(storage)
        tensors[name] = t
        return name

    def enc(x: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(x, np.generic):  # before float: numpy's float64 is a Python float too
            if x.dtype.kind not in "biuf":
                raise TreeCodecError(f"{_where(path)}: a numpy {x.dtype} scalar cannot be stored")
            return {"$npscalar": x.dtype.str, "value": enc(x.item(), path)}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            if math.isfinite(x):
                return float(x)
            return {"$float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if isinstance(x, torch.Tensor):
            return {"$tensor": put(x, path)}
        if isinstance(x, np.ndarray):
            if x.dtype.kind not in "biuf":
                raise TreeCodecError(f"{_where(path)}: a numpy array of dtype {x.dtype} cannot be stored; only "
                                     "bool, integer and float arrays")
            raw = torch.from_numpy(np.ascontiguousarray(x).reshape(-1).view(np.uint8).copy())
            return {"$ndarray": put(raw, path), "dtype": x.dtype.str, "shape": list(x.shape)}
        if isinstance(x, list):
            return [enc(v, path + (i,)) for i, v in enumerate(x)]
        if isinstance(x, tuple):
            return {"$tuple": [enc(v, path + (i,)) for i, v in enumerate(x)]}
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: enc(v, path + (k,)) for k, v in x.items()}
            return {"$dict": [[enc(k, path + ("<key>",)), enc(v, path + (k,))] for k, v in x.items()]}
        raise TreeCodecError(f"{_where(path)}: a {type(x).__module__}.{type(x).__qualname__} cannot be stored in a "
                             "checkpoint (only tensors, numpy arrays, numbers, strings, None, lists, tuples and "
                             "dicts); turn it into one of those in its state_dict()")

    return json.dumps(enc(tree, ()), allow_nan=False), tensors


def decode_tree(text: str, tensors: dict[str, torch.Tensor]) -> Any:
    """The tree that `encode_tree` turned into (text, tensors). Raises TreeCodecError for a node it does not know."""

    def tensor(name: Any, path: tuple[Any, ...]) -> torch.Tensor:
        if not isinstance(name, str) or name not in tensors:
            raise TreeCodecError(f"{_where(path)}: tensor {name!r} is not in the tensor file")
        return tensors[name]

    def dec(x: Any, path: tuple[Any, ...]) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [dec(v, path + (i,)) for i, v in enumerate(x)]
        if not isinstance(x, dict):
            raise TreeCodecError(f"{_where(path)}: unexpected JSON value {x!r}")
        tag = next((k for k in x if k in TAGS), None)
        if tag is None:
            return {k: dec(v, path + (k,)) for k, v in x.items()}
        try:
            return special(tag, x, path)
        except TreeCodecError:
            raise
        except (TypeError, ValueError, KeyError) as e:
            raise TreeCodecError(f"{_where(path)}: malformed {tag} node {x!r} ({e})") from None

    def special(tag: str, x: dict[str, Any], path: tuple[Any, ...]) -> Any:
        value = x[tag]
        if tag == "$float" and value in _NONFINITE:
            return _NONFINITE[value]
        if tag == "$tuple" and isinstance(value, list):
            return tuple(dec(v, path + (i,)) for i, v in enumerate(value))
        if tag == "$dict" and isinstance(value, list):
            pairs = [(dec(k, path + ("<key>",)), v) for k, v in value]
            return {k: dec(v, path + (k,)) for k, v in pairs}
        if tag == "$tensor":
            return tensor(value, path)
        if tag in ("$ndarray", "$npscalar"):
            dtype = np.dtype(x["dtype"] if tag == "$ndarray" else value)
            if dtype.kind not in "biuf":
                raise TreeCodecError(f"{_where(path)}: numpy dtype {dtype} is not allowed")
            if tag == "$npscalar":
                return dtype.type(dec(x["value"], path))
            return tensor(value, path).numpy().view(dtype).reshape(x["shape"]).copy()
        raise TreeCodecError(f"{_where(path)}: malformed {tag} node {x!r}")

    try:
        tree = json.loads(text)
    except json.JSONDecodeError as e:
        raise TreeCodecError(f"not valid JSON ({e})") from None
    return dec(tree, ())
