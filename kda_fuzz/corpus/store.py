"""The regression corpus: failing cases saved as self-contained, bit-exact JSON files.

File format (schema 2; the full reference is ``docs/corpus-format.md``). One JSON object,
UTF-8, standard JSON only (no ``NaN``/``Infinity`` literals)::

    {
      "schema": 2,
      "kind": "mismatch",              # contract | mismatch | crash | timeout
      "description": "one line saying what the file guards against",
      "contract": {"family": "kda", "variant": "triton"},
      "verdict": {...} | null,         # Verdict.to_json() of the recorded failure
      "origin": {"target": ..., "seed": ..., "date": ...},      # information only
      "versions": {"python": ..., "torch": ..., "triton": ..., "helion": ...,
                   "kda_fuzz": ...},                            # information only
      "case": {
        "intent": ["valid"],
        "notes": {"breakages": [...], "semantic": false, ...},
        "scalars": {"scale": 0.125, "use_qk_l2norm_in_kernel": false,
                    "lower_bound": null},
        "tensors": {
          "<name>": {"dtype": "float32", "device": "cpu",       # or "meta" (no bytes)
                     "shape": [...], "stride": [...], "storage_offset": 0,
                     "base_numel": 12,
                     "encoding": "zlib+base64",  # | "base64" | "fill" | "runs"
                                                 # | "recipe" | null (meta)
                     "base_bytes": "<base64>"}   # "fill": "<hex>" for fills
        }
      }
    }

Every tensor argument is stored as its whole 1-D base buffer (guard cells included, bit
for bit: NaN payloads and signed zeros survive) plus the strided view taken of it. The
base's little-endian bytes are written as a fill (``"fill"``: the hex of one element's
bytes, repeated ``base_numel`` times) when every element has the same bits, else, for
a base made from a recipe (:mod:`kda_fuzz.engine.recipe`, the minimizer's), as
``recipe``: the recipe and a patch of the elements that differ from it, else as
``runs`` (fill runs and zlib stretches, in order) when it holds a long stretch of one
value (zeroed unnamed slots, NaN padding), else zlib-compressed (``zlib+base64``) when
that is smaller, else as they are (``base64``). Schema 1 files (``base_bytes`` always
plain base64, no ``encoding``) are still read. Finite floats outside tensors are JSON
numbers (Python's shortest round-trip repr); non-finite ones are ``{"$float": "nan" |
"inf" | "-inf"}`` (``scale`` and ``lower_bound`` must be finite). The file name is
``<kind>-<h>.json`` with ``h`` the first 16 hex digits of the SHA-256 of the canonical
JSON (sorted keys, no whitespace) of ``contract``, ``case.scalars``, ``case.tensors`` in
their schema-1 form (plain base64 ``base_bytes``, whatever the file's encoding) and
``case.notes.semantic``, so saving the same call twice gives one file, under the name
schema 1 gave it (intent and other notes are information and do not count). Files are
written atomically (a temporary file in the same folder, then ``os.replace``; see
:mod:`kda_fuzz.corpus.atomic`) and by ``save_case`` never above :data:`MAX_SAVED_BYTES`
(:class:`CaseTooLarge`); ``save_failure`` saves a finding over it all the same, and
nothing for a bug the folder already holds. Folders are walked for ``**/*.json``,
skipping hidden entries (temporary files, other tools' folders).

Loading never imports, unpickles or evaluates anything named by the file: dtypes,
devices, kinds, encodings and contract families are looked up in fixed tables, and every
field is checked (types, sizes, bytes length, views inside their base) before a tensor
is built. Decompression stops at the byte count the header announces, so a stream that
inflates to more (a zip bomb) is rejected without being inflated. A bad file raises
:class:`CorpusError` naming the file.

This module is the file format only: encoding, decoding, saving, loading, sizes and
digests, and which files a corpus folder holds (:func:`corpus_files`). Replaying a file
(running an entry by its kind, the stale rule, whether it passes) is
:mod:`kda_fuzz.corpus.replay`.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import itertools
import json
import math
import os
import platform
import re
import sys
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from kda_fuzz._version import __version__
from kda_fuzz.corpus.atomic import write_atomic
from kda_fuzz.engine.case import Case, TensorArg
from kda_fuzz.engine.contract import Contract, Expectation
from kda_fuzz.engine.oracle import expectation
from kda_fuzz.engine.recipe import (
    HINTS,
    MAX_RANGES,
    Hint,
    Recipe,
    carry_hints,
    differing,
    hint_of,
    kept_count,
    known_kept,
    realize,
)
from kda_fuzz.engine.verdict import Verdict
from kda_fuzz.execution import RUNTIMES
from kda_fuzz.families import get_contract

SCHEMA = 2
READ_SCHEMAS = (1, 2)
KINDS = ("contract", "mismatch", "crash", "timeout", "flaky", "sanitizer")
ENCODINGS = ("base64", "zlib+base64", "fill", "runs", "recipe")
MAX_ELEMENTS = 2**28  # per base buffer and per view (bytes stored as they are)
MAX_RUN_ELEMENTS = 2**34  # per base and view stored as runs, fills or recipes
RUN_BLOCK = 512  # elements: runs are found block by block ...
MIN_FILL_BLOCKS = 4  # ... and a fill run spans this many whole blocks at least
_RUN_CHUNK = 1 << 14  # blocks compared per step (a bounded scratch on any base)
MAX_NDIM = 8
MAX_FILE_BYTES = 1 << 31  # read at most
MAX_SAVED_BYTES = 16 << 20  # written at most by save_case (the file: compressed bytes)
HARD_SAVED_BYTES = 1 << 30  # a finding no smaller case reproduces is saved up to this
ZLIB_LEVEL = 6
EXACT_ESTIMATE_BYTES = 1 << 20  # encoded_base_size compresses bases up to this size
_SAMPLE_BYTES, _SAMPLES = 1 << 16, 8  # ... and samples larger ones

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DEVICES = ("cpu", "meta")
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}



class CorpusError(Exception):
    """A corpus file that cannot be used, and why."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"bad corpus file {self.path}: {reason}")


class CaseTooLarge(Exception):
    """A case whose corpus file would exceed ``limit`` bytes: nothing was written.

    ``size`` is the exact size the file would have had; ``description`` the full layout
    of the case (``Case.describe()``), for the report that replaces the file.
    """

    def __init__(self, size: int, description: str, limit: int = MAX_SAVED_BYTES) -> None:
        self.size = size
        self.description = description
        self.limit = limit
        super().__init__(f"not saved: {size / 2**20:.1f} MiB over the {limit / 2**20:g} MiB "
                         f"cap ({description})")


# ------------------------------------------------------------------ encoding


def _enc_float(x: float) -> float | dict[str, str]:
    if math.isnan(x):
        return {"$float": "nan"}
    if math.isinf(x):
        return {"$float": "inf" if x > 0 else "-inf"}
    return x


def _jsonable(x: Any) -> Any:
    """Plain JSON values; non-finite floats tagged, tuples as lists, anything else repr'd."""
    if x is None or isinstance(x, bool | int | str):
        return x
    if isinstance(x, float):
        return _enc_float(x)
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return repr(x)


