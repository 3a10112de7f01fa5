"""SGLang's API-server CPU time per streaming chat request before its scheduler sees it, on this CPU.

A chat request reaches SGLang's HTTP server (entrypoints/http_server.py) at `openai_v1_chat_completions`,
an `ORJSONRoute`: FastAPI's request handler checks the content type, reads the body as JSON (the route's
`ORJSONRequest.json`: orjson.loads) and validates it into the OpenAI protocol's `ChatCompletionRequest`
(entrypoints/openai/protocol.py; `request_body_to_args` on the route's body field, pydantic). The route
awaits `OpenAIServingChat.handle_request` (serving_base.py): `_validate_request`, then, in the event
loop's default executor, `_convert_to_internal_request` (serving_chat.py): the header opt-ins,
`_process_messages` (the reasoning and tool checks, then `_apply_jinja_template`: each message
model_dump'ed and deep-copied, its content put in the template's format, and
`_render_and_encode_chat_template`: `tokenizer.apply_chat_template(..., tokenize=False)` renders the
prompt, `parallel_prompt_encode` tokenizes it with `tokenizer.encode(prompt, add_special_tokens=False)`
below 32,768 characters), `request.to_sampling_params` and the `GenerateReqInput`, its `input_ids` the
prompt's ids. `_handle_streaming_request` then starts `_generate_chat_stream`, which iterates
`TokenizerManager.generate_request` (managers/tokenizer_manager.py): `normalize_batch_and_arguments`
(the request id), `_set_default_priority`, `_init_req_state` (a `ReqState`, its asyncio.Event and time
stats), the request logger, the pause condition and the weight-update reader lock,
`_validate_and_resolve_lora`, `_tokenize_one_request` (the ids are given, so no tokenizing:
`_validate_one_request`, then `_create_tokenized_object`: the ids into an array("q"), `SamplingParams`
built, `normalize`d and `verify`d, a `TokenizedGenerateReqInput`), and `_send_one_request` (the
transports' preparations, `wrap_pickle_fields`, `_dispatch_to_scheduler`'s `sock_send`), after which it
awaits the scheduler's first output. SGLANG_USE_PICKLE_IPC (environ.py) is on by default, so `sock_send`
is pyzmq's `send_pyobj` (pickle.dumps, highest protocol); off, io_struct's `msgpack_encode` (msgspec), the
time stats pickled into a `PickleWrapper` first.

This script runs that path with SGLang 0.5.23's own code and no GPU, no scheduler, no HTTP server and
no sockets: SGLang's own route object, a TokenizerManager and an OpenAIServingChat built with
object.__new__ and the attributes the path reads (each commented with where SGLang sets it), a
TemplateManager by its own `initialize_templates`, SGLang's `ModelConfig` and `get_tokenizer` on a model
folder the script writes (Llama 3.1 8B Instruct's config.json and generation_config.json), the
TokenizerManager's socket a stand-in that keeps the encoded bytes, and its `_wait_one_response` (which
waits for the scheduler) replaced by a generator that ends at once. Each request goes through every
step in turn, one request after another in one event loop, and each step is timed:

  parse     the content-type check, orjson.loads, `request_body_to_args` (FastAPI's code, the route's field)
  convert   `_validate_request` and `_convert_to_internal_request`, less the two tokenizer calls inside it
  template  `tokenizer.apply_chat_template`, timed where `_render_and_encode_chat_template` calls it
  tokenize  `tokenizer.encode` of the rendered prompt, timed where `parallel_prompt_encode` calls it
  handoff   `generate_request` up to and including the send's encoding (pickle; again with msgpack IPC)

Then each step alone, in a loop of its own (its caches warm from the call before, as tokenpath's
calibration times its figures; in place, the tokenizer's tables and the template engine evict the
Python code's and the other way round): parse; convert with the tokenizer's two calls answered from a
recording (on the instance: SGLang's code runs whole but for them); template and tokenize with the
arguments SGLang passed; handoff; the encoding of the sent TokenizedGenerateReqInput alone, pickle and
msgpack. Also `handle_request`'s hop into the default executor and back (`run_in_executor`, with a
no-op: its wall time and the process's CPU over both threads), and the tokenizer alone on English prose
at `--lengths` prompt tokens, per token and the least-squares slope: the chat path's encode, the
TokenizerManager's own `_tokenize_texts` (`tokenizer([text])`: what a text prompt to /generate takes; the
chat route hands it ids), and, for a Tekken file, mistral-common's Tekkenizer (the library tokenpath's
tokenize_per_token is timed with). Three requests: a system prompt and a question (the common case);
the same with a question of the longest length's tokens of prose; and the system prompt, `--turns`
earlier exchanges and the question (18 messages by default). The body: model, messages, stream true,
max_tokens 256, temperature 0.7, with the headers the openai Python client sends. Per row, `--calls`
requests are run `--repeats` times (cases and rows interleaved, after a warm-up); a repeat's figure is its
median request and the table shows the median over repeats, in microseconds per request (tokenize also
per prompt token). SGLang's defaults throughout (ServerArgs' defaults, which `publish` projects into its
config namespaces): no tool or reasoning parser, logging, metrics and tracing off, no LoRA, a text model,
one tokenizer worker, SGLANG_USE_PICKLE_IPC on; sampling_defaults "model", so the generation config's
temperature and top_p are the request's defaults (its own temperature wins).

The tokenizer: SGLang loads a model's tokenizer.json with transformers (a fast tokenizer: Hugging Face
tokenizers). By default the script converts mistral-common's tekken_240911.json (Tekken, tokenpath's
default tokenizer) into a tokenizer.json that encodes as Tekken does (its ranks, the merges that rebuild
them, its pre-token pattern; the script checks the ids against mistral-common's on the prose) and adds
Llama 3's four chat tokens and BOS post-processor; `--tokenizer` takes a tokenizer.json of your own
instead (tokenpath's hf_export files have no merges and do not encode). The chat template is Llama 3's
(Meta-Llama-3-8B-Instruct's, as published in April 2024, written in this script; tokenpath's embedded
one), set in the folder's tokenizer_config.json, so `get_tokenizer` loads it and the TemplateManager uses
it as the model's own Jinja template.

Run it with SGLang importable (it imports without a GPU; the script does not import tokenpath), here with
vllm_output_processor.py's environment (torch, transformers, pyzmq, msgspec, mistral-common) and SGLang
unpacked beside it, as for sglang_output_path.py, plus the xgrammar its serving_chat.py imports:

    /tmp/vllm-venv/bin/pip install --no-deps --target /tmp/sgl/pkg sglang==0.5.23
    /tmp/vllm-venv/bin/pip install --target /tmp/sgl/deps orjson psutil ipython apache-tvm-ffi typing_extensions
    /tmp/vllm-venv/bin/pip install --no-deps --target /tmp/sgl/deps xgrammar==0.2.7
    PYTHONPATH=/tmp/sgl/pkg:/tmp/sgl/deps /tmp/vllm-venv/bin/python benchmarks/sglang_request_path.py \\
        [--tekken TEKKEN_JSON | --tokenizer TOKENIZER_JSON] [--lengths 128 512 2048] [--turns 8] \\
        [--calls 200] [--repeats 5] [--json PATH]

Not included: the HTTP layer (uvicorn's parsing and access log, the CORS and HTTP-metrics middlewares,
Starlette's routing, reading the body, FastAPI's handler beyond the body's parsing: the
`validate_json_request` dependency, the other parameters, the endpoint's call, the response), which
tokenpath's frontend_per_request times on vLLM's stack; the executor hop inside the request (reported
apart: convert runs here on the loop's thread); `_generate_chat_stream`'s preamble before
`generate_request`; the ZeroMQ send itself and everything on the scheduler's side (its receive and
unpickling); waiting for and streaming the output; the chat template cache (multimodal models only),
parallel prompt encoding (prompts of 32,768 characters and more), tools, reasoning, LoRA, multimodal
inputs, logging, metrics and tracing (all off by default). The process runs on whatever core the OS
gives it; the machine may be shared, hence the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import pickle
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from engine_bench_common import SAMPLE_TEXT, cpu_name

CALLS = 200
LENGTHS = (128, 512, 2048)
TURNS = 8
# meta-llama/Meta-Llama-3-8B-Instruct, tokenizer_config.json, "chat_template" (as published in April 2024).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"
LLAMA3_TOKENS = (BOS, "<|start_header_id|>", "<|end_header_id|>", EOT)
# meta-llama/Llama-3.1-8B-Instruct's config.json (the vocabulary and its token ids are the tokenizer's) and
# generation_config.json.
LLAMA31_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True}
LLAMA31_GENERATION_CONFIG = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}
# The conversation: a system prompt and a question, as most chat requests carry them.
SYSTEM = "You are a helpful assistant. Answer briefly and cite your sources."
QUESTION = ("How long does it take for the first word of an answer to appear after I send a question to a "
            "chat service, and what happens to my request in the meantime?")
ANSWER = ("It usually takes a fraction of a second. Your request is parsed, its messages are rendered into a "
          "prompt and tokenized, and the prompt waits for the model to process it before the first token "
          "comes back.")
# English prose the prompts of the tokenize rows are cut from (repeated as needed): the shared sample's first
# paragraph, then one on the request's own path.
PROSE = SAMPLE_TEXT.split("\n\n")[0] + "\n" + """\
Before any of that, the request itself has to arrive. The server reads the body, checks that it is
JSON, validates every field against the schema of the chat completions interface, renders the
conversation into the model's prompt format, and turns the prompt into token ids. Only after all of
this does the scheduler learn that the request exists, and only then can it be placed into a batch.
For short prompts that front-end work is a small part of the time to the first token, but it is paid
on every request, on the same few cores that also stream every answer back to its reader.
"""


def default_tekken() -> str | None:
    """mistral-common's tekken_240911.json (Mistral NeMo's Tekken, tokenpath's default tokenizer), if installed."""
    import importlib.util

    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "tekken_240911.json"
    return str(path) if path.is_file() else None


