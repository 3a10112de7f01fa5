"""What the engine-code benchmarks share (vllm_output_processor.py, sglang_output_path.py,
sglang_request_path.py): the sample text and token windows their sequences are made of, a tokenizer.json
loaded as the engines load it, their shared options, and this machine's CPU. Like them, it does not import
tokenpath, so it runs in an engine's own environment; they import it from this folder."""

from __future__ import annotations

import json
import platform
from pathlib import Path

# Used without --ids: a small mixed text, for tokenizer.json files that encode (BPE with merges, etc.).
SAMPLE_TEXT = """\
When a user sends a question to a chat service, the answer does not appear all at once. The model
produces one token at a time, and each token travels from the accelerator to the host, is turned back
into text, checked against the caller's stop strings, wrapped in a server-sent event and written to a
socket. Only then does the browser show another word. At large batch sizes the host work adds up: a
few microseconds per sequence, times several hundred sequences, is a noticeable slice of every step.

当用户向聊天服务提出一个问题时，答案并不是一次性出现的。模型每次只生成一个词元，每个词元都要从加速器
传到主机，再还原成文字，检查是否遇到了停止字符串，然后包装成服务器推送事件写入网络连接。

def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)

Done! 🎉 The build passed ✅, the deploy is rolling out 🚀, and the dashboard looks green 📈. Thanks 🙏
"""


def load_tokenizer(path: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=path)


def sample_ids(tokenizer, tokenizer_path: str, ids_path: str | None) -> list[int]:
    """The token ids the sequences are windows of: --ids, or the sample text encoded by the tokenizer."""
    if ids_path:
        ids = json.loads(Path(ids_path).read_text())
        if not (isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids)):
            raise SystemExit(f"--ids {ids_path}: expected a JSON list of token ids")
        return ids
    model = json.loads(Path(tokenizer_path).read_text()).get("model", {})
    if model.get("type") == "BPE" and not model.get("merges"):
        raise SystemExit(f"{tokenizer_path}: a BPE model with no merges encodes byte by byte; pass --ids "
                         "(the ids of a text as the original tokenizer encodes it)")
    return tokenizer._tokenizer.encode(SAMPLE_TEXT, add_special_tokens=False).ids


def token_windows(text_ids: list[int], batch: int, total_steps: int, prompt_tokens: int,
                  seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Per sequence, a prompt (a window of the sample, from a random start) and the output that follows it."""
    import random

    rng = random.Random(seed)
    span = prompt_tokens + total_steps
    corpus = text_ids * (span // len(text_ids) + 2)
    starts = [rng.randrange(len(text_ids)) for _ in range(batch)]
    prompts = [corpus[s:s + prompt_tokens] for s in starts]
    outputs = [corpus[s + prompt_tokens:s + span] for s in starts]
    return prompts, outputs


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")),
                        platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def add_token_run_arguments(parser, warmup: int, prompt_tokens: int) -> None:
    """The per-token benchmarks' shared options: the tokenizer and sample, the batch sizes, and the steps."""
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    parser.add_argument("--ids", help="a JSON list of token ids of a sample text (default: encode the "
                                      "script's own sample with the tokenizer)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=prompt_tokens)