def _unjson(x: Any) -> Any:
    """Inverse of :func:`_jsonable` for the tagged floats."""
    if isinstance(x, dict):
        if set(x) == {"$float"} and x["$float"] in ("nan", "inf", "-inf"):
            return float(x["$float"])
        return {k: _unjson(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_unjson(v) for v in x]
    return x


def _le_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    words = flat.view(_INT_OF_SIZE[flat.element_size()]).numpy()
    if sys.byteorder != "little":
        words = words.byteswap()
    return words.tobytes()


def _from_le_bytes(data: bytes, dtype: torch.dtype, numel: int) -> torch.Tensor:
    if numel == 0:
        return torch.empty(0, dtype=dtype)
    itype = _INT_OF_SIZE[torch.empty(0, dtype=dtype).element_size()]
    words = torch.frombuffer(bytearray(data), dtype=itype)
    if sys.byteorder != "little":
        words = torch.from_numpy(words.numpy().byteswap().copy())
    return words.view(dtype).clone()


def _fill_element(base: torch.Tensor) -> bytes | None:
    """The bytes of the one element every element of ``base`` repeats, bit for bit."""
    if base.device.type == "meta" or base.numel() == 0:
        return None
    flat = base.detach().reshape(-1)
    words = flat.view(_INT_OF_SIZE[flat.element_size()])
    if bool(words[0] != words[-1]) or not bool(torch.all(words == words[0])):
        return None
    return _le_bytes(flat[:1])


def _runs(base: torch.Tensor) -> list[tuple[int, int, bytes | None]] | None:
    """``base`` as consecutive runs ``(start, count, element)``: ``element`` the bytes of
    the one element a fill run repeats, ``None`` for a stretch stored as bytes. ``None``
    when no fill run of ``MIN_FILL_BLOCKS`` whole blocks exists (nothing to gain).

    Blocks of ``RUN_BLOCK`` elements are compared with their first element, a chunk of
    blocks at a time, so the scratch stays small on a base of billions of elements."""
    flat = base.detach().reshape(-1)
    n = flat.numel()
    nb = n // RUN_BLOCK
    if nb < MIN_FILL_BLOCKS:
        return None
    words = flat.view(_INT_OF_SIZE[flat.element_size()])
    const = torch.empty(nb, dtype=torch.bool)
    first = words[: nb * RUN_BLOCK: RUN_BLOCK].cpu()
    for i in range(0, nb, _RUN_CHUNK):
        j = min(nb, i + _RUN_CHUNK)
        blocks = words[i * RUN_BLOCK: j * RUN_BLOCK].view(j - i, RUN_BLOCK)
        const[i:j] = (blocks == blocks[:, :1]).all(1).cpu()
    change = torch.ones(nb, dtype=torch.bool)
    change[1:] = (const[1:] != const[:-1]) | (const[1:] & (first[1:] != first[:-1]))
    starts = [*change.nonzero().squeeze(1).tolist(), nb]
    runs: list[tuple[int, int, bytes | None]] = []
    for a, b in itertools.pairwise(starts):
        fill = bool(const[a]) and b - a >= MIN_FILL_BLOCKS
        element = _le_bytes(flat[a * RUN_BLOCK: a * RUN_BLOCK + 1]) if fill else None
        start, count = a * RUN_BLOCK, (b - a) * RUN_BLOCK
        if element is None and runs and runs[-1][2] is None:  # stretches of bytes merge
            runs[-1] = (runs[-1][0], runs[-1][1] + count, None)
        else:
            runs.append((start, count, element))
    if n > nb * RUN_BLOCK:
        if runs[-1][2] is None:
            runs[-1] = (runs[-1][0], n - runs[-1][0], None)
        else:
            runs.append((nb * RUN_BLOCK, n - nb * RUN_BLOCK, None))
    if all(e is None for _, _, e in runs):
        return None
    return runs


def _encode_runs(flat: torch.Tensor, runs: list[tuple[int, int, bytes | None]]
                 ) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for start, count, element in runs:
        if element is not None:
            items.append({"count": count, "fill": element.hex()})
        else:
            raw = _le_bytes(flat[start:start + count])
            deflated = zlib.compress(raw, ZLIB_LEVEL)
            items.append({"count": count, "base_bytes": base64.b64encode(deflated).decode("ascii")})
    return {"encoding": "runs", "runs": items}


def _word_hex(word: int, itemsize: int) -> str:
    return _le_bytes(torch.tensor([word], dtype=_INT_OF_SIZE[itemsize])).hex()


def _b64_zlib_of(t: torch.Tensor) -> str:
    return base64.b64encode(zlib.compress(_le_bytes(t), ZLIB_LEVEL)).decode("ascii")


def _recipe_head(arg: TensorArg, hint: Hint) -> dict[str, Any] | None:
    """The ``recipe`` entry of ``arg``'s base without its patch; None when the hint's
    recipe cannot make this base (a dtype it does not make)."""
    try:
        hint.recipe.check(arg.dtype, arg.base.numel(), "recipe")
    except ValueError:
        return None
    entry: dict[str, Any] = {"encoding": "recipe", "recipe": hint.recipe.to_json()}
    if hint.outside is not None:
        entry["outside"] = _word_hex(hint.outside, arg.base.element_size())
    return entry


def _patch_ranges(pos: torch.Tensor) -> torch.Tensor:
    """Sorted distinct positions as ``(gap, length)`` pairs (int64, flattened): each range
    of consecutive positions, its gap counted from the end of the one before (from 0 for
    the first)."""
    breaks = (pos[1:] - pos[:-1] != 1).nonzero().squeeze(1)
    starts = torch.cat([pos[:1], pos[breaks + 1]])
    ends = torch.cat([pos[breaks] + 1, pos[-1:] + 1])
    gaps = starts.clone()
    gaps[1:] -= ends[:-1]
    return torch.stack([gaps, ends - starts], 1).reshape(-1)


def _recipe_entry(arg: TensorArg, hint: Hint) -> dict[str, Any] | None:
    """``arg``'s base as its recipe plus the elements that differ from it (``patch``), bit
    for bit; None when the recipe does not make this base's dtype or more than
    ``MAX_ELEMENTS`` elements differ."""
    entry = _recipe_head(arg, hint)
    if entry is None:
        return None
    pos = differing(arg, hint)
    if pos.numel() > MAX_ELEMENTS:
        return None
    if pos.numel():
        flat = arg.base.detach().reshape(-1)
        pairs = _patch_ranges(pos)
        entry["patch"] = {"ranges": pairs.numel() // 2, "count": pos.numel(),
                          "index": _b64_zlib_of(pairs),
                          "values": _b64_zlib_of(flat[pos.to(flat.device)])}
    return entry


def _recipe_size(arg: TensorArg, hint: Hint) -> int | None:
    """About the characters of ``arg``'s ``recipe`` entry (see :func:`encoded_base_size`),
    from the ranges its hint keeps; None where :func:`_recipe_entry` gives None."""
    entry = _recipe_head(arg, hint)
    kept = known_kept(arg) if entry is not None else None
    if entry is None or kept is None or kept_count(kept) > MAX_ELEMENTS:
        return None
    size = 40 + len(json.dumps(entry))
    if kept:
        flat = arg.base.detach().reshape(-1)
        n = kept_count(kept)
        # the values as zlib compresses them; the index: 16 bytes a range, runs of ones
        values = flat[kept[0][0]:kept[0][1]] if len(kept) == 1 else \
            torch.cat([flat[lo:hi] for lo, hi in kept])
        size += 90 + _packed_size(values, False) + 12 * len(kept) + n // 96
    return size


def _encode_base(base: torch.Tensor, arg: TensorArg | None = None) -> dict[str, Any]:
    """The schema-2 ``encoding`` and payload fields of a base buffer (``arg``: the view
    taken of it, which a ``recipe`` encoding needs; :data:`HINTS` names the recipe)."""
    if base.device.type == "meta":
        return {"encoding": None, "base_bytes": None}
    element = _fill_element(base)
    if element is not None:
        return {"encoding": "fill", "fill": element.hex()}
    hint = hint_of(base)
    if hint is not None and arg is not None:
        entry = _recipe_entry(arg, hint)
        if entry is not None:
            return entry
    runs = _runs(base)
    if runs is not None:
        return _encode_runs(base.detach().reshape(-1), runs)
    raw = _le_bytes(base)
    deflated = zlib.compress(raw, ZLIB_LEVEL)
    if len(deflated) < len(raw):
        return {"encoding": "zlib+base64", "base_bytes": base64.b64encode(deflated).decode("ascii")}
    return {"encoding": "base64", "base_bytes": base64.b64encode(raw).decode("ascii")}


def _b64_len(n: int) -> int:
    return 4 * ((n + 2) // 3)


def encoded_base_size(base: torch.Tensor, arg: TensorArg | None = None) -> int:
    """Characters of the payload (``base_bytes`` or ``fill``) that saving ``base`` writes.

    Exact for fills and for bases up to ``EXACT_ESTIMATE_BYTES``; a larger base is
    estimated from ``_SAMPLES`` evenly spaced ``_SAMPLE_BYTES`` chunks compressed alone.
    A base made from a recipe (``arg``: its view; :data:`~kda_fuzz.engine.recipe.HINTS`)
    costs the recipe and its patch, estimated from the ranges its hint keeps.
    """
    if base.device.type == "meta" or base.numel() == 0:
        return 0
    if _fill_element(base) is not None:
        return 2 * base.element_size()
    hint = hint_of(base)
    if hint is not None and arg is not None:
        size = _recipe_size(arg, hint)
        if size is not None:
            return size
    flat = base.detach().reshape(-1)
    runs = _runs(base)
    if runs is not None:  # fills cost their hex and a few characters; stretches as below
        size = 0
        for start, count, element in runs:
            size += 40 if element is None else 30 + 2 * flat.element_size()
            if element is None:
                size += _packed_size(flat[start:start + count], False)
        return size
    return _packed_size(flat, True)


def _packed_size(flat: torch.Tensor, raw_ok: bool) -> int:
    """Base64 characters of ``flat`` zlib-compressed (or raw, when ``raw_ok`` and that is
    shorter): exact up to ``EXACT_ESTIMATE_BYTES``, sampled above."""
    nbytes = flat.numel() * flat.element_size()
    limit = nbytes if raw_ok else 2 * nbytes + 64
    if nbytes <= EXACT_ESTIMATE_BYTES:
        raw = _le_bytes(flat)
        return _b64_len(min(len(zlib.compress(raw, ZLIB_LEVEL)), limit))
    per = max(1, _SAMPLE_BYTES // flat.element_size())
    starts = [round(i * (flat.numel() - per) / (_SAMPLES - 1)) for i in range(_SAMPLES)]
    sampled = deflated = 0
    for start in starts:
        raw = _le_bytes(flat[start:start + per])
        sampled += len(raw)
        deflated += len(zlib.compress(raw, ZLIB_LEVEL))
    return _b64_len(min(limit, math.ceil(nbytes * deflated / sampled)))


def _tensor_header(arg: TensorArg) -> dict[str, Any]:
    dtype = DTYPE_NAMES.get(arg.dtype)
    if dtype is None:
        raise ValueError(f"dtype {arg.dtype} cannot be stored in a corpus file")
    return {
        "dtype": dtype,
        "device": "meta" if arg.device.type == "meta" else "cpu",
        "shape": list(arg.shape),
        "stride": list(arg.stride),
        "storage_offset": arg.offset,
        "base_numel": arg.base.numel(),
    }


def _encode_tensor(arg: TensorArg) -> dict[str, Any]:
    return {**_tensor_header(arg), **_encode_base(arg.base, arg)}


def encoded_tensor_size(arg: TensorArg) -> int:
    """:func:`encoded_base_size` of ``arg``'s base, seen through its view."""
    return encoded_base_size(arg.base, arg)


def _on_cpu(case: Case) -> Case:
    """``case`` with every base on cpu or meta (the recipes its bases were made from kept)."""
    if all(t.device.type in DEVICES for t in case.tensors.values()):
        return case
    moved = case.on("cpu")
    carry_hints(case.tensors, moved.tensors)
    return moved


def _family(case: Case, contract: Contract | None) -> Contract:
    """The case's contract: the caller's, else the family the case names."""
    return contract if contract is not None else get_contract(case.contract)


def _check_scalars(case: Case, contract: Contract | None = None) -> None:
    kinds = _family(case, contract).scalars
    for name in (n for n, k in kinds.items() if k.startswith("float")):
        v = case.scalars.get(name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"cannot save a case whose {name} is {v!r} (must be finite)")


def _encode_case(case: Case, tensor: Callable[[TensorArg], dict[str, Any]] = _encode_tensor,
                 contract: Contract | None = None) -> dict[str, Any]:
    _check_scalars(case, contract)
    return {
        "intent": list(case.intent),
        "notes": _jsonable(dict(sorted(case.notes.items()))),
        "scalars": {k: _jsonable(v) for k, v in sorted(case.scalars.items())},
        "tensors": {n: tensor(t) for n, t in sorted(case.tensors.items())},
    }


def _canonical(contract: dict[str, Any], case: dict[str, Any]) -> str:
    """What names a file: the call's arguments and whether it is a semantic breakage.

    ``case["tensors"]`` in schema-1 form. Intent and the other notes are information
    (generator layouts, minimization steps) and do not count, so the same call found
    twice is one file.
    """
    content = {
        "contract": contract,
        "scalars": case["scalars"],
        "tensors": case["tensors"],
        "semantic": bool(case["notes"].get("semantic", False)),
    }
    return json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)


def case_digest(case: Case) -> str:
    """The 16 hex digits that name a case's file (see :func:`_canonical`).

    The hash runs over the schema-1 form of the tensors (plain base64 of each base), fed
    in pieces, so it does not depend on how a file encodes them (recipes included) and
    matches the names schema-1 files were given. A base past ``MAX_ELEMENTS`` (which
    schema 1 could not hold) counts as its fill or runs when it has them, as earlier
    files were named, else as plain base64 too.
    """
    case = _on_cpu(case)
    token = uuid.uuid4().hex
    payloads: dict[str, torch.Tensor] = {}

    def schema_1(arg: TensorArg) -> dict[str, Any]:
        head = _tensor_header(arg)
        if arg.device.type == "meta":
            return {**head, "base_bytes": None}
        if arg.base.numel() > MAX_ELEMENTS:  # past what schema 1 could hold
            element = _fill_element(arg.base)
            if element is not None:
                return {**head, "encoding": "fill", "fill": element.hex()}
            runs = _runs(arg.base)
            if runs is not None:
                return {**head, **_encode_runs(arg.base.detach().reshape(-1), runs)}
        key = f"{token}{len(payloads)}"
        payloads[key] = arg.base
        return {**head, "base_bytes": key}

    body = _encode_case(case, schema_1)
    text = _canonical({"family": case.contract, "variant": case.variant}, body)
    h = hashlib.sha256()
    pos = 0
    for key, base in sorted(payloads.items(), key=lambda kv: text.index(f'"{kv[0]}"')):
        at = text.index(f'"{key}"', pos) + 1
        h.update(text[pos:at].encode())
        flat = base.detach().reshape(-1)
        step = 3 << 18  # elements: a multiple of 3 bytes, so the chunks' base64 concatenates
        for i in range(0, flat.numel(), step):
            h.update(base64.b64encode(_le_bytes(flat[i:i + step])))
        pos = at + len(key)
    h.update(text[pos:].encode())
    return h.hexdigest()[:16]


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    def dist(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        **{name: dist(name) for name in RUNTIMES},
        "kda_fuzz": __version__,
    }


def _kind_of(case: Case, verdict: Verdict | None, contract: Contract | None = None) -> str:
    if verdict is not None:
        return verdict.kind
    return "mismatch" if expectation(_family(case, contract), case).ok else "contract"


_SCALAR_LIST = re.compile(r"\[\n\s*([^\[\]{}\"]*?)\n\s*\]")


def _dumps(doc: dict[str, Any]) -> str:
    """Indented JSON with lists of numbers kept on one line."""
    text = json.dumps(doc, indent=1, allow_nan=False)
    return _SCALAR_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(","))
                            + "]", text) + "\n"