def tekken_tokenizer(path: str):
    """A Tekken file as a Hugging Face BPE tokenizer that encodes as Tekken does: its ranks as the vocabulary
    (ids after its special tokens), the merges that rebuild each token from two others in rank order (as
    transformers' TikTokenConverter derives them; ignore_merges, as tiktoken takes a whole pre-token in the
    vocabulary), its pre-token pattern, GPT-2's byte alphabet, and its special tokens as added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    data = json.loads(Path(path).read_text())
    config = data["config"]
    specials_count = config["default_num_special_tokens"]
    entries = data["vocab"][:config["default_vocab_size"] - specials_count]
    ranks = {base64.b64decode(entry["token_bytes"]): entry["rank"] for entry in entries}
    alphabet = bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    merges = []
    for token, rank in ranks.items():
        pairs = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        pairs.sort(key=lambda pair: (ranks[pair[0]], ranks[pair[1]]))
        merges.extend((rank, left, right) for left, right in pairs)
    merges.sort(key=lambda merge: merge[0])
    # Files that list their special tokens name them; older ones (240911) do not: <unk>, <s>, </s> and
    # placeholders (mistral-common names more of them; a name matters only to text that spells it).
    specials = [entry["token_str"] for entry in data.get("special_tokens", [])][:specials_count]
    specials += [f"<SPECIAL_{i}>" for i in range(len(specials), specials_count)]
    if "special_tokens" not in data:
        specials[:3] = ["<unk>", "<s>", "</s>"]
    vocab = {spell(token): rank + specials_count for token, rank in ranks.items()}
    vocab.update({name: i for i, name in enumerate(specials)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[(spell(a), spell(b)) for _, a, b in merges],
                                     fuse_unk=False, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(config["pattern"]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in specials])
    return tokenizer


def model_folder(tokenizer_json: str | None, tekken: str | None) -> tuple[Path, str]:
    """A model folder as SGLang loads one without weights: Llama 3.1 8B Instruct's config.json and
    generation_config.json, and a tokenizer (tokenizer.json, tokenizer_config.json) with Llama 3's chat
    template and its four chat tokens (added where the tokenizer lacks them; with a Tekken file also Llama
    3's BOS post-processor, as Llama 3's tokenizer.json has it). Returns the folder and the tokenizer's origin."""
    from tokenizers import AddedToken, Tokenizer, processors

    if tokenizer_json:
        tokenizer = Tokenizer.from_file(tokenizer_json)
        model = json.loads(tokenizer.to_str()).get("model", {})
        if model.get("type") == "BPE" and not model.get("merges"):
            raise SystemExit(f"{tokenizer_json}: a BPE model with no merges encodes byte by byte; pass a "
                             "tokenizer.json that encodes, or --tekken")
        origin = tokenizer_json
    else:
        tekken = tekken or default_tekken()
        if tekken is None:
            raise SystemExit("no tokenizer: pass --tokenizer TOKENIZER_JSON or --tekken TEKKEN_JSON (mistral-common "
                             "is not installed, so its tekken_240911.json is not at hand)")
        tokenizer = tekken_tokenizer(tekken)
        origin = f"{tekken} (Tekken, converted)"
    missing = [name for name in LLAMA3_TOKENS if tokenizer.token_to_id(name) is None]
    tokenizer.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in missing])
    if not tokenizer_json:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))])
    folder = Path(tempfile.mkdtemp(prefix="sglang_request_path_"))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOT,
        "chat_template": LLAMA3_TEMPLATE, "clean_up_tokenization_spaces": False, "model_max_length": 131072}))
    config = {**LLAMA31_CONFIG, "vocab_size": tokenizer.get_vocab_size(),
              "bos_token_id": tokenizer.token_to_id(BOS), "eos_token_id": tokenizer.token_to_id(EOT)}
    (folder / "config.json").write_text(json.dumps(config))
    generation = {**LLAMA31_GENERATION_CONFIG, "bos_token_id": config["bos_token_id"],
                  "eos_token_id": config["eos_token_id"]}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder, origin


