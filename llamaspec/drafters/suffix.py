"""Suffix-tree drafting (SuffixDecoding, arXiv 2411.04975): no second model.

Everything this drafter has seen in the session — the current prompt and output, and the
contexts of earlier generations and chat turns — is indexed in one bounded-depth suffix trie
with occurrence counts. A draft follows the most frequent continuation of a suffix of the
context while the product of the empirical probabilities stays above `min_prob`, for at most
`length_factor` x the match length tokens: a long match earns a long draft, a one-token match a
one-token draft, and a continuation seen three times wins over one seen once. How many of
those tokens to send is the policy's call, learned apart for short, medium and long matches:
a continuation of a 1-token match is a guess, one of a 20-token match usually a copy. Drafts
are deterministic (no probabilities), so verification stays lossless.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..policy import DraftPolicy, FixedK
from ..sampling import Sampler
from . import Draft, common_prefix_len

END = -1  # closes a document in the corpus; never a token id, so no match runs across it
_STRIDE = 1 << 32  # a child's key is parent * _STRIDE + token (token ids are below 2**31)


class SuffixTrie:
    """Every substring of at most `max_depth` tokens of the corpus, with counts.

    Nodes are indices into parallel lists. A node whose string occurred once is a leaf that
    stores where that occurrence starts: its deeper extensions stay implicit (they are read
    from the corpus) until a second occurrence arrives and splits it. So text that is new
    costs about one node per token, and appending a token touches only the suffixes of the
    corpus that occurred before (the current match), at most `max_depth` of them.
    """

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.corpus: list[int] = []
        # Per node: its last token, its string's length, how often the string occurs, how
        # often an occurrence is followed by a token, its most frequent child (-1: none), and
        # where its only occurrence starts (meaningful while count == 1). Node 0: the root.
        self.token, self.depth, self.count, self.cont, self.best, self.start = [END], [0], [0], [0], [-1], [0]
        self.children: dict[int, int] = {}
        # Nodes of the corpus's suffixes that occurred before, by length (the root first).
        self.active: list[int] = [0]

    def _new_node(self, token: int, depth: int, start: int) -> int:
        self.token.append(token)
        self.depth.append(depth)
        self.count.append(1)
        self.cont.append(0)
        self.best.append(-1)
        self.start.append(start)
        return len(self.token) - 1

    def _split(self, leaf: int) -> None:
        """A leaf's string occurs a second time: make what followed its first occurrence explicit."""
        depth = self.depth[leaf]
        if depth >= self.max_depth:
            return
        # The first occurrence ended before the second one does, so its next token is stored.
        token = self.corpus[self.start[leaf] + depth]
        if token == END:
            return
        child = self._new_node(token, depth + 1, self.start[leaf])
        self.children[leaf * _STRIDE + token] = child
        self.cont[leaf], self.best[leaf] = 1, child

    def append(self, token: int) -> None:
        """Extend the current document by one token: one step down from each active suffix."""
        count, cont, best, depth_of, children = self.count, self.cont, self.best, self.depth, self.children
        position = len(self.corpus)
        self.corpus.append(token)
        active = [0]
        for node in self.active:
            depth = depth_of[node]
            cont[node] += 1
            key = node * _STRIDE + token
            child = children.get(key)
            if child is None:  # a new string: this suffix is unique from here on
                child = children[key] = self._new_node(token, depth + 1, position - depth)
            else:
                if count[child] == 1:
                    self._split(child)
                count[child] += 1
                if depth + 1 < self.max_depth:
                    active.append(child)
            if best[node] < 0 or count[child] >= count[best[node]]:  # ties: the latest
                best[node] = child
        self.active = active

    def end_document(self) -> None:
        self.corpus.append(END)
        self.active = [0]

    def continuation(self, node: int, limit: int, min_prob: float) -> tuple[list[int], float]:
        """Up to `limit` tokens that most often followed `node`'s string, while the running
        product of their empirical probabilities stays at least `min_prob`; and the draft's
        expected accepted length under those probabilities (their running products summed)."""
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        limit = min(limit, self.max_depth - self.depth[node])
        while len(tokens) < limit:
            if self.count[node] == 1:  # one occurrence: copy what followed it
                begin = self.start[node] + self.depth[node]
                rest = self.corpus[begin: begin + limit - len(tokens)]
                if END in rest:
                    rest = rest[: rest.index(END)]
                tokens += rest
                score += prob * len(rest)
                break
            child = self.best[node]
            if child < 0:
                break
            prob *= self.count[child] / self.cont[node]
            if prob < min_prob:
                break
            tokens.append(self.token[child])
            score += prob
            node = child
        return tokens, score


