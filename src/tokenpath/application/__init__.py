"""The application around the model call: the stages a request passes before, beside and after it."""
