"""SGLang's front-end CPU time per streamed token: its own DetokenizerManager and TokenizerManager, on this CPU.

Each step of SGLang's scheduler sends the DetokenizerManager process one `BatchTokenIDOutput`
(managers/io_struct.py), built by `SchedulerOutputStreamer.stream_output` (managers/scheduler_components/
output_streamer.py; `_GenerationStreamAccumulator.accept` per request: its new token ids since the last
send from `Req.init_incremental_detokenize`, the read offset, the detokenizing flags, the token counts,
and the request's `SchedulerReqTimeStats`, pickled). The DetokenizerManager's `event_loop` receives it
(`sock_recv`), hands it to its dispatcher, whose `handle_batch_token_id_out` decodes incrementally
(`_decode_batch_token_id_output`: two `_grouped_batch_decode`s, the surrounding and the read window, each
the tokenizer's `batch_decode` over the batch) and returns one `BatchStrOutput` with each request's new
text, which it sends (`sock_send`) to the TokenizerManager in the HTTP server's process. There
`handle_loop` receives it (`async_sock_recv`) and awaits `_handle_batch_output`: per request its
meta_info, the out dict, `state.out_list.append`, and `state.event.set()` for every 16 requests
(batch_notify_size) with an `asyncio.sleep(0)` between groups. This script runs both processes' share
of that path with SGLang's own code and no GPU, no scheduler, no sockets: real `Req` objects step by
step through SGLang's own `SchedulerOutputStreamer`, each step's message encoded beforehand as the
scheduler's process encodes it, then decoded and handled in the timed loops.

The IPC encoding is SGLANG_USE_PICKLE_IPC's (environ.py; io_struct.py reads it at import into
`_USE_PICKLE_IPC`): on by default in SGLang 0.5.23, so `sock_send` is pyzmq's `send_pyobj` (pickle.dumps,
highest protocol) and `sock_recv` its `recv_pyobj` (pickle.loads), which rebuild each msgspec struct by
keyword (msgspec's `rebuild`: the class called with a dict of its 53 or 48 fields) and every request's
time stats inside it, at every hop; with SGLANG_USE_PICKLE_IPC=0 they are io_struct's `msgpack_encode`
/ `msgpack_decode` (msgspec), the time stats then pickled once in a `PickleWrapper` (`wrap_as_pickle`)
that the DetokenizerManager passes on and the TokenizerManager unpickles (`unwrap_from_pickle`, inside
`_handle_batch_output`). Rows: "pickle" (the default) and "msgpack", interleaved; with --metrics also
"metrics" (pickle, --enable-metrics: each request's scheduler time stats then carry their timestamps,
and the TokenizerManager adds them to meta_info and observes each request's time to first token, then
its inter-token latency, on its own TokenizerMetricsCollector with Prometheus in multiprocess mode, as
SGLang's launcher runs it).

Each sequence's prompt is a window of `--prompt-tokens` tokens of a mixed sample text (English prose,
Chinese, code, emoji) as the tokenizer encodes it, and its output the text's next tokens, one per
scheduler step: a streaming chat request (GenerateReqInput stream=True, no logprobs, default sampling
params: skip_special_tokens and spaces_between_special_tokens on, no stop strings), registered with the
TokenizerManager by its own `_init_req_state`; every sequence runs all its steps. Otherwise SGLang's
defaults throughout (its ServerArgs' defaults projected into its config namespaces): metrics off
(ServerArgs' enable_metrics is False unless --enable-metrics; the time stats then pickle an empty state),
incremental_streaming_output off (the out dict's text is left for the request's task to join),
stream_interval 1, batch_notify_size 16, batch tokenizer decode on, no tool parser, no tracing. Per batch
size, `--warmup` steps then `--steps` steps are run `--repeats` times (fresh Reqs, managers and request
states each time). Each step is timed; a repeat's figure is its median step over the batch, and the
table shows the median over repeats, in microseconds per token, of:

  recv      DetokenizerManager: the BatchTokenIDOutput's bytes decoded as `sock_recv` decodes them
  detok     DetokenizerManager: its `_request_dispatcher` on it (`handle_batch_token_id_out`)
  send      DetokenizerManager: the returned BatchStrOutput encoded as `sock_send` encodes it
  all       the DetokenizerManager's recv + detok + send, step by step
  recv      TokenizerManager: those bytes decoded as `async_sock_recv` decodes them
  handle    TokenizerManager: `_handle_batch_output` on the BatchStrOutput (awaited in one event loop)
  all       the TokenizerManager's recv + handle, step by step
  both      the two processes' sum, step by step: the front end's CPU time per token
  (mean)    both, with each repeat's mean step instead of its median: it keeps the rare long steps

The two processes run on their own cores in a server, so per step they overlap; the sum is the CPU
time, not the latency. The step's median, not its mean, is the headline because on a shared machine
one preempted step adds milliseconds; a step of one sequence carries the step's fixed work (with pickle,
each message's fifty-odd fields rebuilt by keyword at each hop), which larger batches spread over more
tokens.

Run it with SGLang importable (it imports without a GPU; the script does not import tokenpath), here
with vllm_output_processor.py's environment (torch, transformers, pyzmq, msgspec) and SGLang unpacked
beside it:

    /tmp/vllm-venv/bin/pip install --no-deps --target /tmp/sgl/pkg sglang==0.5.23
    /tmp/vllm-venv/bin/pip install --target /tmp/sgl/deps orjson psutil ipython apache-tvm-ffi typing_extensions
    PYTHONPATH=/tmp/sgl/pkg:/tmp/sgl/deps /tmp/vllm-venv/bin/python benchmarks/sglang_output_path.py \\
        --tokenizer TOKENIZER_JSON [--ids IDS_JSON] [--sizes 1 8 32 128 256] [--steps 200] [--repeats 5] \\
        [--metrics] [--json PATH]

TOKENIZER_JSON is a Hugging Face tokenizer.json, loaded as transformers' PreTrainedTokenizerFast (what
SGLang's `get_tokenizer` returns for a fast tokenizer; its post-load fixes do not touch decoding).
Without --ids the script encodes its own sample text with it. tokenpath's exports of the Mistral
tokenizers (tokenpath.delivery.hf_export) have no BPE merges and only decode correctly, so they come with
the ids of tokenpath's sample text as the original tokenizer encodes it; in tokenpath's environment,
from the repository root:

    mkdir -p /tmp/sgl_op && python -c "
    import json
    from tokenpath.delivery import Detokenizer
    from tokenpath.delivery.hf_export import to_hf_tokenizer
    from tokenpath.delivery.sample_text import MIXED
    for name, out in [(None, 'tekken'), ('tokenizer.model.v1', 'spm_v1')]:
        det = Detokenizer.load(name)
        to_hf_tokenizer(det).save(f'/tmp/sgl_op/{out}.tokenizer.json')
        json.dump(det.encode(MIXED), open(f'/tmp/sgl_op/{out}.ids.json', 'w'))"
    PYTHONPATH=/tmp/sgl/pkg:/tmp/sgl/deps /tmp/vllm-venv/bin/python benchmarks/sglang_output_path.py \\
        --tokenizer /tmp/sgl_op/tekken.tokenizer.json --ids /tmp/sgl_op/tekken.ids.json

Not included: the ZeroMQ send and receive themselves (the bytes are handed over in memory), the
scheduler's own work (building and encoding the message, untimed here), the two loops' watchdog feeds
and the TokenizerManager's receive timestamp, the tasks `asyncio.sleep(0)` lets run (only the yields
are timed), each request's generate() task (`_stream_one_response`: taking the out list, joining the
text with `ReqState.get_text`, done here untimed) and everything after it in the OpenAI serving layer
(the delta text, chunk building, JSON, SSE framing, the HTTP write), logprobs (not requested), adding
and finishing requests (the first message, with each request's prompt tail, falls in the warmup), the
prefix cache's breakdown (no cached tokens), and parallel sampling (n = 1). Each process runs on whatever
core the OS gives it; the machine may be shared, hence the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import time
import uuid
from array import array
from pathlib import Path

from engine_bench_common import add_token_run_arguments, cpu_name, load_tokenizer, sample_ids, token_windows

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WARMUP_STEPS = 20
PROMPT_TOKENS = 256
# Row label: (IPC path, metrics). SGLANG_USE_PICKLE_IPC on (SGLang's default) and off; --enable-metrics.
VARIANTS = {"pickle": ("pickle", False), "msgpack": ("msgpack", False)}
METRICS_VARIANT = {"metrics": ("pickle", True)}
COLUMNS = ("recv", "detok", "send", "api_recv", "handle", "detok_process", "api_server", "both")
def publish_defaults() -> None:
    """SGLang's config namespaces (get_serving(), get_observability(), ...) from ServerArgs' defaults, as
    `publish` installs them in each process, less the resolution pass (it reads the model's config; of
    the fields read here it sets only served_model_name, to the model path, a metrics label), and the two
    ranks the output path reads, as `publish` writes them for a server with no data-parallel controller."""
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.server_args import ServerArgs

    get_context().set_server_args(ServerArgs(model_path="model", served_model_name="model"))
    get_parallel().override_permanently(dp_rank=None, attn_tp_rank=0)


def set_ipc(path: str) -> None:
    """SGLANG_USE_PICKLE_IPC as io_struct reads it at import; its wrap/unwrap and sock helpers read the
    module global at each call."""
    from sglang.srt.managers import io_struct

    io_struct._USE_PICKLE_IPC = path == "pickle"


def ipc_codec(path: str):
    """(encode, decode) of one message as SGLang's sock_send and sock_recv do on `path`: pyzmq's
    send_pyobj / recv_pyobj (pickle) or io_struct's msgpack_encode / msgpack_decode."""
    import pickle

    from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode

    if path == "pickle":
        return (lambda obj: pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)), pickle.loads
    return msgpack_encode, msgpack_decode