class SuffixDrafter:
    """Drafts from a suffix trie over the current context and the session's earlier ones.

    Every suffix of the context (`min_match` to `max_depth` - 1 tokens) that occurred before
    is a candidate; each drafts at most min(max_k, length_factor x its length) tokens and
    scores its draft's expected accepted length; the best score wins, the longer match on
    ties. The trie follows the context by common prefix: a context that extends the last one
    is appended; one that departs from it starts a new document (with the last shared tokens
    as its lead-in, so matches still reach back across the change) and the old one stays as
    history. History beyond 2 x `history_tokens` is cut to its last `history_tokens` tokens.

    `policy` makes one k policy per class of match length (up to `match_classes[0]` tokens,
    up to `match_classes[1]`, ..., longer): the winning draft's class decides how much of it
    is sent and hears what verification accepted. A step without a draft consults none.
    """

    def __init__(self, max_depth: int = 32, length_factor: float = 1.0, min_prob: float = 0.1,
                 min_match: int = 2, history_tokens: int = 8192,
                 policy: Callable[[], DraftPolicy] = FixedK, match_classes: Sequence[int] = (2, 8)):
        if not 1 <= min_match < max_depth:
            raise ValueError("need 1 <= min_match < max_depth")
        if length_factor <= 0 or not 0.0 <= min_prob <= 1.0 or history_tokens < 0:
            raise ValueError("need length_factor > 0, 0 <= min_prob <= 1 and history_tokens >= 0")
        self.length_factor, self.min_prob, self.min_match = length_factor, min_prob, min_match
        self.history_tokens = history_tokens
        self.match_classes = tuple(match_classes)
        self.policies = [policy() for _ in range(len(self.match_classes) + 1)]
        self._drafting: DraftPolicy | None = None  # the policy of the last step's draft
        self.trie = SuffixTrie(max_depth)
        self._context: list[int] = []  # the context as last seen

    def _new_document(self, lead_in: Sequence[int]) -> None:
        trie = self.trie
        trie.end_document()
        if len(trie.corpus) > 2 * self.history_tokens:  # rebuilt from what is kept: amortised O(1) a token
            kept = trie.corpus[len(trie.corpus) - self.history_tokens:]
            trie = self.trie = SuffixTrie(trie.max_depth)
            for token in kept:
                if token == END:
                    trie.end_document()
                else:
                    trie.append(token)
        for token in lead_in:
            trie.append(token)

    def _sync(self, context: Sequence[int]) -> None:
        known = len(self._context)
        if len(context) >= known and list(context[:known]) == self._context:
            shared = known
        else:
            shared = common_prefix_len(self._context, context)
            self._new_document(context[max(0, shared - self.trie.max_depth + 1): shared])
            del self._context[shared:]
        fresh = list(context[shared:])
        for token in fresh:
            self.trie.append(token)
        self._context += fresh

    def _best(self, context: Sequence[int], max_k: int) -> tuple[list[int], int]:
        """The best-scoring draft of at most max_k tokens to follow `context`, and the length
        of the match it continues."""
        self._sync(context)
        trie = self.trie
        tokens: list[int] = []
        best_score, best_depth = 0.0, 0
        for node in reversed(trie.active):  # longest match first
            depth = trie.depth[node]
            if depth < self.min_match:
                break
            limit = min(max_k, int(self.length_factor * depth), trie.max_depth - depth)
            if limit <= best_score:  # cannot do better than what we have
                continue
            draft, score = trie.continuation(node, limit, self.min_prob)
            if score > best_score:
                tokens, best_score, best_depth = draft, score, depth
        return tokens, best_depth

    def lookup(self, context: Sequence[int], max_k: int) -> list[int]:
        """The best-scoring draft of at most max_k tokens to follow `context`."""
        return self._best(context, max_k)[0]

    def prefill(self, prompt: Sequence[int]) -> None:
        self._sync(prompt)

    def propose(self, context: Sequence[int], max_k: int, sampler: Sampler) -> Draft:
        tokens, match = self._best(context, max_k)
        self._drafting = None
        if not tokens:
            return Draft()
        self._drafting = self.policies[sum(match > bound for bound in self.match_classes)]
        return Draft(tokens[: self._drafting.begin(len(tokens))])

    def observe(self, n_drafted: int, n_accepted: int) -> None:
        if self._drafting is not None:
            self._drafting.update(n_drafted, n_accepted)

    def close(self) -> None:
        pass
