"""vLLM V1's API-server CPU time per streamed token: its own OutputProcessor and msgpack decoder, on this CPU.

Each step of vLLM V1's engine core sends the API-server process one msgpack `EngineCoreOutputs` (one
`EngineCoreOutput` per running request: its request id and new token ids). The API server's output
handler (AsyncLLM's `output_handler`, fed by core_client.py's `process_outputs_socket`) decodes it with
`MsgpackDecoder(EngineCoreOutputs)`, then hands it, in slices of VLLM_V1_OUTPUT_PROC_CHUNK_SIZE (128),
to `OutputProcessor.process_outputs`: per request, the statistics update, incremental detokenization
(`FastIncrementalDetokenizer`, tokenizers' DecodeStream, one `step` per token), the stop-string check,
a `CompletionOutput` and `RequestOutput` with the delta text, and the put into the request's
`RequestOutputCollector`, which the request's generate() task then reads. This script runs that path
with vLLM's own classes and no GPU and no engine: the messages are encoded beforehand with vLLM's
`MsgpackEncoder`, as the engine core's process encodes them, and decoded and processed in the timed
loop. It is the host work the API server spends per token before the OpenAI serving layer builds and
frames the SSE chunk (tokenpath charges that separately, as frame_per_event_s).

Each sequence's prompt is a window of `--prompt-tokens` tokens of a mixed sample text (English prose,
Chinese, code, emoji) as the tokenizer encodes it, and its output the text's next tokens, one per
engine step: SamplingParams(output_kind=DELTA, detokenize on, skip_special_tokens on), as streaming
serving uses, with no stop strings and with two ("\\n\\nUser:", "<|end|>", which never match: every
sequence runs all its steps), and statistics on (log_stats, `vllm serve`'s default; --no-log-stats
turns them off). Per batch size, `--warmup` steps then `--steps` steps are run `--repeats` times
(a fresh OutputProcessor and requests each time, adding them untimed, the runs with and without stops
interleaved). Each step is timed; a repeat's figure is its median step over the batch, and the table
shows the median over repeats, in microseconds per token, of:

  decode    MsgpackDecoder(EngineCoreOutputs).decode of the step's message (zmq.Frame objects, as received)
  process   the output handler's per-step work: IterationStats(), the chunking, process_outputs
  record    the Prometheus logger's per-token work on the step's statistics (`vllm serve`'s default):
            PrometheusStatLogger.record observes each token's inter-token latency twice
            (vllm:inter_token_latency_seconds and the deprecated vllm:time_per_output_token_seconds,
            v1/metrics/loggers.py), replayed here on histograms made as it makes them
  both      decode + process + record, step by step: the API server's per-token figure
  (mean)    both, with each repeat's mean step instead of its median: it keeps the rare long steps
            (the garbage collector's older generations; on a shared machine, preemption too)
  stream    DecodeStream.step alone on the same ids (one stream per sequence), for reference

The step's median, not its mean, is the headline because on a shared machine one preempted step adds
milliseconds; a step of one sequence carries the step's fixed work (the message's envelope, the
statistics object), which larger batches spread over more tokens.

Run it in a vLLM environment (vLLM imports without a GPU; the script does not import tokenpath):

    python -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm==0.11.0
    /tmp/vllm-venv/bin/python benchmarks/vllm_output_processor.py --tokenizer TOKENIZER_JSON \\
        [--ids IDS_JSON] [--sizes 1 8 32 128 256] [--steps 200] [--repeats 5]

TOKENIZER_JSON is a Hugging Face tokenizer.json, loaded as transformers' PreTrainedTokenizerFast (so
vLLM picks its fast, DecodeStream-based detokenizer). Without --ids the script encodes its own sample
text with it. tokenpath's exports of the Mistral tokenizers (tokenpath.delivery.hf_export) have no BPE
merges and only decode correctly, so they come with the ids of tokenpath's sample text as the original
tokenizer encodes it; in tokenpath's environment, from the repository root:

    mkdir -p /tmp/vllm_op && python -c "
    import json
    from tokenpath.delivery import Detokenizer
    from tokenpath.delivery.hf_export import to_hf_tokenizer
    from tokenpath.delivery.sample_text import MIXED
    for name, out in [(None, 'tekken'), ('tokenizer.model.v1', 'spm_v1')]:
        det = Detokenizer.load(name)
        to_hf_tokenizer(det).save(f'/tmp/vllm_op/{out}.tokenizer.json')
        json.dump(det.encode(MIXED), open(f'/tmp/vllm_op/{out}.ids.json', 'w'))"
    /tmp/vllm-venv/bin/python benchmarks/vllm_output_processor.py \\
        --tokenizer /tmp/vllm_op/tekken.tokenizer.json --ids /tmp/vllm_op/tekken.ids.json

Not included: the ZeroMQ receive itself and the asyncio scheduling around it (the awaits between
slices, the abort call for stop-string finishes, which never happen here), the loggers' per-step
counters (once a step, not per token), the generate() task's get and everything after it
in the OpenAI serving layer (chunk building, JSON, SSE framing, the HTTP write), logprobs (not
requested), adding and finishing requests (the prompt-side priming of each detokenizer is untimed),
and parallel sampling (n = 1). The process runs on whatever core the OS gives it; the machine may be
shared, hence the medians.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
import uuid

from engine_bench_common import add_token_run_arguments, cpu_name, load_tokenizer, sample_ids, token_windows

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

STOPS = ("\n\nUser:", "<|end|>")
WARMUP_STEPS = 20
PROMPT_TOKENS = 256
def encoded_steps(request_ids: list[str], outputs: list[list[int]], total_steps: int) -> list[list]:
    """Each engine step's EngineCoreOutputs, encoded as the engine core's process encodes them and
    wrapped as the API server's socket receives them (recv_multipart(copy=False): zmq.Frame objects)."""
    import zmq
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackEncoder

    encoder = MsgpackEncoder()
    messages, now = [], time.monotonic()
    for k in range(total_steps):
        step = EngineCoreOutputs(
            outputs=[EngineCoreOutput(request_id=r, new_token_ids=[out[k]]) for r, out in zip(request_ids, outputs)],
            scheduler_stats=SchedulerStats(num_running_reqs=len(request_ids), step_counter=k, kv_cache_usage=0.5),
            timestamp=now + 0.02 * k)
        messages.append([zmq.Frame(bytes(buf)) for buf in encoder.encode(step)])
    return messages