def scheduler_messages(tokenizer, prompts: list[list[int]], outputs: list[list[int]], rids: list[str],
                       total_steps: int, path: str, metrics: bool) -> list[bytes]:
    """Each scheduler step's BatchTokenIDOutput, built by SGLang's SchedulerOutputStreamer.stream_output
    over real Req objects (one new token each a step, as the first prefill step and the decode steps
    leave them) and encoded as the scheduler's process sends it on `path`. With `metrics`, each request's
    SchedulerReqTimeStats carries what a scheduler with --enable-metrics stamps before the first output
    (its __getstate__ then pickles them; without, an empty state)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    encode, _ = ipc_codec(path)

    class Sent:  # the scheduler's SenderWrapper, less the socket: sock_send's encoding
        def __init__(self) -> None:
            self.messages: list[bytes] = []

        def send_output(self, output, recv_obj=None) -> None:
            self.messages.append(encode(output))

    sent = Sent()
    streamer = SchedulerOutputStreamer(
        send_to_detokenizer=sent,
        tree_cache=None,  # read only for cached tokens' breakdown (none here)
        server_args=None,  # likewise
        is_generation=True,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_hicache_storage=lambda: False,
    )
    reqs = []
    for rid, prompt in zip(rids, prompts):
        params = SamplingParams(max_new_tokens=1_000_000)  # the chat request's defaults
        params.normalize(tokenizer)  # as TokenizerManager._create_tokenized_object does
        params.verify(len(tokenizer))
        req = Req(rid, "", array("q", prompt), params, stream=True, vocab_size=len(tokenizer))
        req.tokenizer = tokenizer  # as Scheduler.handle_generate_request sets it
        if metrics:
            stats, now = req.time_stats, time.perf_counter()
            stats.enable_metrics = True  # Req.__init__'s set_metrics_collector, given the scheduler's collector
            stats.storage_prefetch_wait_s = stats.storage_staging_wait_s = 0.0  # set_wait_queue_entry_time
            stats.wait_queue_entry_time = now - 0.002  # likewise
            stats.forward_entry_time = now - 0.001  # set_forward_entry_time
            stats.queue_duration_s = 0.001  # likewise
            stats.prefill_finished_time = now  # set_prefill_finished_time
        reqs.append(req)
    for k in range(total_steps):
        for req, out in zip(reqs, outputs):
            req.output_ids.append(out[k])
        streamer.stream_output(reqs, False)  # the decode batch's return_logprob
    assert len(sent.messages) == total_steps
    return sent.messages


def detokenizer_manager(tokenizer):
    """A DetokenizerManager without its __init__ (no sockets, no watchdog): the attributes its
    dispatcher's handler reads, as its init_tokenizer and init_running_status set them."""
    from sglang.srt.managers.detokenizer_manager import (
        DETOKENIZER_MAX_STATES,
        DetokenizerManager,
        LimitedCapacityDict,
    )
    from sglang.srt.parser.response_template import tool_close_token_ids
    from sglang.srt.runtime_context import get_serving

    manager = object.__new__(DetokenizerManager)
    manager.tokenizer = tokenizer  # init_tokenizer: get_tokenizer(...)
    manager.vocab_size = len(tokenizer)  # init_tokenizer
    manager.decode_status = LimitedCapacityDict(capacity=DETOKENIZER_MAX_STATES)  # init_running_status
    manager.disable_tokenizer_batch_decode = get_serving().disable_tokenizer_batch_decode  # likewise
    manager.is_tool_call_parser_gpt_oss = get_serving().tool_call_parser == "gpt-oss"  # likewise
    parser = get_serving().tool_call_parser  # None by default: tool_close_token_ids answers an empty set
    manager.tool_close_token_ids = tool_close_token_ids(parser, tokenizer) if parser else frozenset()  # likewise
    manager.init_request_dispatcher()  # its own: the TypeBasedDispatcher event_loop calls
    return manager


