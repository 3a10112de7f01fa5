"""The CPU time, per character of a chat template's Jinja source, of the work some vLLM releases do on it
for every chat request (engine/template_work.py), as Jinja2 does it on this machine: format detection
(vLLM 0.6.5-0.9.1) and kwargs resolution (vLLM 0.11.0), run as delivery/template_parse.py runs them.

Rendering the compiled template (what every release does, `chat_template_per_request`) is timed beside
them. Each figure is the median of `--repeats` timings (delivery/request_measure.median_s).

    python benchmarks/template_parse.py                           # the embedded Llama 3 template
    python benchmarks/template_parse.py path/to/tokenizer_config.json path/to/chat_template.jinja

A longer template gives the steadier figure per character (the fixed cost of a call is a smaller part).
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

from tokenpath.delivery.chat_template import CONVERSATIONS, LLAMA3_SPECIAL_TOKENS, LLAMA3_TEMPLATE, compile_template
from tokenpath.delivery.request_measure import median_s
from tokenpath.delivery.template_parse import format_detection, kwargs_resolution


def template_text(path: str) -> str:
    """A template's source: a .jinja file as it is, a tokenizer_config.json's `chat_template`."""
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json"):
        template = json.loads(text).get("chat_template")
        if isinstance(template, list):  # named templates: transformers takes "default"
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        if not isinstance(template, str):
            raise SystemExit(f"{path}: no chat_template string")
        return template
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("templates", nargs="*", help="tokenizer_config.json or .jinja files (default: Llama 3's)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    sources = {path: template_text(path) for path in args.templates} or {"Llama 3 (embedded)": LLAMA3_TEMPLATE}
    print(f"{'template':40} {'chars':>6} {'render us':>10} {'detection us/char':>18} {'kwargs us/char':>15}")
    for name, source in sources.items():
        render = partial(compile_template(source).render, messages=CONVERSATIONS[0], add_generation_prompt=True,
                         **LLAMA3_SPECIAL_TOKENS)
        render_s = median_s(render, args.repeats)
        detection_s = median_s(partial(format_detection, source), args.repeats)
        kwargs_s = median_s(partial(kwargs_resolution, source), args.repeats)
        print(f"{name[-40:]:40} {len(source):6d} {render_s * 1e6:10.1f} {detection_s / len(source) * 1e6:18.3f} "
              f"{kwargs_s / len(source) * 1e6:15.3f}")


if __name__ == "__main__":
    main()