def _document(case: Case, verdict: Verdict | None, origin: Mapping[str, Any] | None,
              description: str, tensor: Callable[[TensorArg], dict[str, Any]],
              contract: Contract | None = None) -> dict[str, Any]:
    contract = _family(case, contract)
    kind = _kind_of(case, verdict, contract)
    desc = " ".join(description.split()) or (verdict.summary() if verdict else kind)
    exp = expectation(contract, case)
    return {
        "schema": SCHEMA,
        "kind": kind,
        "description": desc[:300],
        "contract": {"family": case.contract, "variant": case.variant},
        "expected": {"ok": exp.ok, "check": exp.check, "message": exp.message,
                     "hole": exp.hole},
        "verdict": _jsonable(verdict.to_json()) if verdict is not None else None,
        "origin": _jsonable(dict(origin or {})),
        "versions": _versions(),
        "case": _encode_case(case, tensor, contract),
    }


def _payload_of(entry: dict[str, Any]) -> str:
    return entry.get("base_bytes") or entry.get("fill") or ""


def _payload_len(entry: dict[str, Any]) -> int:
    """Characters of a tensor entry's payloads (of each run's, for ``runs``; of the patch,
    for ``recipe``)."""
    if entry.get("encoding") == "runs":
        return sum(len(_payload_of(r)) for r in entry.get("runs", ()))
    if entry.get("encoding") == "recipe":
        patch = entry.get("patch") or {}
        return len(patch.get("index", "")) + len(patch.get("values", ""))
    return len(_payload_of(entry))


