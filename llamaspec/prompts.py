"""Prompt suites: JSON lines with id, category and prompt."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from .errors import LlamaSpecError


def load_prompts(path: Path | None = None, categories: list[str] | None = None,
                 limit: int | None = None) -> list[dict]:
    """JSON lines with id, category, prompt; the shipped suite when path is None."""
    if limit is not None and limit < 1:
        raise LlamaSpecError(f"--limit must be at least 1, got {limit}")
    if path is None:
        text = resources.files("llamaspec").joinpath("data/prompts.jsonl").read_text(encoding="utf-8")
        where = "the shipped prompt suite"
    else:
        if not path.is_file():
            raise LlamaSpecError(f"prompts file not found: {path}")
        try:
            text, where = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as exc:
            raise LlamaSpecError(f"{path} is not UTF-8 text (byte {exc.start}); prompts are JSON lines") from None
    prompts, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LlamaSpecError(f"{where}, line {number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict) or not all(isinstance(item.get(key), str) for key in ("id", "category", "prompt")):
            raise LlamaSpecError(f"{where}, line {number}: needs string fields id, category and prompt")
        seen.add(item["category"])
        if not categories or item["category"] in categories:
            prompts.append(item)
    if not prompts:
        has = f"; its categories: {', '.join(sorted(seen))}" if seen else ""
        raise LlamaSpecError(f"no prompts selected from {where}{has}")
    return prompts[:limit] if limit else prompts
