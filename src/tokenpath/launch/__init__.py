"""`tokenpath launch`: the commands and files that start a scenario's deployment on vLLM, SGLang or
TensorRT-LLM, or on Kubernetes, with each flag as that engine version defines it (flags.toml).

The one entry point for other code is `launch_files(scenario, engine, model_id=None)`, file name -> text
(files.py); docs/launch.md has the mapping of each scenario setting to each engine's flags.
"""

from tokenpath.launch.files import ENGINES, launch_files

__all__ = ["ENGINES", "launch_files"]