def _hollow(entry: dict[str, Any]) -> dict[str, Any]:
    """A tensor entry with its payloads emptied (what :func:`_file_size` writes out)."""
    out = {**entry, **{k: "" for k in ("base_bytes", "fill") if entry.get(k)}}
    if entry.get("encoding") == "runs":
        out["runs"] = [{**r, **{k: "" for k in ("base_bytes", "fill") if r.get(k)}}
                       for r in entry.get("runs", ())]
    if entry.get("encoding") == "recipe" and entry.get("patch"):
        out["patch"] = {**entry["patch"], "index": "", "values": ""}
    return out


def _file_size(doc: dict[str, Any]) -> int:
    """Bytes of ``_dumps(doc)``, counted without writing out the tensors' payloads.

    Payloads are ASCII (base64, hex) and JSON-escape nothing, so they add their length.
    """
    tensors = doc["case"]["tensors"]
    hollow = {n: _hollow(e) for n, e in tensors.items()}
    skeleton = {**doc, "case": {**doc["case"], "tensors": hollow}}
    return len(_dumps(skeleton).encode()) + sum(_payload_len(e) for e in tensors.values())


def encoded_size(case: Case, contract: Contract | None = None) -> int:
    """About the bytes :func:`save_case` writes for ``case`` (no verdict or description):
    exact when every base is a fill or at most ``EXACT_ESTIMATE_BYTES``, sampled above.
    """
    case = _on_cpu(case)

    def estimate(arg: TensorArg) -> dict[str, Any]:
        head = _tensor_header(arg)
        if arg.device.type == "meta":
            return {**head, "encoding": None, "base_bytes": None}
        return {**head, "encoding": "zlib+base64", "base_bytes": "",
                "size": encoded_base_size(arg.base, arg)}

    doc = _document(case, None, None, "", estimate, contract)
    tensors = doc["case"]["tensors"]
    sizes = {n: e.pop("size", 0) for n, e in tensors.items()}
    return _file_size(doc) + sum(sizes.values())


def encode_entry(case: Case, verdict: Verdict | None, *,
                 origin: Mapping[str, Any] | None = None, description: str = "",
                 limit: int | None = None, contract: Contract | None = None
                 ) -> tuple[str, str]:
    """The file name and JSON text of a corpus entry (see :func:`save_case`; ``contract``:
    the case's, else the family it names is looked up).

    Raises :class:`CaseTooLarge` when the text would exceed ``limit`` bytes (default
    ``MAX_SAVED_BYTES``).
    """
    limit = MAX_SAVED_BYTES if limit is None else limit
    case = _on_cpu(case)
    doc = _document(case, verdict, origin, description, _encode_tensor, contract)
    size = _file_size(doc)
    if size > limit:
        raise CaseTooLarge(size, case.describe(), limit)
    return f"{doc['kind']}-{case_digest(case)}.json", _dumps(doc)


def save_case(case: Case, verdict: Verdict | None, directory: str | os.PathLike[str], *,
              origin: Mapping[str, Any] | None = None, description: str = "",
              limit: int | None = None, contract: Contract | None = None) -> Path:
    """Write ``case`` (and the failure it shows) into ``directory``; return the file's path.

    ``verdict`` ``None`` (a hand-made regression) files the case by what the contract
    expects: ``contract`` when it must be rejected, else ``mismatch``. The same case saved
    twice, by any number of processes at once, ends up as one complete file. A case
    whose file would exceed ``limit`` (default ``MAX_SAVED_BYTES``, 16 MiB) raises
    :class:`CaseTooLarge` and writes nothing.
    """
    name, text = encode_entry(case, verdict, origin=origin, description=description,
                              limit=limit, contract=contract)
    return write_atomic(Path(directory) / name, text)


