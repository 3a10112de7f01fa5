"""The work some engines' API servers do on a chat template's Jinja source for every request, besides
rendering it, run as they run it (engine/template_work.py says which releases, with the code it follows):

- format detection (vLLM 0.6.5-0.9.1, `_detect_content_format`): the source parsed by the environment
  transformers compiles templates in, then its tree walked for assignments and for loops (three
  `find_all` walks: vLLM's search for `messages`, its loops, and their content loops);
- kwargs resolution (vLLM 0.11.0, `resolve_chat_template_kwargs`): a sandboxed environment built, the
  source parsed and its undeclared variables listed (`jinja2.meta.find_undeclared_variables`).

`tokenpath calibrate delivery` times both per character on this machine (`measure_template_parse`), on
the template the tokenizer renders; benchmarks/template_parse.py prints them for any template.
"""

from __future__ import annotations

from functools import partial

from tokenpath.delivery.calibration import TemplateParseCost
from tokenpath.delivery.chat_template import compile_template
from tokenpath.delivery.request_measure import median_s


def format_detection(source: str) -> None:
    """Parse `source` and walk its tree for assignments and for loops, as vLLM 0.6.5-0.9.1 detect its
    content format."""
    import jinja2.nodes

    tree = compile_template(source).environment.parse(source)
    for node in (jinja2.nodes.Assign, jinja2.nodes.For, jinja2.nodes.For):
        for _ in tree.find_all(node):
            pass


def kwargs_resolution(source: str) -> None:
    """Build a sandboxed environment, parse `source` and list its undeclared variables, as vLLM 0.11.0
    resolves a request's template arguments."""
    import jinja2.ext
    import jinja2.meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    jinja2.meta.find_undeclared_variables(environment.parse(source))


def measure_template_parse(source: str, repeats: int = 5) -> TemplateParseCost:
    """Both kinds of work on `source`, per character, medians of `repeats` timings."""
    return TemplateParseCost(median_s(partial(format_detection, source), repeats) / len(source),
                             median_s(partial(kwargs_resolution, source), repeats) / len(source))