def publish_defaults(folder: Path):
    """SGLang's config namespaces from ServerArgs' defaults for this model folder, as `publish` installs them
    in the HTTP server's process (less the launcher's resolution pass), and the ranks of a server with no
    data-parallel controller."""
    from sglang.srt.runtime_context import get_context, get_parallel
    from sglang.srt.server_args import ServerArgs

    # The launcher's resolution pass sets tokenizer_path to model_path (and served_model_name to it: a label).
    server_args = ServerArgs(model_path=str(folder), tokenizer_path=str(folder), served_model_name="model")
    get_context().set_server_args(server_args)
    get_parallel().override_permanently(dp_rank=None, attn_tp_rank=0)
    return server_args


class Socket:
    """The TokenizerManager's socket to the scheduler, less ZeroMQ: pyzmq's `send_pyobj` is pickle.dumps then
    `send`; `send` keeps the bytes (and the last object, for the encode rows)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.objects: list = []

    def send_pyobj(self, obj, flags: int = 0, protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
        self.objects.append(obj)
        self.send(pickle.dumps(obj, protocol), flags=flags)

    def send(self, data, flags: int = 0) -> None:
        self.sent.append(data)


def tokenizer_manager(server_args, folder: Path):
    """A TokenizerManager without its __init__ (no sockets, no watchdog, no scheduler): the attributes its
    per-request path (generate_request to _send_one_request) reads, as __init__ and its init_* methods set
    them, with SGLang's own ModelConfig and get_tokenizer on the model folder."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.positional_embeds_transport import PositionalEmbedsTransport
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.managers.utils import compute_num_reserved_tokens
    from sglang.srt.runtime_context import (
        get_disagg,
        get_lora,
        get_model,
        get_observability,
        get_schedule,
        get_serving,
    )
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.utils.aio_rwlock import RWLock
    from sglang.srt.utils.cuda_vmm_transport_utils import CudaVmmFeatureTransport
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer
    from sglang.srt.utils.request_logger import RequestLogger

    manager = object.__new__(TokenizerManager)
    manager.server_args = server_args  # __init__
    manager.elastic_worker_count = 1  # __init__: get_parallel().num_dp_ranks (one, no data parallelism)
    manager.enable_metrics = get_observability().enable_metrics  # __init__ (False by default)
    manager.enable_lora = get_lora().enable_lora  # __init__
    manager.enable_trace = get_observability().enable_trace  # __init__
    manager.allow_auto_truncate = get_serving().allow_auto_truncate  # __init__
    manager.skip_tokenizer_init = get_serving().skip_tokenizer_init  # __init__
    manager.preferred_sampling_params = get_serving().preferred_sampling_params  # __init__
    manager.model_path = get_model().model_path  # init_model_config
    manager.served_model_name = get_serving().served_model_name  # init_model_config
    manager.model_config = ModelConfig.from_server_args(server_args)  # init_model_config
    manager.is_generation = manager.model_config.is_generation  # init_model_config
    manager.context_len = manager.model_config.context_len  # init_model_config
    manager.enable_priority_scheduling = get_schedule().enable_priority_scheduling  # init_model_config
    manager.default_priority_value = get_schedule().default_priority_value  # init_model_config
    manager.num_reserved_tokens = compute_num_reserved_tokens()  # init_model_config
    manager.validate_total_tokens = True  # init_model_config
    manager.mm_processor = manager.processor = None  # init_tokenizer_and_processor (a text model)
    manager.tokenizer = get_tokenizer(  # init_tokenizer_and_processor, its own call
        get_serving().tokenizer_path, tokenizer_mode=get_serving().tokenizer_mode,
        trust_remote_code=get_model().trust_remote_code, revision=get_model().revision,
        tokenizer_backend=get_serving().tokenizer_backend)
    manager.async_dynamic_batch_tokenizer = None  # init_tokenizer_and_processor (enable_dynamic_batch_tokenizer off)
    manager.send_to_scheduler = Socket()  # init_ipc_channels: a zmq PUSH socket to the scheduler
    manager.tokenizer_ipc_name = None  # init_ipc_channels (tokenizer_worker_num 1)
    manager.rid_to_state = {}  # init_running_status
    manager.encoder_dispatch_ready = {}  # init_running_status
    manager.event_loop = None  # init_running_status; auto_create_handle_loop sets it on the first request
    manager.asyncio_tasks = set()  # init_running_status
    manager.request_logger = RequestLogger(  # init_request_logging_and_dumping
        log_requests=get_observability().log_requests,
        log_requests_level=get_observability().log_requests_level,
        log_requests_format=get_observability().log_requests_format,
        log_requests_target=get_observability().log_requests_target)
    manager.model_update_lock = RWLock()  # init_weight_update
    manager.is_pause = False  # init_weight_update
    manager.is_pause_cond = asyncio.Condition()  # init_weight_update
    manager.disaggregation_mode = DisaggregationMode(get_disagg().disaggregation_mode)  # init_disaggregation
    manager.fake_bootstrap_room_counter = 0  # init_disaggregation
    manager.sampling_params_class = SamplingParams  # init_request_dispatcher
    manager.positional_embeds_transport = PositionalEmbedsTransport(  # init_positional_embeds_transport
        server_args.base_gpu_id, manager.mm_processor)
    manager.cuda_vmm_feature_transport = CudaVmmFeatureTransport(server_args, manager.mm_processor)  # __init__
    return manager


