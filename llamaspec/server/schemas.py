"""What the server's clients send and get back on error: the request bodies (pydantic
models of the OpenAI fields llamaspec implements) and the OpenAI-style error."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ApiError(Exception):
    """An error answered with an OpenAI-style body: {"error": {"message", "type", ...}}."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    @classmethod
    def internal(cls, exc: BaseException) -> ApiError:
        """The 500 for an exception nothing expected (a bug): its type and message for the report."""
        return cls(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


# OpenAI fields that would change the answer and that llamaspec does not implement, with the
# values (besides null) that leave it unchanged: any other value is refused (400), not silently
# ignored. Compared with their types: `logprobs: 0` asks a completion for the chosen token's
# log-probability, while chat's `logprobs: false` asks for nothing.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "suffix": ("",), "logit_bias": ({},),
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "best_of": (1,), "tools": ([],),
    "functions": ([],), "response_format": ({"type": "text"},),
}


def refuse_unsupported(payload: dict[str, Any]) -> None:
    for name, no_op in UNSUPPORTED.items():
        value = payload.get(name)
        if value is not None and not any(type(value) is type(v) and value == v for v in no_op):
            raise ApiError(400, f"{name} is not supported by this server", param=name)


class GenerationBody(BaseModel):
    """The fields /v1/completions and /v1/chat/completions share."""

    model_config = ConfigDict(extra="ignore")  # other fields: ignored (UNSUPPORTED's are refused before)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    # Sampling values' ranges are SamplingParams' (openai_api.check_sampling), checked before a slot runs.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    speculative: dict[str, Any] | None = None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for openai_api: the fields the client set (the rest keep
        llama-cpp-python's defaults)."""
        skip = {"model", "n", "stream", "prompt", "messages", "max_completion_tokens"}
        return {key: value for key, value in self.model_dump(exclude_unset=True).items()
                if key not in skip and value is not None}


class CompletionBody(GenerationBody):
    prompt: str | list[int] | list[str]


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str = ""


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_Part] | None = None

    def as_dict(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content if part.type == "text")
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class ChatBody(GenerationBody):
    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)  # the newer name of max_tokens