_METRICS_COLLECTOR = []  # one TokenizerMetricsCollector a process: Prometheus names register once


def tokenizer_manager(prompts: list[list[int]], rids: list[str], metrics: bool):
    """A TokenizerManager without its __init__ (no sockets, model config or tokenizer): the attributes
    _handle_batch_output reads, as its __init__ and init_* methods set them, and one ReqState per
    sequence registered by its own _init_req_state, as generate_request registers a streaming chat
    request. With `metrics`, as --enable-metrics: its TokenizerMetricsCollector, as
    init_metric_collector_watchdog makes it (Prometheus in multiprocess mode, as SGLang's launcher sets
    PROMETHEUS_MULTIPROC_DIR)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.runtime_context import get_disagg, get_lora, get_observability, get_schedule, get_serving

    manager = object.__new__(TokenizerManager)
    manager.enable_metrics = metrics  # __init__: get_observability().enable_metrics (False by default)
    if metrics:
        if not _METRICS_COLLECTOR:
            from sglang.srt.observability.metrics_collector import (
                TokenizerMetricsCollector,
                tokenizer_metric_labels,
            )

            observability = get_observability()
            _METRICS_COLLECTOR.append(TokenizerMetricsCollector(
                server_args=None, labels=tokenizer_metric_labels(),
                bucket_time_to_first_token=observability.bucket_time_to_first_token,
                bucket_e2e_request_latency=observability.bucket_e2e_request_latency,
                bucket_inter_token_latency=observability.bucket_inter_token_latency))
        manager.metrics_collector = _METRICS_COLLECTOR[0]  # init_metric_collector_watchdog
        manager.enable_priority_scheduling = get_schedule().enable_priority_scheduling  # collect_metrics reads it
    manager.incremental_streaming_output = get_serving().incremental_streaming_output  # __init__
    manager.enable_lora = get_lora().enable_lora  # __init__
    manager.enable_trace = get_observability().enable_trace  # __init__
    manager.skip_tokenizer_init = get_serving().skip_tokenizer_init  # __init__
    manager.crash_dump_folder = get_observability().crash_dump_folder  # __init__
    manager.rid_to_state = {}  # init_running_status
    manager.dump_requests_folder = ""  # init_request_logging_and_dumping
    manager.disaggregation_mode = DisaggregationMode(get_disagg().disaggregation_mode)  # init_disaggregation
    for rid, prompt in zip(rids, prompts):
        obj = GenerateReqInput(input_ids=prompt, sampling_params={}, stream=True, rid=rid,
                               received_time=time.perf_counter())
        obj.normalize_batch_and_arguments()  # generate_request's first step
        manager._init_req_state(obj)
    return manager


def run_detokenizer(tokenizer, messages: list[bytes], path: str,
                    warmup: int) -> tuple[list[bytes], dict[str, list[float]]]:
    """The DetokenizerManager's event_loop over the messages, each step timed after `warmup`: its
    BatchStrOutputs' bytes and the seconds of recv, detok and send."""
    encode, decode = ipc_codec(path)
    manager = detokenizer_manager(tokenizer)
    dispatch = manager._request_dispatcher
    sent, seconds = [], {"recv": [], "detok": [], "send": []}
    gc.collect()
    for k, data in enumerate(messages):
        start = time.perf_counter()
        recv_obj = decode(data)
        received = time.perf_counter()
        output = dispatch(recv_obj)
        handled = time.perf_counter()
        out = encode(output)
        done = time.perf_counter()
        sent.append(out)
        if k >= warmup:
            seconds["recv"].append(received - start)
            seconds["detok"].append(handled - received)
            seconds["send"].append(done - handled)
    return sent, seconds


