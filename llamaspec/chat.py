"""Chat prompts from the target GGUF's own template (Jinja2, as llama.cpp and llama-cpp-python use it)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Mapping, Sequence

from .errors import LlamaSpecError

if TYPE_CHECKING:
    from .llama import Model

Message = Mapping[str, str]

# Used when a GGUF carries no tokenizer.chat_template: a plain transcript any model can continue.
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}User: {{ message['content'] }}\n"
    "{% else %}Assistant: {{ message['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _raise(message: str) -> None:
    raise LlamaSpecError(f"chat template: {message}")


def render(template: str, messages: Sequence[Message], bos_token: str, eos_token: str,
           add_generation_prompt: bool = True) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(
        raise_exception=_raise,
        strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt),
    )
    try:
        return env.from_string(template).render(
            messages=list(messages), bos_token=bos_token, eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except TemplateError as exc:
        raise LlamaSpecError(f"the model's chat template failed: {exc}") from None


class ChatFormat:
    """Turns a message list into prompt tokens for one model."""

    def __init__(self, model: Model):
        self.model = model
        self.template = model.chat_template()
        self.has_template = self.template is not None
        self.bos_text = model.token_bytes(model.bos, special=True).decode("utf-8", "replace")
        self.eos_text = model.token_bytes(model.eos, special=True).decode("utf-8", "replace")

    def prompt_text(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        return render(self.template or FALLBACK_TEMPLATE, messages, self.bos_text, self.eos_text,
                      add_generation_prompt)

    def tokens(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        text = self.prompt_text(messages, add_generation_prompt)
        # Templates that write the BOS themselves must not get a second one from the tokenizer.
        add_bos = not (self.bos_text and text.startswith(self.bos_text))
        return self.model.tokenize(text, add_special=add_bos, parse_special=True)
