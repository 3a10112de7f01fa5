"""Which checkpoint a launch serves: its Hugging Face repository id, and the precision its weights are
stored in (models.toml's `hf_id`, `hf_precision` and, where its routed experts differ,
`hf_expert_precision`), or the id the user gives."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpath import catalog
from tokenpath.compute.model import checkpoint_precision
from tokenpath.config import files
from tokenpath.config.errors import UserError, quoted
from tokenpath.sim.scenario import Scenario


@dataclass(frozen=True)
class Checkpoint:
    """A model repository to serve. `precision` None: the user's own, taken as the scenario's precision."""

    hf_id: str
    precision: str | None
    expert_precision: str | None = None  # its routed experts', where they differ (None: `precision`)

    def stored(self) -> str:
        """Its precision in words: "bf16", or "bf16 with fp4 routed experts"."""
        if self.expert_precision is None or self.expert_precision == self.precision:
            return str(self.precision)
        return f"{self.precision} with {self.expert_precision} routed experts"


def checkpoint(scenario: Scenario, model_id: str | None = None) -> Checkpoint:
    """The checkpoint for `scenario`: `model_id` if given; else a catalog model's `hf_id`, or the
    `org/name` the scenario names the model by when that resolves to a catalog entry."""
    if model_id is not None:
        if not model_id.strip() or any(c.isspace() for c in model_id):
            raise UserError(f"--model-id: {quoted(model_id)} is not a model id; give a Hugging Face repository id "
                            "(org/name) or a path")
        return Checkpoint(model_id, None)
    name = scenario.model.name
    if files.exists(scenario.model_source()):
        raise UserError(f"model {quoted(name)} has no hf_id; pass --model-id")
    _, entry = catalog.lookup(catalog.MODELS_FILE, name, "model", "models")
    precision, experts = checkpoint_precision(name)
    if "/" in name:  # a Hugging Face id, as written, of a catalog model
        return Checkpoint(name, precision, experts)
    if "hf_id" not in entry:
        raise UserError(f"model {quoted(name)} has no hf_id; pass --model-id")
    return Checkpoint(entry["hf_id"], precision, experts)
