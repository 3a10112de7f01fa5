"""`tokenpath serve`: an OpenAI-compatible server streaming real text on simulated timing."""

from tokenpath.serve.app import ServeOptions, make_app

__all__ = ["ServeOptions", "make_app"]