def run_tokenizer_manager(prompts: list[list[int]], rids: list[str], messages: list[bytes], path: str,
                          metrics: bool, warmup: int) -> dict[str, list[float]]:
    """The TokenizerManager's handle_loop over the detokenizer's messages, in one event loop, each step
    timed after `warmup`: the seconds of api_recv and handle. Between steps each request's generate()
    task takes its output as _stream_one_response does (untimed)."""
    _, decode = ipc_codec(path)
    manager = tokenizer_manager(prompts, rids, metrics)
    states = list(manager.rid_to_state.values())
    seconds: dict[str, list[float]] = {"api_recv": [], "handle": []}

    async def loop() -> None:
        gc.collect()
        for k, data in enumerate(messages):
            start = time.perf_counter()
            recv_obj = decode(data)
            received = time.perf_counter()
            await manager._handle_batch_output(recv_obj)
            done = time.perf_counter()
            if k >= warmup:
                seconds["api_recv"].append(received - start)
                seconds["handle"].append(done - received)
            for state in states:  # _stream_one_response's drain, for a non-incremental stream
                out_list, state.out_list = state.out_list, []
                state.event.clear()
                out = out_list[-1]
                if out["text"] is None:
                    out["text"] = state.get_text()

    asyncio.run(loop())
    return seconds