SEEN_AGAIN = "seen again:"  # how a failure's note starts when the corpus already holds it
_HEADERS: dict[Path, tuple[tuple[int, int], tuple[Any, ...] | None]] = {}


def _file_signature(path: Path) -> tuple[Any, ...] | None:
    """``(family, recorded target, *Verdict.signature(variant))`` of a corpus file, from
    its JSON header alone (no tensor is decoded); ``None`` for a file without a verdict
    or one that cannot be read. Cached per file while its size and mtime stay."""
    try:
        st = path.stat()
    except OSError:
        return None
    stamp = (st.st_size, st.st_mtime_ns)
    hit = _HEADERS.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    sig: tuple[Any, ...] | None = None
    try:
        doc = _header(path, st.st_size)
        raw, contract = doc.get("verdict"), doc.get("contract") or {}
        target = (doc.get("origin") or {}).get("target")
        if isinstance(raw, dict) and isinstance(target, str):
            verdict = _decoded_verdict(contract.get("family"), Verdict.from_json(_unjson(raw)))
            sig = (contract.get("family"), target,
                   *verdict.signature(str(contract.get("variant"))))
    except (OSError, ValueError, TypeError, AttributeError):
        sig = None
    _HEADERS[path] = (stamp, sig)
    return sig


def _decoded_verdict(family: Any, verdict: Verdict) -> Verdict:
    """``verdict`` of a file of ``family`` in today's terms (as the family upgrades
    older files' verdicts); as written where the family is unknown here."""
    try:
        contract = get_contract(str(family))
    except ValueError:
        return verdict
    return contract.decoded_verdict(verdict)


_HEADER_BYTES = 1 << 20  # the header of a file as written lies in its first MiB
_CASE_KEY = '\n "case": '


def _header(path: Path, size: int) -> dict[str, Any]:
    """A corpus file's top-level fields before ``case`` (as :func:`_dumps` writes them),
    without reading its tensors; a file laid out otherwise is read whole (up to 64 MiB)."""
    with open(path, "rb") as f:
        head = f.read(_HEADER_BYTES).decode("utf-8", errors="replace")
    at = head.find(_CASE_KEY)
    if at >= 0:
        doc = json.loads(head[:at] + _CASE_KEY + "null\n}")
    elif size <= 64 << 20:
        doc = json.loads(path.read_text(encoding="utf-8"))
    else:
        return {}
    return doc if isinstance(doc, dict) else {}


def known_failure(failure: Any, directory: str | os.PathLike[str]) -> Path | None:
    """The file in ``directory`` (walked as :func:`corpus_files` does) that already holds
    ``failure``'s bug: same contract family, recorded target and
    :meth:`Verdict.signature` (what the target did) under the same variant."""
    folder = Path(directory)
    if failure.verdict is None or not folder.is_dir():
        return None
    want = (failure.case.contract, failure.target,
            *failure.verdict.signature(failure.case.variant))
    for path in corpus_files([folder]):
        if _file_signature(path) == want:
            return path
    return None


def save_failure(failure: Any, directory: str | os.PathLike[str], *, contract: Contract,
                 seed: int | None, unminimized: str = "", dedupe: bool = True) -> Path:
    """Save a campaign's ``results.Failure`` (its minimized case) with its origin.
    ``unminimized``: why the case is saved as found (recorded in the origin and the
    description).

    A finding is never dropped for its size: a file over ``MAX_SAVED_BYTES`` is written
    all the same (up to ``HARD_SAVED_BYTES``, else :class:`CaseTooLarge`), the smallest
    case that reproduced it, and ``failure.note`` says so.

    With ``dedupe``, a bug the corpus folder already holds (:func:`known_failure`) is not
    saved again: the existing file's path is returned and ``failure.note`` says it was
    seen again (it starts with :data:`SEEN_AGAIN`)."""
    case, verdict = failure.case, failure.verdict
    if case.contract != contract.name:
        raise ValueError(f"failure is for contract {case.contract!r}, not {contract.name!r}")
    if dedupe:
        known = known_failure(failure, directory)
        if known is not None:
            failure.note = f"{SEEN_AGAIN} the corpus already holds this bug ({known}); not saved"
            return known
    date = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
    sizes = contract.sizes(case) if contract.sizes is not None else {}
    layout = ", ".join(f"{k}={v}" for k, v in sizes.items())
    description = ("[not minimized] " if unminimized else "") + (
        f"{verdict.kind}/{verdict.what} on {failure.target}") + (
        f" ({layout})" if layout else "")
    origin = {"target": failure.target, "seed": seed, "date": date, "tool": "kda-fuzz fuzz",
              **({"unminimized": unminimized} if unminimized else {})}
    try:
        return save_case(case, verdict, directory, description=description, origin=origin,
                         contract=contract)
    except CaseTooLarge as e:  # never dropped for its size: the smallest that reproduced
        path = save_case(case, verdict, directory, origin=origin, limit=HARD_SAVED_BYTES,
                         contract=contract,
                         description=f"{description}; over the size cap: no smaller case "
                         "reproduced it")
        failure.note = (f"saved at {e.size / 2**20:.1f} MiB, over the "
                        f"{MAX_SAVED_BYTES / 2**20:g} MiB cap: no smaller case reproduced it")
        return path


# ------------------------------------------------------------------ decoding


def _field(obj: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} must be an object")
    if key not in obj:
        raise ValueError(f"missing field {where}.{key}")
    value = obj[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        raise ValueError(f"field {where}.{key} has the wrong type ({type(value).__name__})")
    return value


def _int_list(obj: dict, key: str, where: str) -> tuple[int, ...]:
    value = _field(obj, key, list, where)
    if len(value) > MAX_NDIM:
        raise ValueError(f"{where}.{key} has {len(value)} dims (at most {MAX_NDIM})")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}.{key} must be a list of integers")
    return tuple(value)


def _inflate(deflated: bytes, expected: int, where: str) -> bytes:
    """The zlib stream ``deflated``, which must inflate to exactly ``expected`` bytes; never
    more than ``expected`` are produced, whatever the stream holds."""
    d = zlib.decompressobj()
    try:
        data = d.decompress(deflated, expected)
        tail = d.unconsumed_tail
        while not d.eof and tail:  # the end of the stream may follow the last byte
            if d.decompress(tail, 1):
                raise ValueError(f"{where}: the zlib stream inflates to more than the "
                                 f"{expected} bytes base_numel needs")
            tail = d.unconsumed_tail
    except zlib.error as e:
        raise ValueError(f"{where}: invalid zlib stream ({e})") from None
    if not d.eof:
        raise ValueError(f"{where}: truncated zlib stream (inflates to {len(data)} bytes "
                         f"or more; {expected} bytes needed)")
    if d.unused_data:
        raise ValueError(f"{where}: {len(d.unused_data)} bytes after the end of the zlib "
                         "stream")
    return data