def serving_chat(manager):
    """The TemplateManager as the launcher makes it (init_tokenizer_manager: initialize_templates, SGLang's
    own, on the tokenizer's template), and an OpenAIServingChat without its __init__: the attributes
    handle_request and _convert_to_internal_request read, each as __init__ sets it (its own methods where
    __init__ calls them)."""
    from collections import OrderedDict

    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import get_model, get_serving

    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=manager, model_path=get_model().model_path,
                                   chat_template=get_serving().chat_template,
                                   completion_template=get_serving().completion_template)
    serving = object.__new__(OpenAIServingChat)
    serving.tokenizer_manager = manager  # OpenAIServingBase.__init__
    serving.allowed_custom_labels = None  # OpenAIServingBase.__init__ (no tokenizer_metrics_allowed_custom_labels)
    serving.template_manager = templates
    serving.tool_call_parser = manager.config_value("tool_call_parser")  # None by default
    serving.reasoning_parser = manager.config_value("reasoning_parser")  # None by default
    serving.default_chat_template_kwargs = get_serving().default_chat_template_kwargs or {}
    serving._reasoning_detector = None  # no reasoning parser
    serving.default_sampling_params = manager.model_config.get_default_sampling_params()  # generation_config's
    model_type = manager.model_config.hf_config.model_type
    serving.is_gpt_oss = model_type == "gpt_oss"
    serving.is_gemma4 = model_type in ("gemma4", "gemma4_unified")
    serving.is_minimax_m3 = model_type == "minimax_m3_vl"
    serving.chat_encoding_spec = serving._resolve_chat_encoding_spec()
    serving.supports_inline_system = serving._resolve_inline_system_support()
    serving._encoding_adapter = serving._build_chat_encoding_adapter()
    serving._response_parser = None
    try:
        serving._tokenizer_auto_adds_specials = len(manager.tokenizer.encode("")) > 0
    except Exception:
        serving._tokenizer_auto_adds_specials = True
    serving._prompt_text_round_trip_is_lossy = serving._probe_prompt_text_round_trip()
    serving._template_reads_reasoning_content = serving._chat_template_reads_reasoning_content()
    serving._chat_template_cache = OrderedDict()
    return serving, templates