def token_histograms() -> list:
    """The two per-token histograms of vLLM 0.11's PrometheusStatLogger (v1/metrics/loggers.py), with its
    names, buckets and labels, bound to one engine as its make_per_engine binds them."""
    import prometheus_client

    buckets = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]
    registry = prometheus_client.CollectorRegistry()
    return [prometheus_client.Histogram(name, "per-token histogram", labelnames=["model_name", "engine"],
                                        buckets=buckets, registry=registry).labels("model", "0")
            for name in ("vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds")]


def run_output_processor(tokenizer, prompts: list[list[int]], request_ids: list[str], messages: list[list],
                         stops: tuple[str, ...], log_stats: bool,
                         warmup: int) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each step after `warmup` (decode, process, record), with a fresh OutputProcessor and
    requests."""
    import numpy as np
    from vllm import envs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.utils import cdiv
    from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.metrics.stats import IterationStats
    from vllm.v1.serial_utils import MsgpackDecoder

    chunk = envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE
    processor = OutputProcessor(tokenizer, log_stats=log_stats)
    decoder = MsgpackDecoder(EngineCoreOutputs)
    queues = []
    for request_id, prompt in zip(request_ids, prompts):
        params = SamplingParams(max_tokens=1_000_000, ignore_eos=True, stop=list(stops) or None,
                                output_kind=RequestOutputKind.DELTA)
        request = EngineCoreRequest(request_id=request_id, prompt_token_ids=prompt, mm_features=None,
                                    sampling_params=params, pooling_params=None, eos_token_id=None,
                                    arrival_time=time.time(), lora_request=None, cache_salt=None,
                                    data_parallel_rank=None)
        queue = RequestOutputCollector(RequestOutputKind.DELTA)
        processor.add_request(request, tokenizer._tokenizer.decode(prompt), None, 0, queue)
        queues.append(queue)
    detokenizer = processor.request_states[request_ids[0]].detokenizer
    assert isinstance(detokenizer, FastIncrementalDetokenizer), type(detokenizer)

    per_token_tpot, per_token_itl = token_histograms()
    decode_s, process_s, record_s = [], [], []
    gc.collect()
    for k, frames in enumerate(messages):
        start = time.perf_counter()
        outputs = decoder.decode(frames)
        decoded = time.perf_counter()
        # AsyncLLM's output_handler, less its awaits and the stats loggers' record
        n = len(outputs.outputs)
        iteration_stats = IterationStats() if (log_stats and n) else None
        slices = (outputs.outputs,) if n <= chunk else np.array_split(outputs.outputs, cdiv(n, chunk))
        for part in slices:
            result = processor.process_outputs(part, outputs.timestamp, iteration_stats)
            assert not result.request_outputs and not result.reqs_to_abort, "a stop string matched"
        done = time.perf_counter()
        if iteration_stats is not None:  # PrometheusStatLogger.record's per-token loop
            for itl in iteration_stats.inter_token_latencies_iter:
                per_token_itl.observe(itl)
                per_token_tpot.observe(itl)
        recorded = time.perf_counter()
        if k >= warmup:
            decode_s.append(decoded - start)
            process_s.append(done - decoded)
            record_s.append(recorded - done)
        for queue in queues:  # the generate() tasks take their outputs (untimed)
            queue.get_nowait()
    return decode_s, process_s, record_s


def run_decode_stream(tokenizer, prompts: list[list[int]], outputs: list[list[int]], warmup: int) -> list[float]:
    """Seconds of each step after `warmup` of DecodeStream.step alone, one stream per sequence, primed
    with its prompt's tail."""
    from tokenizers.decoders import DecodeStream

    backend = tokenizer._tokenizer
    streams = [DecodeStream(skip_special_tokens=True) for _ in prompts]
    for stream, prompt in zip(streams, prompts):
        for token in prompt[-8:]:
            stream.step(backend, token)
    seconds = []
    gc.collect()
    for k, row in enumerate(zip(*outputs)):
        start = time.perf_counter()
        for stream, token in zip(streams, row):
            stream.step(backend, token)
        if k >= warmup:
            seconds.append(time.perf_counter() - start)
    return seconds