def _decode_payload(obj: dict, where: str, schema: int, dtype_name: str, numel: int,
                    itemsize: int) -> bytes | tuple[bytes, int]:
    """The base's little-endian bytes, or (one element's bytes, count) for a fill."""
    encoding = "base64" if schema == 1 else _field(obj, "encoding", str, where)
    if encoding not in ENCODINGS:
        raise ValueError(f"{where}: unknown encoding {encoding!r} (known: "
                         f"{', '.join(ENCODINGS)})")
    if encoding == "fill":
        if obj.get("base_bytes") is not None:
            raise ValueError(f"{where}: a fill carries no base_bytes")
        text = _field(obj, "fill", str, where)
        if len(text) != 2 * itemsize or not re.fullmatch(r"[0-9a-f]*", text):
            raise ValueError(f"{where}.fill must be {2 * itemsize} lowercase hex digits "
                             f"(one {dtype_name} element)")
        return bytes.fromhex(text), numel
    if "fill" in obj:
        raise ValueError(f"{where}: only the fill encoding has a fill field")
    text = _field(obj, "base_bytes", str, where)
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(f"{where}.base_bytes is not valid base64 ({e})") from None
    if encoding == "zlib+base64":
        return _inflate(data, numel * itemsize, f"{where}.base_bytes")
    return data


def _fill_word(text: str, where: str, dtype: torch.dtype, dtype_name: str,
               itemsize: int) -> int:
    """The integer word of one element given as ``2 * itemsize`` lowercase hex digits."""
    if len(text) != 2 * itemsize or not re.fullmatch(r"[0-9a-f]*", text):
        raise ValueError(f"{where}.fill must be {2 * itemsize} lowercase hex digits "
                         f"(one {dtype_name} element)")
    element = bytes.fromhex(text)
    if dtype == torch.bool and element[0] > 1:
        raise ValueError(f"{where}: bool bytes must be 0 or 1")
    return int(_from_le_bytes(element, dtype, 1).view(_INT_OF_SIZE[itemsize]).item())


def _decode_runs(obj: dict, where: str, dtype: torch.dtype, dtype_name: str, numel: int,
                 itemsize: int) -> torch.Tensor:
    """A base stored as runs: each ``{"count": n, "fill": hex}`` or ``{"count": n,
    "base_bytes": zlib+base64}``, in order, their counts adding up to ``base_numel``.
    Every run is checked before the base is allocated."""
    if obj.get("base_bytes") is not None or "fill" in obj:
        raise ValueError(f"{where}: runs carry their payloads in runs[]")
    runs = _field(obj, "runs", list, where)
    total = 0
    parsed: list[tuple[int, int | bytes]] = []
    for i, run in enumerate(runs):
        at = f"{where}.runs[{i}]"
        count = _field(run, "count", int, at)
        if count <= 0:
            raise ValueError(f"{at}.count must be positive")
        if ("fill" in run) == ("base_bytes" in run):
            raise ValueError(f"{at} must hold exactly one of fill and base_bytes")
        if "fill" in run:
            parsed.append((count, _fill_word(_field(run, "fill", str, at), at, dtype,
                                             dtype_name, itemsize)))
        else:
            text = _field(run, "base_bytes", str, at)
            try:
                deflated = base64.b64decode(text.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError) as e:
                raise ValueError(f"{at}.base_bytes is not valid base64 ({e})") from None
            parsed.append((count, deflated))
        total += count
        if total > numel:
            break
    if total != numel:
        raise ValueError(f"{where}: the runs hold {total} elements; base_numel is {numel}")
    itype = _INT_OF_SIZE[itemsize]
    try:
        words = torch.empty(numel, dtype=itype)
    except RuntimeError as e:  # more than this machine holds
        raise ValueError(f"{where}: cannot hold a base of {numel} elements here ({e})") from None
    pos = 0
    for i, (count, payload) in enumerate(parsed):
        if isinstance(payload, int):
            words[pos:pos + count] = payload
        else:
            data = _inflate(payload, count * itemsize, f"{where}.runs[{i}].base_bytes")
            if len(data) != count * itemsize:
                raise ValueError(f"{where}.runs[{i}].base_bytes holds {len(data)} bytes; "
                                 f"count {count} of {dtype_name} needs {count * itemsize}")
            if dtype == torch.bool and any(byte > 1 for byte in data):
                raise ValueError(f"{where}: bool bytes must be 0 or 1")
            words[pos:pos + count] = _from_le_bytes(data, dtype, count).view(itype)
        pos += count
    return words.view(dtype)


def _b64_zlib(obj: dict, key: str, expected: int, where: str) -> bytes:
    """The field ``key`` of ``obj``: base64 of a zlib stream inflating to ``expected`` bytes."""
    text = _field(obj, key, str, where)
    try:
        deflated = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(f"{where}.{key} is not valid base64 ({e})") from None
    data = _inflate(deflated, expected, f"{where}.{key}")
    if len(data) != expected:
        raise ValueError(f"{where}.{key} holds {len(data)} bytes; {expected} needed")
    return data


