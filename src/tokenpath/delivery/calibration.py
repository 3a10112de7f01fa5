"""Delivery calibration files: this machine's measured host cost of the last mile, per batch size.

`tokenpath calibrate delivery` writes one; a scenario's `delivery.calibration` names it, and the
delivery model then charges each engine step what the measurement says for its batch size, instead
of the constants `detokenize_per_token` and `frame_per_event`.

Per measured batch size b the file holds the fixed cost of a step (`step_s`, a step where no sequence
has a token), the cost per token of the whole path with every token framed as its own event
(`per_token_s`: detokenize, stop check and framing) and the framing share of it (`frame_per_event_s`).
A step with b tokens costs step_s + b * per_token_s, interpolated linearly between measured batch
sizes and extended linearly beyond them; when events group tokens, framing is charged per event.

The `[request]` table (absent from files written before it was measured) holds what the front end
spends on each request before the engine sees it (`RequestCost`), and `[framing]` what one streamed
chunk costs built as an engine's own code builds it, next to this package's framer (`FramingCost`).
`[http]` (absent from files written before it) holds the HTTP server's own work (`HttpCost`) on
`tokenpath serve`'s stack, and `[engine_http]` the same on an engine's (FastAPI under uvicorn, as vLLM
and SGLang serve), its per-request figure with the body's validation in it. `[template_parse]` (absent
from files written before it) holds what reading the chat template's source costs per character, as
some engine releases do for every request (`TemplateParseCost`, engine/template_work.py): where a
scenario's release does, it takes this figure in place of the registry's.

Whose front end the file then prices is the scenario's `delivery.calibrated_server`:
- "engine" (the default): per request, `[engine_http]`'s request (HTTP layer and validation) where
  measured, else `[request]`'s parse_s; per event, the engine's own pydantic chunk (`[framing]`) and
  `[engine_http]`'s event; per token, not the batch rows, which time this package's detokenizer: an
  engine's own per-token work (vLLM's OutputProcessor) is the registry's detokenize_per_token, timed
  with the engine's code (benchmarks/vllm_output_processor.py), which a calibration cannot run;
- "serve": per request, `[http]`'s request and `[request]`'s parse_s; per token and per event, the batch
  rows (this package's detokenizer and framer) and `[http]`'s event.
Both add the chat template, the hand-off and tokenizing from `[request]`. A table the file lacks adds
nothing (its framing: the batch rows').
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import tomli_w

from tokenpath.config import files
from tokenpath.config.errors import UserError

SCHEMA = "tokenpath.delivery-calibration/1"


@dataclass(frozen=True)
class BatchCost:
    batch_size: int
    step_s: float            # fixed cost of one step
    per_token_s: float       # detokenize + stop check + framing, per token, one event per token
    frame_per_event_s: float  # the framing part of per_token_s

    @property
    def total_s(self) -> float:
        return self.step_s + self.batch_size * self.per_token_s


@dataclass(frozen=True)
class RequestCost:
    """Front-end host seconds of one chat request before the engine sees it."""

    parse_s: float               # decode the JSON body and validate it (the engine's pydantic request)
    template_s: float            # render the chat template of a short conversation
    tokenize_per_token_s: float  # encoding the prompt, per prompt token
    handoff_s: float             # serialize the tokenized request and pass it to the engine process

    def per_request_s(self, input_tokens: int) -> float:
        return self.parse_s + self.template_s + self.handoff_s + input_tokens * self.tokenize_per_token_s


@dataclass(frozen=True)
class FramingCost:
    """Host seconds of one streamed text chunk."""

    engine_frame_per_event_s: float  # an engine's pydantic chunk, model_dump_json, `data: ...` framing
    own_frame_per_event_s: float     # this package's framer (sse.py) on the same texts, one stream


@dataclass(frozen=True)
class HttpCost:
    """Host seconds of an HTTP server's own work, beside the request path's pieces and each chunk's
    building: measured on `tokenpath serve`'s stack (serve/measure.py, the file's [http]) or on an
    engine's FastAPI and uvicorn (calibrate/engine_http.py, [engine_http], whose request_s includes
    FastAPI's parsing of the body into the engine's pydantic request)."""

    request_s: float  # accept, read and parse the request, dispatch it, send the response's head and end, close
    event_s: float    # one streamed event to its socket: queued, its stream's task woken, written and sent


@dataclass(frozen=True)
class TemplateParseCost:
    """Host seconds, per character of a chat template's source, of the work engine releases do on it for
    every request (delivery/template_parse.py runs it; engine/template_work.py says which releases), each
    named as the registry names its default."""

    template_format_detection_per_char_s: float   # vLLM 0.6.5-0.9.1: parse, and walk the tree for content loops
    template_kwargs_resolution_per_char_s: float  # vLLM 0.11.0: a sandboxed environment, parse, undeclared variables


CalibratedServer = Literal["engine", "serve"]
CALIBRATED_SERVERS: tuple[CalibratedServer, ...] = ("engine", "serve")


# A cost above an hour is a broken file, not a measurement.
MAX_COST_S = 3600.0


def _costs(document: dict, table: str, kind: type, where: str) -> Any:
    """The `[table]` of seconds as `kind` (a dataclass of float fields), None when the file has none."""
    values = document.get(table)
    names = [f.name for f in fields(kind)]
    fix = f"[{table}] needs {', '.join(names)} in seconds; write it again with `tokenpath calibrate delivery`"
    if values is None:
        return None
    if not isinstance(values, dict):
        raise UserError(f"{where}: {table} is {values!r}, not a table; {fix}")
    for name in names:
        value = values.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_COST_S:
            shown = "missing" if name not in values else f"{value!r}"
            raise UserError(f"{where}: {table}.{name} is {shown}, not seconds from 0 to 1 h; {fix}")
    return kind(**{name: float(values[name]) for name in names})


@dataclass
class Calibration:
    batches: list[BatchCost]
    machine: dict[str, Any] = field(default_factory=dict)
    tokenizer: dict[str, Any] = field(default_factory=dict)
    path: dict[str, Any] = field(default_factory=dict)
    measured_at: str = ""
    request: RequestCost | None = None
    framing: FramingCost | None = None
    http: HttpCost | None = None
    engine_http: HttpCost | None = None
    template_parse: TemplateParseCost | None = None

    def to_toml(self) -> str:
        document = {"schema": SCHEMA, "measured_at": self.measured_at, "machine": self.machine,
                    "tokenizer": self.tokenizer, "path": self.path}
        for table, costs in (("request", self.request), ("framing", self.framing), ("http", self.http),
                             ("engine_http", self.engine_http), ("template_parse", self.template_parse)):
            if costs is not None:
                document[table] = asdict(costs)
        document["batch"] = [asdict(b) for b in self.batches]
        return tomli_w.dumps(document)

    def write(self, path: str | Path) -> None:
        try:
            Path(path).write_text(self.to_toml(), encoding="utf-8")
        except OSError as error:
            raise UserError(f"--out {path}: cannot write it ({error.strerror}); choose a writable path") from None

    @classmethod
    def read(cls, path: str | Path, field_name: str = "delivery.calibration") -> Calibration:
        where = f"{field_name} = {files.shown(path)!r}"
        if not files.exists(path):
            files.check_path(path, field_name)
            raise UserError(f"{where}: no such file; write one with `tokenpath calibrate delivery --out {path}`")
        document = files.parse_toml(files.read_text(path, f"{field_name} file"), where)
        if document.get("schema") != SCHEMA:
            raise UserError(f"{where}: schema is {document.get('schema')!r}, expected {SCHEMA!r}; "
                            "write it again with `tokenpath calibrate delivery`")
        batches = []
        for k, row in enumerate(document.get("batch", [])):
            try:
                cost = BatchCost(int(row["batch_size"]), float(row["step_s"]), float(row["per_token_s"]),
                                 float(row["frame_per_event_s"]))
            except (KeyError, TypeError, ValueError, OverflowError) as error:
                raise UserError(f"{where}: batch[{k}] lacks or garbles {error}; each [[batch]] needs batch_size, "
                                "step_s, per_token_s, frame_per_event_s") from None
            costs_s = (cost.step_s, cost.per_token_s, cost.frame_per_event_s)
            if not 1 <= cost.batch_size <= 2**20 or not all(0 <= c <= MAX_COST_S for c in costs_s):
                raise UserError(f"{where}: batch[{k}] has a batch_size outside 1..2^20 or a cost outside 0..1 h; "
                                "write it again with `tokenpath calibrate delivery`")
            batches.append(cost)
        if not batches:
            raise UserError(f"{where}: no [[batch]] rows; write it again with `tokenpath calibrate delivery`")
        batches.sort(key=lambda b: b.batch_size)
        if len({b.batch_size for b in batches}) != len(batches):
            raise UserError(f"{where}: a batch_size appears twice; keep one row per batch size")
        return cls(batches, document.get("machine", {}), document.get("tokenizer", {}), document.get("path", {}),
                   str(document.get("measured_at", "")), _costs(document, "request", RequestCost, where),
                   _costs(document, "framing", FramingCost, where), _costs(document, "http", HttpCost, where),
                   _costs(document, "engine_http", HttpCost, where),
                   _costs(document, "template_parse", TemplateParseCost, where))


def _interpolate(points: list[tuple[int, float]], b: float) -> float:
    """Piecewise linear through the points, extended linearly past both ends (never below zero)."""
    if len(points) == 1:
        return points[0][1]
    if b <= points[0][0]:
        (x0, y0), (x1, y1) = points[0], points[1]
    elif b >= points[-1][0]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
    else:
        k = next(j for j in range(1, len(points)) if points[j][0] >= b)
        (x0, y0), (x1, y1) = points[k - 1], points[k]
    return max(0.0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))


class CalibratedCost:
    """Host seconds of one step from a calibration, for the front end of `server` (the module's
    docstring); a table per batch size so a lookup is O(1)."""

    def __init__(self, calibration: Calibration, server: CalibratedServer = "engine") -> None:
        self.request = calibration.request  # the front end's measured cost per request, if measured
        # Whether it prices an engine's front end, whose per-token work is not the batch rows' (above).
        self.prices_engine = server == "engine"
        http = calibration.engine_http if server == "engine" else calibration.http
        self._http_request_s, self._event_s = (http.request_s, http.event_s) if http is not None else (0.0, 0.0)
        # The engine's HTTP figure holds the body's validation (FastAPI's, into the pydantic request).
        self._validated = server == "engine" and http is not None
        framing = calibration.framing
        self._chunk_s = framing.engine_frame_per_event_s if server == "engine" and framing is not None else None
        batches = calibration.batches
        totals = [(b.batch_size, b.total_s) for b in batches]
        if len(batches) == 1:  # one point: a line through it with its own per-token slope
            only = batches[0]
            totals = [(0, only.step_s), (only.batch_size, only.total_s)] if only.batch_size else totals
        frames = [(b.batch_size, b.frame_per_event_s) for b in batches]
        self._top = batches[-1].batch_size
        self._total = [_interpolate(totals, b) for b in range(self._top + 1)]
        self._frame = [_interpolate(frames, b) for b in range(self._top + 1)]
        self._slope = (self._total[self._top] - self._total[self._top - 1]) if self._top >= 1 else 0.0

    @classmethod
    def from_file(cls, path: str | Path, server: CalibratedServer = "engine") -> CalibratedCost:
        return cls(Calibration.read(path), server)

    def request_stages_s(self) -> tuple[float, float, float] | None:
        """The front end's time for one request, as LastMile.request_stages_s splits it: (as it arrives:
        the HTTP server's own work and parsing; then: the chat template and the hand-off; per prompt
        token tokenized); None when the file has no [request] (the spec's constants apply)."""
        if self.request is None:
            return None
        r = self.request
        first_s = self._http_request_s if self._validated else self._http_request_s + r.parse_s
        return first_s, r.template_s + r.handoff_s, r.tokenize_per_token_s

    def _chunk_at(self, tokens: int) -> tuple[float, float]:
        """(this package's framing per event at the batch size: in the rows' totals; what the server
        spends building one chunk)."""
        frame = self._frame[min(tokens, self._top)]
        return frame, frame if self._chunk_s is None else self._chunk_s

    def host_s(self, tokens: int, events: int) -> float:
        """Host time of a step that emits `tokens` tokens in `events` SSE events: the rows' detokenizing
        and stop check, and each event built and written to its socket."""
        if tokens <= 0:
            return 0.0
        if tokens <= self._top:
            total = self._total[tokens]
        else:
            total = self._total[self._top] + (tokens - self._top) * self._slope
        frame, chunk = self._chunk_at(tokens)
        return max(0.0, total - tokens * frame + events * chunk) + events * self._event_s

    def frame_s(self, tokens: int, events: int) -> float:
        """The framing part of `host_s`: `events` SSE events, each built and written."""
        if tokens <= 0:
            return 0.0
        return events * (self._chunk_at(tokens)[1] + self._event_s)