def conversations(tokenizer, long_tokens: int, turns: int) -> dict[str, list[dict[str, str]]]:
    """The requests' messages: a system prompt and a question; the same with a question of `long_tokens`
    tokens of prose; and a conversation of `turns` earlier exchanges before the question."""
    long_text = prose(tokenizer, long_tokens)
    earlier = [message for _ in range(turns) for message in
               ({"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER})]
    system = {"role": "system", "content": SYSTEM}
    return {"chat": [system, {"role": "user", "content": QUESTION}],
            f"{long_tokens}-token question": [system, {"role": "user", "content": long_text}],
            f"{turns} earlier turns": [system, *earlier, {"role": "user", "content": QUESTION}]}


def prose(tokenizer, tokens: int) -> str:
    """English prose of `tokens` tokens (PROSE repeated, cut at a token)."""
    ids = tokenizer.encode(PROSE * (tokens // 150 + 2), add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def request_body(messages: list[dict[str, str]]) -> bytes:
    """A streaming chat-completions body as a client sends it."""
    return json.dumps({"model": "model", "messages": messages, "stream": True, "max_tokens": 256,
                       "temperature": 0.7}).encode()


# The headers of the openai Python client's request (openai 1.x over httpx), as uvicorn puts them in the scope.
HEADERS = (("host", "127.0.0.1:30000"), ("accept-encoding", "gzip, deflate"), ("connection", "keep-alive"),
           ("accept", "application/json"), ("content-type", "application/json"), ("user-agent", "OpenAI/Python 1.99.9"),
           ("x-stainless-lang", "python"), ("x-stainless-package-version", "1.99.9"), ("x-stainless-os", "Linux"),
           ("x-stainless-arch", "x64"), ("x-stainless-runtime", "CPython"), ("x-stainless-runtime-version", "3.12.3"),
           ("authorization", "Bearer EMPTY"), ("x-stainless-async", "false"), ("x-stainless-retry-count", "0"),
           ("x-stainless-read-timeout", "600"))


def http_request(body: bytes):
    """The request as SGLang's route handler gets it: an ORJSONRequest (ORJSONRoute's) over the ASGI scope,
    its body already read (Starlette's `body()` caches it; reading it is the HTTP layer's)."""
    from sglang.srt.entrypoints.http_server import ORJSONRequest

    headers = [(name.encode(), value.encode()) for name, value in HEADERS]
    headers.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 30000)}
    request = ORJSONRequest(scope)
    request._body = body
    return request


def chat_route():
    """SGLang's own `POST /v1/chat/completions` route (http_server.py's app, an ORJSONRoute)."""
    from sglang.srt.entrypoints.http_server import app

    return next(route for route in app.routes if getattr(route, "path", None) == "/v1/chat/completions"
                and "POST" in route.methods)


async def parse(route, raw) -> object:
    """The body into SGLang's ChatCompletionRequest as FastAPI's request handler does it for the route
    (fastapi/routing.py get_request_handler: the content type checked with email.message, `request.json()`,
    here ORJSONRequest's orjson.loads; then solve_dependencies' `request_body_to_args` on the route's body
    field: pydantic's validation)."""
    import email.message

    from fastapi.dependencies.utils import request_body_to_args

    json_body = None
    content_type_value = raw.headers.get("content-type")
    message = email.message.Message()
    message["content-type"] = content_type_value
    if message.get_content_maintype() == "application":
        subtype = message.get_content_subtype()
        if subtype == "json" or subtype.endswith("+json"):
            json_body = await raw.json()
    values, errors = await request_body_to_args(body_fields=route.dependant.body_params, received_body=json_body,
                                                embed_body_fields=route._embed_body_fields)
    assert not errors, errors
    return values["request"]


class InnerTimer:
    """The tokenizer's apply_chat_template and encode wrapped on the instance, so that each call SGLang
    makes is timed where it runs, inside _convert_to_internal_request (the wrapper's own perf_counter calls,
    a fraction of a microsecond, fall to convert); keeps each call's arguments."""

    NAMES = ("apply_chat_template", "encode")

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.seconds: dict[str, list[float]] = {name: [] for name in self.NAMES}
        self.last: dict[str, tuple] = {}

    def __enter__(self):
        for name in self.NAMES:
            def call(*args, _real=getattr(self.tokenizer, name), _name=name, **kwargs):
                start = time.perf_counter()
                out = _real(*args, **kwargs)
                self.seconds[_name].append(time.perf_counter() - start)
                self.last[_name] = (args, kwargs, out)
                return out
            setattr(self.tokenizer, name, call)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.NAMES:
            self.tokenizer.__dict__.pop(name, None)


class Answered:
    """The tokenizer's apply_chat_template and encode answered, on the instance, with a conversation's
    recorded results: _convert_to_internal_request then runs all of its own code but those two calls."""

    def __init__(self, tokenizer, calls: dict[str, tuple]) -> None:
        self.tokenizer, self.calls = tokenizer, calls

    def __enter__(self):
        for name, (_, _, out) in self.calls.items():
            setattr(self.tokenizer, name, lambda *args, _out=out, **kwargs: _out)
        return self

    def __exit__(self, *exc) -> None:
        for name in self.calls:
            self.tokenizer.__dict__.pop(name, None)


def convert(serving, request, raw):
    """handle_request's work before the TokenizerManager (serving_base.py): the received time,
    `_validate_request`, `_convert_to_internal_request` (which the server runs in the loop's default
    executor), the received time set on the GenerateReqInput."""
    from sglang.srt.observability.req_time_stats import monotonic_time

    received_time = monotonic_time()
    error = serving._validate_request(request)
    assert error is None, error
    adapted, _ = serving._convert_to_internal_request(request, raw)
    adapted.received_time = received_time
    return adapted


def set_ipc(path: str) -> None:
    """SGLANG_USE_PICKLE_IPC as io_struct reads it at import; wrap_as_pickle and sock_send read the global."""
    from sglang.srt.managers import io_struct

    io_struct._USE_PICKLE_IPC = path == "pickle"


def encode_msgpack(obj) -> bytes:
    """The message as sock_send encodes it with SGLANG_USE_PICKLE_IPC=0: _send_one_request's
    wrap_pickle_fields (the time stats pickled into a PickleWrapper), then msgpack_encode."""
    from sglang.srt.managers.io_struct import msgpack_encode

    time_stats = obj.time_stats
    obj.wrap_pickle_fields()
    try:
        return msgpack_encode(obj)
    finally:
        obj.time_stats = time_stats


def timed(calls, run) -> list[float]:
    """Seconds of each `run(x)` over `calls`."""
    seconds = []
    gc.collect()
    for x in calls:
        start = time.perf_counter()
        run(x)
        seconds.append(time.perf_counter() - start)
    return seconds


async def timed_async(calls, run) -> list[float]:
    seconds = []
    gc.collect()
    for x in calls:
        start = time.perf_counter()
        await run(x)
        seconds.append(time.perf_counter() - start)
    return seconds


def _noop() -> None:
    return None


async def offload(count: int) -> tuple[list[float], list[float]]:
    """handle_request's hop into the loop's default executor and back (`loop.run_in_executor`, which
    _convert_to_internal_request runs in), with a no-op: each hop's wall seconds, and the process's CPU
    seconds over all of them (both threads), as a mean, in a list of one."""
    loop = asyncio.get_running_loop()
    seconds = []
    gc.collect()
    cpu = time.process_time()
    for _ in range(count):
        start = time.perf_counter()
        await loop.run_in_executor(None, _noop)
        seconds.append(time.perf_counter() - start)
    return seconds, [(time.process_time() - cpu) / count]


class Bench:
    """What the request path needs in one process: SGLang's route and managers, each conversation's body."""

    def __init__(self, manager, serving, cases: dict[str, list[dict[str, str]]]) -> None:
        self.manager, self.serving, self.tokenizer = manager, serving, manager.tokenizer
        self.route = chat_route()
        self.bodies = {case: request_body(messages) for case, messages in cases.items()}
        self.calls: dict[str, dict[str, tuple]] = {}  # per case, the tokenizer calls its conversion makes

    async def generate(self, obj, raw) -> None:
        """TokenizerManager.generate_request up to the request's send (its _wait_one_response, which awaits
        the scheduler's first output, replaced on the instance by a generator that ends at once)."""
        async for _ in self.manager.generate_request(obj, raw):
            pass

    async def requests(self, case: str, count: int, path: str) -> tuple[dict[str, list[float]], list]:
        """`count` requests of a case, one after another, each through parse, convert and the
        TokenizerManager to its send, with SGLANG_USE_PICKLE_IPC's `path`: each step's seconds per request,
        and the messages sent (pickle: the TokenizedGenerateReqInputs)."""
        set_ipc(path)
        socket = self.manager.send_to_scheduler
        socket.objects.clear()
        socket.sent.clear()
        raws = [http_request(self.bodies[case]) for _ in range(count)]
        steps: dict[str, list[float]] = {row: [] for row in ("parse", "convert", "template", "tokenize",
                                                               "handoff", "total")}
        gc.collect()
        with InnerTimer(self.tokenizer) as inner:
            for raw in raws:
                start = time.perf_counter()
                request = await parse(self.route, raw)
                parsed = time.perf_counter()
                adapted = convert(self.serving, request, raw)
                converted = time.perf_counter()
                await self.generate(adapted, raw)
                sent = time.perf_counter()
                template, tokenize = inner.seconds["apply_chat_template"][-1], inner.seconds["encode"][-1]
                steps["parse"].append(parsed - start)
                steps["convert"].append(converted - parsed - template - tokenize)
                steps["template"].append(template)
                steps["tokenize"].append(tokenize)
                steps["handoff"].append(sent - converted)
                steps["total"].append(sent - start)
        assert all(len(inner.seconds[name]) == count for name in inner.NAMES), "one render and one encode a request"
        assert len(socket.sent) == count
        self.calls[case] = inner.last
        self.manager.rid_to_state.clear()  # the scheduler's outputs would remove them, request by request
        set_ipc("pickle")
        return steps, list(socket.objects)

    async def case(self, case: str, count: int) -> dict[str, list[float]]:
        """One repeat of a case: each row's seconds per request (offload_cpu: the mean, in a list of one)."""
        out, objects = await self.requests(case, count, "pickle")
        msgpack, _ = await self.requests(case, count, "msgpack")
        out["handoff_msgpack"], out["total_msgpack"] = msgpack["handoff"], msgpack["total"]
        raws = [http_request(self.bodies[case]) for _ in range(count)]
        parsed: list = []

        async def parse_one(raw) -> None:
            parsed.append(await parse(self.route, raw))

        out["parse_alone"] = await timed_async(raws, parse_one)
        answered = Answered(self.tokenizer, self.calls[case])
        with answered:
            out["convert_alone"] = timed(list(zip(parsed, raws)), lambda pair: convert(self.serving, *pair))
        args, kwargs, _ = self.calls[case]["apply_chat_template"]
        out["template_alone"] = timed(range(count), lambda _: self.tokenizer.apply_chat_template(*args, **kwargs))
        text_args, text_kwargs, _ = self.calls[case]["encode"]
        out["tokenize_alone"] = timed(range(count), lambda _: self.tokenizer.encode(*text_args, **text_kwargs))
        raws = [http_request(self.bodies[case]) for _ in range(count)]
        with answered:
            adapted = [(convert(self.serving, await parse(self.route, raw), raw), raw) for raw in raws]
        out["handoff_alone"] = await timed_async(adapted, lambda pair: self.generate(*pair))
        self.manager.rid_to_state.clear()
        out["encode"] = timed(objects, lambda obj: pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        set_ipc("msgpack")
        out["encode_msgpack"] = timed(objects, encode_msgpack)
        set_ipc("pickle")
        out["offload"], out["offload_cpu"] = await offload(count)
        return out

    async def tokenize(self, texts: dict[int, str], count: int, reference) -> dict[str, dict[int, list[float]]]:
        """One repeat of the tokenize rows, seconds per call at each length: the chat path's encode (as
        serving_chat calls it), the TokenizerManager's _tokenize_texts (a text prompt's path), and
        `reference` (mistral-common's Tekkenizer) where given."""
        _, kwargs, _ = self.calls["chat"]["encode"]
        out = {"encode": {n: timed(range(count), lambda _, t=text: self.tokenizer.encode(t, **kwargs))
                          for n, text in texts.items()},
               "tokenize_texts": {n: await timed_async(range(count), lambda _, t=text: self.manager._tokenize_texts(t))
                                  for n, text in texts.items()}}
        if reference is not None:
            out["mistral_common"] = {n: timed(range(count), lambda _, t=text: reference(t))
                                     for n, text in texts.items()}
        return out


def fit_slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x."""
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    return (sum((x - mean_x) * (y - mean_y) for x, y in points)
            / sum((x - mean_x) ** 2 for x, _ in points))


def mistral_common_reference(tekken: str | None):
    """mistral-common's own Tekkenizer encode (what tokenpath's tokenize_per_token times), where the
    tokenizer is a Tekken file and mistral-common is installed; else None."""
    if tekken is None:
        return None
    try:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    except ImportError:
        return None
    tekkenizer = Tekkenizer.from_file(tekken)
    return lambda text: tekkenizer.encode(text, bos=False, eos=False)


async def run(args, bench: Bench, cases: dict, texts: dict[int, str], reference) -> dict:
    """All repeats in one event loop (the TokenizerManager's asyncio locks bind to it, as in the server):
    per repeat and row, the median call; then the median over repeats."""
    manager = bench.manager
    manager.event_loop = asyncio.get_running_loop()  # auto_create_handle_loop's, done on the first request

    async def no_wait(obj, request=None):
        return
        yield

    manager._wait_one_response = no_wait
    for case in cases:  # warm-up
        await bench.case(case, max(args.calls // 10, 5))
    await bench.tokenize(texts, 5, reference)
    samples: dict = {case: {} for case in cases}
    token_samples: dict = {}
    for _ in range(args.repeats):  # the cases and rows interleaved, so drift in the machine's load hits all
        for case in cases:
            for row, seconds in (await bench.case(case, args.calls)).items():
                samples[case].setdefault(row, []).append(statistics.median(seconds))
        for row, by_length in (await bench.tokenize(texts, args.calls, reference)).items():
            for n, seconds in by_length.items():
                token_samples.setdefault(row, {}).setdefault(n, []).append(statistics.median(seconds))
    return {"cases": {case: {row: statistics.median(v) for row, v in rows.items()} for case, rows in samples.items()},
            "tokens": {row: {n: statistics.median(v) for n, v in by_length.items()}
                       for row, by_length in token_samples.items()}}


# Row: label. The first block runs each request through every step in turn, as the server does; the second
# runs each step alone in a loop of its own, its caches warm from the call before.
LABELS = {
    "parse": "parse (content type, orjson, validation)",
    "convert": "convert (_validate_request, _convert_to_internal_request)",
    "template": "template (apply_chat_template, tokenize=False)",
    "tokenize": "tokenize (tokenizer.encode of the prompt)",
    "handoff": "handoff (generate_request to the send), pickle",
    "total": "request (each request's sum, median), pickle",
    "handoff_msgpack": "handoff, msgpack IPC",
    "total_msgpack": "request, msgpack IPC",
    "parse_alone": "parse",
    "convert_alone": "convert",
    "template_alone": "template",
    "tokenize_alone": "tokenize",
    "handoff_alone": "handoff, pickle",
    "encode": "  of which the encoding, pickle",
    "encode_msgpack": "  the encoding, msgpack",
    "offload": "the executor hop (run_in_executor, a no-op): wall",
    "offload_cpu": "  its CPU, both threads (mean)",
}
ALONE = "parse_alone"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--tekken", help="a Tekken tokenizer file, converted to a tokenizer.json that encodes "
                                         "(default: mistral-common's tekken_240911.json)")
    source.add_argument("--tokenizer", help="a Hugging Face tokenizer.json that encodes, instead")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS),
                        help="prompt tokens of the tokenize rows; the longest is also the long question's")
    parser.add_argument("--turns", type=int, default=TURNS, help="earlier exchanges of the multi-turn case")
    parser.add_argument("--calls", type=int, default=CALLS, help="requests (calls) per row per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", dest="json_path", help="also write the figures to this JSON file")
    args = parser.parse_args()

    import msgspec
    import pydantic
    import sglang
    import tokenizers
    import transformers
    from fastapi import __version__ as fastapi_version
    from sglang.srt.environ import envs

    tekken = None if args.tokenizer else (args.tekken or default_tekken())
    folder, origin = model_folder(args.tokenizer, tekken)
    server_args = publish_defaults(folder)
    manager = tokenizer_manager(server_args, folder)
    serving, templates = serving_chat(manager)
    tokenizer = manager.tokenizer
    cases = conversations(tokenizer, max(args.lengths), args.turns)
    texts = {n: prose(tokenizer, n) for n in args.lengths}
    reference = mistral_common_reference(tekken)
    same = None
    if reference is not None:  # the converted tokenizer encodes as Tekken does
        same = all(reference(text) == tokenizer.encode(text, add_special_tokens=False) for text in texts.values())
    bench = Bench(manager, serving, cases)
    gc.collect()
    gc.freeze()  # the set-up's objects (torch, transformers, SGLang) out of the collector's way: cheap gc.collect()s
    default_ipc = "pickle" if envs.SGLANG_USE_PICKLE_IPC.get() else "msgpack"
    print(f"SGLang {sglang.__version__} (FastAPI {fastapi_version}, pydantic {pydantic.__version__}, transformers "
          f"{transformers.__version__}, tokenizers {tokenizers.__version__}, msgspec {msgspec.__version__}), "
          f"Python {platform.python_version()}, {cpu_name()}")
    print(f"tokenizer {origin}: {type(tokenizer).__name__}, {len(tokenizer)} tokens"
          + ("" if same is None else f", ids {'identical to' if same else 'NOT identical to'} mistral-common's")
          + f"; Llama 3's chat template (content format {templates.jinja_template_content_format}); sampling "
          f"defaults {serving.default_sampling_params}; IPC default {default_ipc} (SGLANG_USE_PICKLE_IPC); "
          f"{args.calls} requests x {args.repeats} repeats, median request, median repeat")
    shutil.rmtree(folder)  # loaded
    results = asyncio.run(run(args, bench, cases, texts, reference))
    prompt_tokens = {case: len(bench.calls[case]["encode"][2]) for case in cases}
    width = max(len(label) for label in LABELS.values())
    print("us per request".ljust(width) + "".join(f"  {case:>20s}" for case in cases))
    print("each request through every step in turn:")
    print("prompt tokens".ljust(width) + "".join(f"  {prompt_tokens[case]:20d}" for case in cases))
    for row, label in LABELS.items():
        if row == ALONE:
            print("each step alone, in a loop of its own:")
        cells = []
        for case in cases:
            value = results["cases"][case][row] * 1e6
            cell = f"{value:.1f}"
            if row.startswith("tokenize"):
                cell += f" ({value / prompt_tokens[case]:.3f}/tok)"
            cells.append(f"  {cell:>20s}")
        print(label.ljust(width) + "".join(cells))
    token_counts = {n: len(tokenizer.encode(text, add_special_tokens=False)) for n, text in texts.items()}
    for row, label in (("encode", "chat path, tokenizer.encode"),
                       ("tokenize_texts", "TokenizerManager._tokenize_texts"),
                       ("mistral_common", "mistral-common's Tekkenizer (reference)")):
        if row not in results["tokens"]:
            continue
        by_length = results["tokens"][row]
        per_token = ", ".join(f"{token_counts[n]} tokens {by_length[n] * 1e6 / token_counts[n]:.3f}" for n in by_length)
        slope = fit_slope([(token_counts[n], s) for n, s in by_length.items()]) if len(by_length) > 1 else None
        print(f"tokenize, us per token, {label}: {per_token}"
              + (f"; slope {slope * 1e6:.3f}" if slope is not None else ""))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "sglang": sglang.__version__, "tokenizer": origin, "cpu": cpu_name(),
            "python": platform.python_version(), "default_ipc": default_ipc, "calls": args.calls,
            "repeats": args.repeats, "unit": "seconds per call", "prompt_tokens": prompt_tokens,
            "token_counts": token_counts, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