def _decode_recipe(obj: dict, where: str, dtype: torch.dtype, dtype_name: str, numel: int,
                   itemsize: int, shape: tuple[int, ...], stride: tuple[int, ...],
                   offset: int) -> torch.Tensor:
    """A base stored as a recipe: its values regenerated (``recipe``; only inside the view
    when ``outside`` gives the other cells' element), then the ``patch`` elements set.
    Everything is checked before the base is allocated."""
    if obj.get("base_bytes") is not None or "fill" in obj or "runs" in obj:
        raise ValueError(f"{where}: a recipe carries no base_bytes, fill or runs")
    extra = set(obj) - {"dtype", "device", "shape", "stride", "storage_offset", "base_numel",
                        "encoding", "recipe", "outside", "patch"}
    if extra:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    recipe = Recipe.from_json(_field(obj, "recipe", dict, where), f"{where}.recipe")
    recipe.check(dtype, numel, f"{where}.recipe")
    outside = None
    if obj.get("outside") is not None:
        text = _field(obj, "outside", str, where)
        if len(text) != 2 * itemsize or not re.fullmatch(r"[0-9a-f]*", text):
            raise ValueError(f"{where}.outside must be {2 * itemsize} lowercase hex digits "
                             f"(one {dtype_name} element)")
        outside = _fill_word(text, f"{where}.outside", dtype, dtype_name, itemsize)
    itype = _INT_OF_SIZE[itemsize]
    pos = words = None
    kept: tuple[tuple[int, int], ...] | None = ()
    patch = obj.get("patch")
    if patch is not None:
        at = f"{where}.patch"
        if not isinstance(patch, dict):
            raise ValueError(f"{at} must be an object")
        unknown = sorted(set(patch) - {"ranges", "count", "index", "values"})
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {', '.join(unknown)}")
        count = _field(patch, "count", int, at)
        if not 0 < count <= min(numel, MAX_ELEMENTS):
            raise ValueError(f"{at}.count must lie in 1..{min(numel, MAX_ELEMENTS)}")
        nranges = _field(patch, "ranges", int, at)
        if not 0 < nranges <= count:
            raise ValueError(f"{at}.ranges must lie in 1..count ({count})")
        pairs = _from_le_bytes(_b64_zlib(patch, "index", 16 * nranges, at), torch.int64,
                               2 * nranges).view(nranges, 2)
        gaps, lengths = pairs[:, 0], pairs[:, 1]
        if int(gaps[0]) < 0 or (nranges > 1 and int(gaps[1:].min()) < 1) \
                or int(lengths.min()) < 1 or int(gaps.max()) > numel \
                or int(lengths.max()) > numel:
            raise ValueError(f"{at}.index must hold (gap, length) pairs of ranges in "
                             "increasing order, apart, each at least one element long")
        if int(lengths.sum()) != count:
            raise ValueError(f"{at}.index ranges hold {int(lengths.sum())} elements; "
                             f"count says {count}")
        ends = torch.cumsum(gaps + lengths, 0)
        if int(ends[-1]) > numel:
            raise ValueError(f"{at}.index reaches element {int(ends[-1])} of a "
                             f"{numel}-element base")
        starts = ends - lengths
        within = torch.arange(count) - torch.repeat_interleave(
            torch.cumsum(lengths, 0) - lengths, lengths)
        pos = torch.repeat_interleave(starts, lengths) + within
        kept = tuple(zip(starts.tolist(), ends.tolist())) if nranges <= MAX_RANGES \
            else ((int(starts[0]), int(ends[-1])),)
        data = _b64_zlib(patch, "values", count * itemsize, at)
        if dtype == torch.bool and any(byte > 1 for byte in data):
            raise ValueError(f"{at}.values: bool bytes must be 0 or 1")
        words = _from_le_bytes(data, dtype, count).view(itype)
    try:
        base = realize(recipe, numel, dtype, shape, stride, offset, outside)
    except RuntimeError as e:  # more than this machine holds
        raise ValueError(f"{where}: cannot hold a base of {numel} elements here ({e})") from None
    if pos is not None and words is not None:
        base.view(itype)[pos] = words
    HINTS.add(base, Hint(recipe, outside, kept))
    return base


def _decode_tensor(name: str, obj: Any, schema: int = SCHEMA) -> TensorArg:
    where = f"case.tensors.{name}"
    dtype_name = _field(obj, "dtype", str, where)
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise ValueError(f"{where}: unknown dtype {dtype_name!r} (known: {', '.join(DTYPES)})")
    device = _field(obj, "device", str, where)
    if device not in DEVICES:
        raise ValueError(f"{where}: unknown device {device!r} (cpu or meta)")
    shape = _int_list(obj, "shape", where)
    stride = _int_list(obj, "stride", where)
    offset = _field(obj, "storage_offset", int, where)
    numel = _field(obj, "base_numel", int, where)
    if len(shape) != len(stride):
        raise ValueError(f"{where}: shape {list(shape)} and stride {list(stride)} differ in rank")
    if any(n < 0 for n in shape) or any(s < 0 for s in stride) or offset < 0 or numel < 0:
        raise ValueError(f"{where}: negative size, stride, offset or base_numel")
    view_numel = math.prod(shape)
    cap = MAX_RUN_ELEMENTS if obj.get("encoding") in ("runs", "fill", "recipe") \
        or device == "meta" \
        else MAX_ELEMENTS
    # past MAX_ELEMENTS, a view may not hold more elements than its base (no zero strides)
    if numel > cap or view_numel > min(cap, max(MAX_ELEMENTS, numel)):
        raise ValueError(f"{where}: absurd size (base {numel}, view {view_numel} elements; "
                         f"at most {cap})")
    reach = 0 if view_numel == 0 else offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    if reach > numel or offset > numel:
        raise ValueError(f"{where}: view (shape {list(shape)}, stride {list(stride)}, offset "
                         f"{offset}) reaches element {max(reach, offset)} of a "
                         f"{numel}-element base")
    if device == "meta":
        if obj.get("base_bytes") is not None or obj.get("fill") is not None \
                or obj.get("encoding") is not None:
            raise ValueError(f"{where}: a meta tensor carries no bytes (encoding, base_bytes "
                             "and fill must be null or absent)")
        return TensorArg(torch.empty(numel, dtype=dtype, device="meta"), shape, stride, offset)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if schema != 1 and obj.get("encoding") == "runs":
        return TensorArg(_decode_runs(obj, where, dtype, dtype_name, numel, itemsize), shape,
                         stride, offset)
    if schema != 1 and obj.get("encoding") == "recipe":
        return TensorArg(_decode_recipe(obj, where, dtype, dtype_name, numel, itemsize, shape,
                                        stride, offset), shape, stride, offset)
    data = _decode_payload(obj, where, schema, dtype_name, numel, itemsize)
    if isinstance(data, tuple):
        element, count = data
        if dtype == torch.bool and element[0] > 1:
            raise ValueError(f"{where}: bool bytes must be 0 or 1")
        word = _from_le_bytes(element, dtype, 1).view(_INT_OF_SIZE[itemsize])
        try:
            base = torch.full((count,), int(word.item()), dtype=word.dtype).view(dtype)
        except RuntimeError as e:  # more than this machine holds
            raise ValueError(f"{where}: cannot hold a base of {count} elements here "
                             f"({e})") from None
        return TensorArg(base, shape, stride, offset)
    if len(data) != numel * itemsize:
        raise ValueError(f"{where}: base_bytes holds {len(data)} bytes; base_numel {numel} of "
                         f"{dtype_name} needs {numel * itemsize}")
    if dtype == torch.bool and any(byte > 1 for byte in data):
        raise ValueError(f"{where}: bool bytes must be 0 or 1")
    return TensorArg(_from_le_bytes(data, dtype, numel), shape, stride, offset)


def _decode_scalar(family: str, name: str, value: Any) -> Any:
    """A scalar of a corpus file, checked against its kind in the contract's ``scalars``:
    "float" (finite), "float?" (null or finite), "bool"."""
    kind = get_contract(family).scalars.get(name)
    value = _unjson(value)
    if kind is None:
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"scalar {name} must be true or false")
        return value
    if value is None and kind == "float?":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"scalar {name} must be a number")
    if not math.isfinite(value):
        raise ValueError(f"scalar {name} is {value!r}; it must be finite")
    return float(value)