def measure(tokenizer, text_ids: list[int], batch: int, steps: int, warmup: int, repeats: int,
            prompt_tokens: int, variants: dict[str, tuple[str, bool]]) -> dict[str, dict[str, float]]:
    """Per variant (IPC path, metrics), seconds per token, the median over repeats of each repeat's median
    step over the batch, of each column (the sums step by step); and mean (both, each repeat's mean step)."""
    total = warmup + steps
    prompts, outputs = token_windows(text_ids, batch, total, prompt_tokens)
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in variants}
    for _ in range(repeats):  # interleaved, so drift in the machine's load hits every row alike
        for label, (path, metrics) in variants.items():
            set_ipc(path)
            rids = [uuid.uuid4().hex for _ in range(batch)]
            messages = scheduler_messages(tokenizer, prompts, outputs, rids, total, path, metrics)
            str_messages, detok = run_detokenizer(tokenizer, messages, path, warmup)
            api = run_tokenizer_manager(prompts, rids, str_messages, path, metrics, warmup)
            steps_s = {**detok, **api}
            steps_s["detok_process"] = [a + b + c for a, b, c in zip(detok["recv"], detok["detok"], detok["send"])]
            steps_s["api_server"] = [a + b for a, b in zip(api["api_recv"], api["handle"])]
            steps_s["both"] = [a + b for a, b in zip(steps_s["detok_process"], steps_s["api_server"])]
            for key in COLUMNS:
                samples[label].setdefault(key, []).append(statistics.median(steps_s[key]) / batch)
            samples[label].setdefault("mean", []).append(statistics.fmean(steps_s["both"]) / batch)
    set_ipc("pickle")
    return {label: {key: statistics.median(values) for key, values in columns.items()}
            for label, columns in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_token_run_arguments(parser, WARMUP_STEPS, PROMPT_TOKENS)
    parser.add_argument("--metrics", action="store_true", help="also a row with --enable-metrics (pickle IPC)")
    parser.add_argument("--json", dest="json_path", help="also write the table to this JSON file")
    args = parser.parse_args()
    if args.metrics:  # as SGLang's launcher does before any process imports prometheus_client
        import tempfile

        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="sglang_prometheus_"))

    import msgspec
    import sglang
    import tokenizers
    import transformers
    from sglang.srt.environ import envs

    publish_defaults()
    from sglang.srt.runtime_context import get_observability, get_serving

    default_ipc = "pickle" if envs.SGLANG_USE_PICKLE_IPC.get() else "msgpack"
    tokenizer = load_tokenizer(args.tokenizer)
    text_ids = sample_ids(tokenizer, args.tokenizer, args.ids)
    variants = {**VARIANTS, **(METRICS_VARIANT if args.metrics else {})}
    print(f"SGLang {sglang.__version__} (tokenizers {tokenizers.__version__}, transformers "
          f"{transformers.__version__}, msgspec {msgspec.__version__}), Python {platform.python_version()}, "
          f"{cpu_name()}")
    print(f"tokenizer {args.tokenizer} ({len(tokenizer)} tokens), sample {len(text_ids)} tokens; prompts "
          f"{args.prompt_tokens} tokens, {args.warmup} + {args.steps} steps, median of {args.repeats}; "
          f"IPC default {default_ipc} (SGLANG_USE_PICKLE_IPC), enable_metrics "
          f"{get_observability().enable_metrics}, incremental_streaming_output "
          f"{get_serving().incremental_streaming_output}, batch_notify_size {get_serving().batch_notify_size}")
    print("us per token:        DetokenizerManager           TokenizerManager")
    print("          batch  row     recv   detok    send    all    recv  handle    all     both   (mean)  (ms/step)")
    results = {}
    for batch in args.sizes:
        results[batch] = measure(tokenizer, text_ids, batch, args.steps, args.warmup, args.repeats,
                                 args.prompt_tokens, variants)
        for label, row in results[batch].items():
            us = {key: value * 1e6 for key, value in row.items()}
            print(f"          {batch:5d}  {label:7s} {us['recv']:5.2f}  {us['detok']:6.2f}  {us['send']:6.2f}  "
                  f"{us['detok_process']:6.2f}  {us['api_recv']:5.2f}  {us['handle']:6.2f}  "
                  f"{us['api_server']:6.2f}  {us['both']:7.2f}  ({us['mean']:6.2f})  "
                  f"({row['both'] * batch * 1e3:7.3f})", flush=True)
    summary = [f"batch {b}: {results[b][default_ipc]['detok_process'] * 1e6:.2f} + "
               f"{results[b][default_ipc]['api_server'] * 1e6:.2f} = {results[b][default_ipc]['both'] * 1e6:.2f} us"
               for b in (32, 128) if b in results]
    if summary:
        print(f"SGLang {sglang.__version__} front end ({default_ipc} IPC), detokenizer + API server per token: "
              + "; ".join(summary))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "sglang": sglang.__version__, "tokenizer": args.tokenizer, "cpu": cpu_name(),
            "python": platform.python_version(), "default_ipc": default_ipc,
            "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
            "prompt_tokens": args.prompt_tokens, "unit": "seconds per token",
            "results": {str(b): rows for b, rows in results.items()}}, indent=2) + "\n")


if __name__ == "__main__":
    main()
