"""Errors a user can cause and fix; the CLI prints them as one line, never a traceback."""


class LlamaSpecError(Exception):
    """Bad input or an unusable model: the message says what and how to fix it."""


class ModelLoadError(LlamaSpecError):
    """A GGUF file is missing, corrupt, or llama.cpp refused it."""


class VocabMismatchError(LlamaSpecError):
    """Draft and target tokenize differently, so draft tokens mean nothing to the target."""


class ContextFullError(LlamaSpecError):
    """The prompt does not fit in the context window."""
