"""The `index` of a retrieval stage: the vector index it searches, in place of a latency.

A retrieval stage with `index = {vectors, dim, method, ...}` takes the time the index's search takes
(compute/vector_search.py, `retrieval_latency_s`) instead of a user-given distribution. Problems are
pydantic errors naming the field; the scenario turns them into one line (config/config_errors.py).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tokenpath.compute.chip import load_chip
from tokenpath.compute.vector_search import retrieval_latency_s
from tokenpath.config.errors import UserError
from tokenpath.workload.lengths import lognormal_parameters

# Bytes per dimension of a stored vector (data types' sizes).
INDEX_PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}
# Bounds on the table's input, not predictions: a trillion vectors, embeddings of up to 64k dimensions,
# and search widths no index uses (k and efSearch beyond 100k, more threads than any socket has).
MAX_VECTORS = 10**12
MAX_DIM = 65_536
MAX_SEARCH_WIDTH = 100_000
MAX_THREADS = 1_024
MAX_SPREAD = 10.0

_METHOD_KNOBS = {"flat": (), "ivf": ("nlist", "nprobe"), "hnsw": ("m", "ef_search")}


class IndexSpec(BaseModel):
    """A vector index and how one query searches it: `vectors` of `dim` dimensions stored at
    `precision` (fp32 by default) or as PQ codes of `pq_bytes` bytes, searched by `method` on `on` (the
    CPU, or a catalog chip) for the `top_k` nearest. IVF probes `nprobe` of its `nlist` lists; HNSW
    has `m` links a node on each layer (2m on the bottom one) and searches `ef_search` wide. On the CPU
    a query's scan uses `threads` cores (1 by default). `spread`: each request's time is lognormal
    around the model's, its sd this fraction of the mean (0: every request takes the model's time)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    vectors: int = Field(ge=1, le=MAX_VECTORS)
    dim: int = Field(ge=1, le=MAX_DIM)
    method: Literal["flat", "ivf", "hnsw"]
    on: str = Field("cpu", min_length=1, max_length=200)
    top_k: int = Field(10, ge=1, le=MAX_SEARCH_WIDTH)
    precision: Literal["fp32", "fp16", "bf16", "int8"] | None = None  # fp32 unless PQ codes replace it
    pq_bytes: int | None = Field(None, ge=1, le=MAX_DIM)
    nlist: int | None = Field(None, ge=1, le=MAX_VECTORS)
    nprobe: int | None = Field(None, ge=1, le=MAX_VECTORS)
    m: int | None = Field(None, ge=2, le=MAX_SEARCH_WIDTH)
    ef_search: int | None = Field(None, ge=1, le=MAX_SEARCH_WIDTH)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)  # 1 unless given (the CPU's only)
    spread: float = Field(0.0, ge=0, le=MAX_SPREAD)

    @model_validator(mode="after")
    def _check(self) -> IndexSpec:
        knobs = _METHOD_KNOBS[self.method]
        missing = [name for name in knobs if getattr(self, name) is None]
        if missing:
            raise ValueError(f"method {self.method!r} needs {' and '.join(knobs)}; missing {', '.join(missing)}")
        for method, names in _METHOD_KNOBS.items():
            stray = [name for name in names if method != self.method and getattr(self, name) is not None]
            if stray:
                verb, them = ("belong", "them") if len(stray) > 1 else ("belongs", "it")
                raise ValueError(f"{' and '.join(stray)} {verb} to method {method!r}, not {self.method!r}; remove "
                                 f"{them} or set method = {method!r}")
        if self.pq_bytes is not None and self.precision is not None:
            raise ValueError("give precision (stored vectors) or pq_bytes (PQ codes), not both")
        if self.pq_bytes is not None and self.pq_bytes > self.dim:
            raise ValueError(f"pq_bytes ({self.pq_bytes}) is more than dim ({self.dim}): a PQ code has at most one "
                             "byte a dimension")
        if self.top_k > self.vectors:
            raise ValueError(f"top_k ({self.top_k}) is more than the index's {self.vectors} vectors")
        if self.method == "ivf":
            if self.nlist > self.vectors:
                raise ValueError(f"nlist ({self.nlist}) is more than the index's {self.vectors} vectors")
            if self.nprobe > self.nlist:
                raise ValueError(f"nprobe ({self.nprobe}) is more than nlist ({self.nlist}); a query probes at "
                                 "most every list")
        if self.method == "hnsw" and self.threads is not None:
            raise ValueError("one query walks an HNSW graph on one thread; remove threads")
        if self.on != "cpu":
            self._check_chip()
        return self

    def _check_chip(self) -> None:
        try:
            chip = load_chip(self.on)
        except UserError as error:
            raise ValueError(f"on = {self.on!r} is neither \"cpu\" nor a catalog chip: {error}") from None
        if self.method == "hnsw":
            raise ValueError("an HNSW graph is walked on the CPU here (one query's walk is sequential); set "
                             "on = \"cpu\", or method = \"flat\" or \"ivf\" on a chip")
        if self.threads is not None:
            raise ValueError("threads are the CPU's; a chip scans with all of itself: remove threads")
        if self.index_bytes > chip.hbm_bytes:
            raise ValueError(f"the index ({self.index_bytes / 2**30:,.1f} GiB) does not fit in one {chip.name}'s "
                             f"{chip.hbm_bytes / 2**30:,.0f} GiB; use pq_bytes, fewer vectors or on = \"cpu\"")

    @property
    def code_bytes(self) -> int:
        """Bytes of one stored vector: its PQ code, or dim x the precision's size."""
        if self.pq_bytes is not None:
            return self.pq_bytes
        return self.dim * INDEX_PRECISION_BYTES[self.precision or "fp32"]

    @property
    def index_bytes(self) -> int:
        return self.vectors * self.code_bytes


def index_times_s(index: IndexSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` requests' times on the index: the model's time each (no draw) or, with a spread, lognormal
    draws around it."""
    mean = retrieval_latency_s(index)
    if index.spread == 0:
        return np.full(n, mean)
    mu, sigma = lognormal_parameters(mean, index.spread * mean)
    return rng.lognormal(mu, sigma, n)
