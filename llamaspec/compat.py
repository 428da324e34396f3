"""Can this draft model propose tokens for that target? llama.cpp's rule, kept apart from the loop."""

from __future__ import annotations

from .errors import VocabMismatchError
from .llama import Model

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5  # ids below this are often control tokens that differ harmlessly


def check_vocab_compatible(target: Model, draft: Model) -> None:
    """Raise VocabMismatchError naming the first difference; a draft token id must mean the
    same text to the target, or accepted drafts would be meaningless."""
    where = f"draft {draft.path.name} vs target {target.path.name}"
    if draft.vocab_type != target.vocab_type:
        raise VocabMismatchError(f"vocabulary types differ ({draft.vocab_type} vs {target.vocab_type}): {where}")
    if (draft.add_bos, draft.bos) != (target.add_bos, target.bos) or (draft.add_eos, draft.eos) != (
        target.add_eos,
        target.eos,
    ):
        raise VocabMismatchError(f"BOS/EOS tokens or their use differ: {where}")
    if abs(draft.n_vocab - target.n_vocab) > MAX_VOCAB_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"vocabulary sizes differ by more than {MAX_VOCAB_SIZE_DIFFERENCE} "
            f"({draft.n_vocab} vs {target.n_vocab}): {where}"
        )
    for token in range(FIRST_CHECKED_TOKEN, min(draft.n_vocab, target.n_vocab)):
        draft_text, target_text = draft.token_text(token), target.token_text(token)
        if draft_text != target_text:
            raise VocabMismatchError(
                f"token {token} differs ({draft_text!r} vs {target_text!r}): {where}"
            )
