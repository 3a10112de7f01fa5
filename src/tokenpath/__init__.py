"""tokenpath: where the time goes between an LLM request and readable text on the user's screen."""

__version__ = "0.1.0"