def _decode(path: Path, doc: Any) -> tuple[Case, Verdict | None, dict[str, Any]]:
    if not isinstance(doc, dict):
        raise ValueError("the file is not a JSON object")
    schema = _field(doc, "schema", int, "file")
    if schema not in READ_SCHEMAS:
        raise ValueError(f"schema version {schema} is not supported (this kda-fuzz reads "
                         f"schemas {', '.join(map(str, READ_SCHEMAS))})")
    kind = _field(doc, "kind", str, "file")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    description = _field(doc, "description", str, "file")
    meta_contract = _field(doc, "contract", dict, "file")
    family = _field(meta_contract, "family", str, "contract")
    variant = _field(meta_contract, "variant", str, "contract")
    contract = get_contract(family)
    if variant not in contract.variants:
        raise ValueError(f"unknown variant {variant!r} of contract {family!r} "
                         f"(known: {', '.join(contract.variants)})")
    body = _field(doc, "case", dict, "file")
    intent = _field(body, "intent", list, "case")
    if not all(isinstance(i, str) for i in intent):
        raise ValueError("case.intent must be a list of strings")
    notes = _unjson(_field(body, "notes", dict, "case"))
    if "semantic" in notes and not isinstance(notes["semantic"], bool):
        raise ValueError("case.notes.semantic must be true or false")
    brk = notes.get("breakages", [])
    if not (isinstance(brk, list) and all(isinstance(b, str) for b in brk)):
        raise ValueError("case.notes.breakages must be a list of strings")
    tensors_obj = _field(body, "tensors", dict, "case")
    scalars_obj = _field(body, "scalars", dict, "case")
    missing = [n for n in contract.signature if n not in tensors_obj and n not in scalars_obj]
    if missing:
        raise ValueError(f"missing argument(s) {', '.join(missing)} in case")
    extra = [n for n in (*tensors_obj, *scalars_obj) if n not in contract.signature]
    if extra:
        raise ValueError(f"unknown argument(s) {', '.join(extra)} for contract {family!r}")
    both = [n for n in tensors_obj if n in scalars_obj]
    if both:
        raise ValueError(f"argument(s) {', '.join(both)} given as tensor and as scalar")
    scalar_kinds = contract.scalars
    misplaced = [n for n in tensors_obj if n in scalar_kinds]
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)} must be scalars, not tensors")
    tensors = {n: _decode_tensor(n, tensors_obj[n], schema) for n in contract.signature
               if n in tensors_obj}
    scalars = {n: _decode_scalar(family, n, scalars_obj[n]) for n in contract.signature
               if n in scalars_obj}
    verdict = None
    raw = doc.get("verdict")
    if raw is not None:
        if not isinstance(raw, dict):
            raise ValueError("verdict must be an object or null")
        try:
            verdict = contract.decoded_verdict(Verdict.from_json(_unjson(raw)))
        except TypeError as e:
            raise ValueError(f"verdict has missing or unknown fields ({e})") from None
        if not (isinstance(verdict.what, str) and isinstance(verdict.detail, str)):
            raise ValueError("verdict.what and verdict.detail must be strings")
        if verdict.kind != kind:
            raise ValueError(f"verdict kind {verdict.kind!r} does not match the file's kind "
                             f"{kind!r}")
    case = Case(family, variant, tensors, scalars, tuple(intent), notes)
    meta = {
        "path": str(path),
        "schema": schema,
        "kind": kind,
        "description": description,
        "origin": doc.get("origin") if isinstance(doc.get("origin"), dict) else {},
        "versions": doc.get("versions") if isinstance(doc.get("versions"), dict) else {},
        "expected": _recorded_expectation(doc.get("expected"), kind, verdict),
    }
    return case, verdict, meta


def _recorded_expectation(raw: Any, kind: str, verdict: Verdict | None) -> Expectation | None:
    """What the contract prescribed for the case when it was saved: the file's
    ``expected`` field, else what its verdict implies (files saved before that field
    existed), else what its kind implies (a hand-made ``contract-`` file: rejected with
    any message; ``mismatch-``: accepted); None when nothing says (a crash or hang)."""
    if isinstance(raw, dict) and isinstance(raw.get("ok"), bool):
        check, message, hole = raw.get("check"), raw.get("message"), raw.get("hole")
        return Expectation(raw["ok"], check if isinstance(check, int) else None,
                           message if isinstance(message, str) else None,
                           hole if isinstance(hole, str) else None)
    if verdict is None:
        return {"contract": Expectation(False), "mismatch": Expectation(True)}.get(kind)
    first = (verdict.first_kind or verdict.kind) if verdict.kind == "flaky" \
        else verdict.kind
    if first not in ("contract", "mismatch"):
        return None
    if first == "mismatch" or verdict.what == "rejected-valid-layout" \
            or verdict.what.startswith("peers-"):
        return Expectation(True)
    if verdict.check is not None and verdict.message is not None:
        return Expectation(False, verdict.check, verdict.message)
    return Expectation(False, None, None, verdict.hole or "unnamed")


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def load_case(path: str | os.PathLike[str]) -> tuple[Case, Verdict | None, dict[str, Any]]:
    """Read a corpus file: the case, its recorded verdict (or None) and the other fields.

    Raises :class:`CorpusError` (naming the file) for anything that is not a well-formed
    schema-1 or schema-2 file: truncated or invalid JSON, unknown schema, unknown
    kind/dtype/device/encoding, wrong byte counts (a zlib stream inflating to more or
    less than the base needs, checked without inflating more), views reaching beyond
    their base, absurd sizes, missing fields.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CorpusError(p, f"file is {size} bytes (at most {MAX_FILE_BYTES})")
        text = p.read_text(encoding="utf-8")
    except CorpusError:
        raise
    except (OSError, UnicodeDecodeError) as e:
        raise CorpusError(p, f"cannot read: {e}") from None
    try:
        doc = json.loads(text, parse_constant=_no_constants)
    except (json.JSONDecodeError, ValueError, RecursionError) as e:
        raise CorpusError(p, f"invalid JSON (truncated or corrupt?): {e}") from None
    try:
        return _decode(p, doc)
    except CorpusError:
        raise
    except (ValueError, TypeError, KeyError, OverflowError, RuntimeError, MemoryError) as e:
        raise CorpusError(p, str(e) or type(e).__name__) from None


def parse_case(text: str | bytes, name: str) -> tuple[Case, Verdict | None, dict[str, Any]]:
    """:func:`load_case` for a corpus document held in memory (an example database's
    entry), checked by the same rules; ``name`` stands for the path in errors."""
    try:
        if len(text) > MAX_FILE_BYTES:
            raise CorpusError(name, f"entry is {len(text)} bytes (at most {MAX_FILE_BYTES})")
        doc = json.loads(text, parse_constant=_no_constants)
    except CorpusError:
        raise
    except (json.JSONDecodeError, ValueError, RecursionError, UnicodeDecodeError) as e:
        raise CorpusError(name, f"invalid JSON (truncated or corrupt?): {e}") from None
    try:
        return _decode(Path(name), doc)
    except (ValueError, TypeError, KeyError, OverflowError, RuntimeError, MemoryError) as e:
        raise CorpusError(name, str(e) or type(e).__name__) from None


def corpus_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The files named, and every ``**/*.json`` under the folders named (sorted, unique).

    Below a folder, hidden entries (a name starting with ``.``: temporary files, hidden
    folders) are skipped, as pytest skips them. Raises
    ``FileNotFoundError`` for a path that does not exist.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend(sorted(
                q for q in p.rglob("*.json")
                if q.is_file() and not any(part.startswith(".") for part in q.relative_to(p).parts)
            ))
        elif p.exists():
            found.append(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    return list(dict.fromkeys(found))