def measure(tokenizer, text_ids: list[int], batch: int, steps: int, warmup: int, repeats: int,
            prompt_tokens: int, log_stats: bool) -> dict[str, dict[str, float]]:
    """Per stop setting, seconds per token, the median over repeats of each repeat's median step over
    the batch: decode, process, both (their sum, step by step), stream (DecodeStream.step alone); and
    mean (both, each repeat's mean step)."""
    total = warmup + steps
    prompts, outputs = token_windows(text_ids, batch, total, prompt_tokens)
    request_ids = [f"chatcmpl-{uuid.uuid4().hex}" for _ in range(batch)]
    messages = encoded_steps(request_ids, outputs, total)
    samples: dict[str, dict[str, list[float]]] = {"none": {}, "2 stops": {}}
    for _ in range(repeats):  # interleaved, so drift in the machine's load hits every column alike
        for label, stops in (("none", ()), ("2 stops", STOPS)):
            decode, process, record = run_output_processor(tokenizer, prompts, request_ids, messages, stops,
                                                           log_stats, warmup)
            both = [d + p + r for d, p, r in zip(decode, process, record)]
            for key, values in (("decode", decode), ("process", process), ("record", record), ("both", both)):
                samples[label].setdefault(key, []).append(statistics.median(values) / batch)
            samples[label].setdefault("mean", []).append(statistics.fmean(both) / batch)
        stream = statistics.median(run_decode_stream(tokenizer, prompts, outputs, warmup)) / batch
        for label in samples:
            samples[label].setdefault("stream", []).append(stream)
    return {label: {key: statistics.median(values) for key, values in columns.items()}
            for label, columns in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_token_run_arguments(parser, WARMUP_STEPS, PROMPT_TOKENS)
    parser.add_argument("--no-log-stats", action="store_true", help="as `vllm serve --disable-log-stats`")
    args = parser.parse_args()

    import msgspec
    import tokenizers
    import transformers
    import vllm
    from vllm import envs

    tokenizer = load_tokenizer(args.tokenizer)
    text_ids = sample_ids(tokenizer, args.tokenizer, args.ids)
    log_stats = not args.no_log_stats
    print(f"vLLM {vllm.__version__} (tokenizers {tokenizers.__version__}, transformers {transformers.__version__}, "
          f"msgspec {msgspec.__version__}), Python {platform.python_version()}, {cpu_name()}")
    print(f"tokenizer {args.tokenizer} ({len(tokenizer)} tokens), sample {len(text_ids)} tokens; prompts "
          f"{args.prompt_tokens} tokens, {args.warmup} + {args.steps} steps, median of {args.repeats}; "
          f"log_stats {log_stats}, output chunks of {envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE}; stops {list(STOPS)}")
    print("us per token:  batch  stops    decode  process   record     both   (mean)  (ms/step)   DecodeStream.step")
    results = {}
    for batch in args.sizes:
        results[batch] = measure(tokenizer, text_ids, batch, args.steps, args.warmup, args.repeats,
                                 args.prompt_tokens, log_stats)
        for label, row in results[batch].items():
            print(f"               {batch:5d}  {label:7s} {row['decode'] * 1e6:7.2f}  {row['process'] * 1e6:7.2f}  "
                  f"{row['record'] * 1e6:7.2f}  {row['both'] * 1e6:7.2f}  ({row['mean'] * 1e6:5.2f})  "
                  f"({row['both'] * batch * 1e3:7.3f})   {row['stream'] * 1e6:7.2f}",
                  flush=True)
    summary = [f"batch {b}: {results[b]['none']['both'] * 1e6:.2f} us (no stops), "
               f"{results[b]['2 stops']['both'] * 1e6:.2f} us (2 stops)" for b in (32, 128) if b in results]
    if summary:
        print(f"vLLM {vllm.__version__} API server, decode + process_outputs + record per token: "
              + "; ".join(summary))


if __name__ == "__main__":
    main()
