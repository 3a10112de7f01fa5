"""Streaming detokenization, side by side: tokenpath vs the methods servers use, on the same ids.

Usage: python benchmarks/detokenize.py [--sequences 256] [--steps 1000] [--runs 5]
                                      [--naive-sequences 16] [--json results/detokenize.json]

One core (the process is pinned to one CPU; the tokenizers library to one thread). Per tokenizer
(Tekken 131k, SentencePiece v1 32k), each sequence is a window of a mixed sample text (English,
Chinese, code, emoji) encoded by the tokenizer, and every method decodes the same ids, one engine
step at a time:

  tokenpath        Detokenizer.batch(n).step(ids): the whole batch per call
  DecodeStream     Hugging Face tokenizers' DecodeStream, one call per sequence per step
  prefix/read      the prefix/read-offset method of vLLM and TGI (two decodes per token)
  naive            decode everything so far each step, emit what grew (fewer sequences: it is O(n^2))

The peers decode with a Hugging Face tokenizer of the same vocabulary (tokenpath.delivery.hf_export).
"exact" counts the sequences whose streamed text equals the tokenizer library's own full decode.
Each method runs `runs` times, interleaved; the median is reported, because the machine is shared.
The "full path" rows add stop strings and SSE framing: tokenpath's TextPath against DecodeStream with
a per-sequence hold-back stop check and json.dumps of each chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenpath.delivery import Detokenizer  # noqa: E402
from tokenpath.delivery.hf_export import to_hf_tokenizer  # noqa: E402
from tokenpath.delivery.measure import DEFAULT_STOPS, machine, token_streams  # noqa: E402
from tokenpath.delivery.path import TextPath  # noqa: E402

TOKENIZERS = {"Tekken (131k)": "tekken_240911.json", "SentencePiece v1 (32k)": "tokenizer.model.v1"}


def run_tokenpath(det, hf, ids):
    stream = det.batch(ids.shape[1])
    start = time.perf_counter()
    steps = [stream.step(row) for row in ids]
    steps.append(stream.finish())
    elapsed = time.perf_counter() - start
    return elapsed, ["".join(parts) for parts in zip(*steps)]


def run_decode_stream(det, hf, ids):
    from tokenizers.decoders import DecodeStream

    streams = [DecodeStream(skip_special_tokens=True) for _ in range(ids.shape[1])]
    rows = ids.tolist()
    out = [[] for _ in streams]
    start = time.perf_counter()
    for row in rows:
        for i, token in enumerate(row):
            text = streams[i].step(hf, token)
            if text is not None:
                out[i].append(text)
    elapsed = time.perf_counter() - start
    return elapsed, ["".join(parts) for parts in out]


def run_offsets(det, hf, ids):
    n = ids.shape[1]
    seen, prefix, read, out = [[] for _ in range(n)], [0] * n, [0] * n, [[] for _ in range(n)]
    rows = ids.tolist()
    decode = hf.decode
    start = time.perf_counter()
    for row in rows:
        for i, token in enumerate(row):
            tokens = seen[i]
            tokens.append(token)
            prefix_text = decode(tokens[prefix[i]:read[i]])
            new_text = decode(tokens[prefix[i]:])
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                out[i].append(new_text[len(prefix_text):])
                prefix[i], read[i] = read[i], len(tokens)
    elapsed = time.perf_counter() - start
    return elapsed, ["".join(parts) for parts in out]


def run_naive(det, hf, ids):
    n = ids.shape[1]
    seen, shown, out = [[] for _ in range(n)], [""] * n, [[] for _ in range(n)]
    rows = ids.tolist()
    start = time.perf_counter()
    for row in rows:
        for i, token in enumerate(row):
            seen[i].append(token)
            text = hf.decode(seen[i])
            out[i].append(text[len(shown[i]):])
            shown[i] = text
    elapsed = time.perf_counter() - start
    return elapsed, ["".join(parts) for parts in out]


def run_path_tokenpath(det, hf, ids):
    path = TextPath(det, ids.shape[1], DEFAULT_STOPS)
    start = time.perf_counter()
    for row in ids:
        path.step(row)
    path.finish()
    return time.perf_counter() - start, None


def run_path_peer(det, hf, ids):
    """DecodeStream, the hold-back stop check per sequence, json.dumps of each chunk."""
    from tokenizers.decoders import DecodeStream

    n, hold = ids.shape[1], max(map(len, DEFAULT_STOPS)) - 1
    streams, held = [DecodeStream(skip_special_tokens=True) for _ in range(n)], [""] * n
    rows = ids.tolist()
    start = time.perf_counter()
    for row in rows:
        for i, token in enumerate(row):
            text = streams[i].step(hf, token)
            if text is None:
                continue
            buffer = held[i] + text
            if any(stop in buffer for stop in DEFAULT_STOPS):
                held[i] = ""
                continue
            text, held[i] = buffer[:-hold], buffer[-hold:]
            if text:
                chunk = {"id": f"chatcmpl-{i}", "object": "chat.completion.chunk", "created": 0, "model": "tokenpath",
                         "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}]}
                _ = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return time.perf_counter() - start, None


METHODS = [("tokenpath", run_tokenpath), ("HF DecodeStream", run_decode_stream),
           ("prefix/read offsets (vLLM, TGI)", run_offsets), ("naive re-decode", run_naive)]
PATHS = [("tokenpath: detokenize + stop + SSE", run_path_tokenpath),
         ("DecodeStream + stop check + json.dumps", run_path_peer)]


def pin_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"cpu {cpu}"
    return "not pinned"


def bench(label: str, name: str, args) -> list[dict]:
    det = Detokenizer.load(name)
    hf = to_hf_tokenizer(det)
    ids = token_streams(det, args.sequences, args.steps)
    naive_ids = ids[:, : args.naive_sequences]
    reference = [det.decode(ids[:, i].tolist()) for i in range(ids.shape[1])]
    plan = [(m, f, naive_ids if m == "naive re-decode" else ids) for m, f in METHODS + PATHS]
    times: dict[str, list[float]] = {m: [] for m, _, _ in plan}
    exact: dict[str, int | None] = {}
    for run in range(args.runs):
        for method, function, work in plan:
            elapsed, texts = function(det, hf, work)
            times[method].append(work.size / elapsed)
            if run == 0:
                exact[method] = None if texts is None else sum(t == r for t, r in zip(texts, reference))
    rows = []
    for method, _, work in plan:
        rate = statistics.median(times[method])
        rows.append({"tokenizer": label, "method": method, "sequences": work.shape[1], "steps": work.shape[0],
                     "tokens_per_s": rate, "tokens_per_s_runs": times[method],
                     "exact_sequences": exact[method], "slow_token_share": _slow_share(det, ids)})
    by_name = {r["method"]: r["tokens_per_s"] for r in rows}
    for r in rows:
        peer = "tokenpath" if r["method"] in by_name and r["method"] in dict(METHODS) else PATHS[0][0]
        r["tokenpath_x"] = by_name[peer] / r["tokens_per_s"]
    return rows


def _slow_share(det, ids) -> float:
    """Share of tokens that are not finished text on their own (they take the per-sequence path)."""
    return float((det.table.code[ids + 1] != 0).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--naive-sequences", type=int, default=16)
    parser.add_argument("--json", dest="json_path", default="results/detokenize.json")
    args = parser.parse_args()
    pinned = pin_one_core()
    rows = [row for label, name in TOKENIZERS.items() for row in bench(label, name, args)]
    print(f"{args.sequences} sequences x {args.steps} steps, median of {args.runs} runs, one core ({pinned})")
    print(f"{'tokenizer':<24} {'method':<40} {'tok/s':>12} {'tokenpath x':>12} {'exact':>9}")
    for r in rows:
        exact = "-" if r["exact_sequences"] is None else f"{r['exact_sequences']}/{r['sequences']}"
        print(f"{r['tokenizer']:<24} {r['method']:<40} {r['tokens_per_s']:>12,.0f} "
              f"{r['tokenpath_x']:>11.1f}x {exact:>9}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json_path, "w") as out:
            json.dump({"benchmark": "detokenize", "python": platform.python_version(), "machine": machine(),
                       "pinned": pinned, "sequences": args.sequences, "steps": args.steps, "runs": args.runs,
                       "rows": rows}, out, indent=2)
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()
