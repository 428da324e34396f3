"""`llamaspec chat` in a real pseudo-terminal, the ChatSession under it (KV reuse, context
overflow, UTF-8 streaming) and the llama-cpp-python-shaped completion API."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import time
from typing import Iterator

import numpy as np
import pexpect
import pytest
from conftest import REPO, assert_one_error_line

from llamaspec import models as registry
from llamaspec.chat_session import ChatSession
from llamaspec.decoder import SpeculativeDecoder
from llamaspec.drafters import common_prefix_len
from llamaspec.errors import ContextFullError, LlamaSpecError
from llamaspec.llama import ModelOptions
from llamaspec.openai_api import StopStrings
from llamaspec.text import TextStream

# One llama.cpp thread throughout: on a busy two-core machine two threads spin-wait on each
# other and a test runs ten times slower.
OPTIONS = ModelOptions(n_ctx=256, n_threads=1)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PROMPT_RE = r"\n(?:\x1b\[[0-9;?]*[A-Za-z])*> "  # input()'s "> ", after readline's mode switches
STATUS = re.compile(r"(\d+) tokens · .* prompt (\d+)/(\d+) evaluated")
STORY = "Tell me a story about a cat."
SELECT_SYSCALLS = {"x86_64": ("270", "23"), "aarch64": ("72",)}  # pselect6, select

needs_smollm2 = pytest.mark.slow  # fetches SmolLM2-135M-Instruct (98 MB) on first run


class Terminal:
    """`python -m llamaspec.chat_cli` in a pseudo-terminal, read as the user sees it. It runs
    under bash, which prints the exit code and `stty -a` afterwards: the terminal's state."""

    def __init__(self, *args: object):
        command = shlex.join([sys.executable, "-m", "llamaspec.chat_cli", "--threads", str(OPTIONS.n_threads),
                              *map(str, args)])
        env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(REPO))
        self.child = pexpect.spawn("bash", ["-c", f"{command}; echo EXIT=$?; stty -a"], cwd=str(REPO), env=env,
                                   encoding="utf-8", timeout=120, dimensions=(50, 200))
        self.raw = ""
        self.banner = self.prompt()

    def read(self, pattern: str, timeout: float = -1) -> str:
        """What was shown before `pattern`, without colours."""
        self.child.expect(pattern, timeout=timeout)
        self.raw += self.child.before + (self.child.after if isinstance(self.child.after, str) else "")
        return ANSI.sub("", self.child.before).replace("\r\n", "\n")

    def prompt(self) -> str:
        """Everything shown up to the next prompt."""
        return self.read(PROMPT_RE)

    def say(self, line: str) -> str:
        self.child.sendline(line)
        return self.prompt()

    def start_answer(self, line: str) -> None:
        """Send a message and return once the answer has begun to stream."""
        self.child.sendline(line)
        self.read(re.escape(line[-10:]) + r"\r\n")  # the echo
        self.read(r"\w")

    def wait_at_prompt(self, timeout: float = 15) -> None:
        """Return once the chat is blocked in readline's select on the terminal. A Ctrl-C sent
        between drawing "> " and entering that select is only noticed at the next key."""
        shell = self.child.pid
        (chat,) = (int(pid) for task in os.listdir(f"/proc/{shell}/task")
                   for pid in open(f"/proc/{shell}/task/{task}/children").read().split())
        deadline = time.monotonic() + timeout
        # /proc/PID/syscall: the number of the blocking call, then its arguments (nfds 1: stdin).
        waiting = [[number, "0x1"] for number in SELECT_SYSCALLS[platform.machine()]]
        while open(f"/proc/{chat}/syscall").read().split()[:2] not in waiting:
            assert time.monotonic() < deadline, "the chat never waited for input"
            time.sleep(0.005)

    def leave(self) -> None:
        """Wait for the exit and check that it left the terminal as it found it."""
        shown = self.read(pexpect.EOF)
        before_exit, _, after = shown.partition("EXIT=")
        code, _, stty = after.partition("\n")
        assert code.strip() == "0", shown
        assert "Traceback" not in self.raw
        assert before_exit.endswith("\n"), "the chat left the cursor mid-line"
        modes = stty.split()
        assert "icanon" in modes and "echo" in modes, stty  # not left in raw / no-echo mode
        assert self.raw.count("\x1b[?2004h") == self.raw.count("\x1b[?2004l")  # bracketed paste off


def status(screen: str) -> tuple[int, int, int]:
    """(tokens generated, prompt tokens evaluated, prompt tokens) from an answer's status line."""
    match = STATUS.search(screen)
    assert match, screen
    return int(match[1]), int(match[2]), int(match[3])


# -- the terminal --------------------------------------------------------------------------

def test_conversation_in_a_terminal(stories, truncated_draft):
    term = Terminal("--target", stories, "--draft", truncated_draft, "--k", "3", "--max-tokens", "24",
                    "--ctx", "256")
    assert "stories260K.gguf + stories-4-layers.gguf" in term.banner
    first = term.say("Hello there")
    assert "tok/s" in first and "acceptance" in first and "accepted/step" in first and "first token" in first
    n1, evaluated1, prompt1 = status(first)
    assert n1 == 24 and evaluated1 == prompt1
    second = term.say("Tell me more")
    n2, evaluated2, prompt2 = status(second)
    assert evaluated2 <= prompt2 - prompt1 - n1 + 1, "the second turn re-evaluated earlier turns"

    assert term.say("").strip() == ""  # an empty line is ignored
    stats = term.say("/stats")
    assert "turns 2" in stats and f"{n1 + n2} tokens generated" in stats
    assert f"prompt tokens {prompt1 + prompt2}, evaluated {evaluated1 + evaluated2}" in stats
    assert "accepted per step (0: none accepted, or a step that did not draft):" in stats
    assert re.search(r"\n\s+0 █*\s+\d+", stats)
    unknown = term.say("/frobnicate")
    assert "unknown command '/frobnicate'" in unknown
    assert all(command in unknown for command in ("/stats", "/reset", "/trace on|off", "/exit"))
    too_long = term.say("Once upon a time " * 80)
    assert "context holds 256" in too_long and "tokens ·" not in too_long
    n3, evaluated3, prompt3 = status(term.say("And then?"))  # the chat goes on, history intact
    assert n3 == 24 and evaluated3 <= prompt3 - prompt2 - n2 + 1
    term.child.sendline("/exit")
    term.leave()


def test_ctrl_c_stops_an_answer_and_keeps_the_cache(stories, truncated_draft):
    term = Terminal("--target", stories, "--draft", truncated_draft, "--max-tokens", "1500", "--ctx", "2048")
    term.start_answer(STORY)
    term.child.sendintr()
    stopped = term.prompt()
    assert "(stopped)" in stopped
    n1, _, prompt1 = status(stopped)
    assert 0 < n1 < 1500
    term.start_answer("What did the cat do next?")
    term.child.sendintr()
    n2, evaluated2, prompt2 = status(term.prompt())
    # The interrupted answer stays in the conversation and in both caches.
    assert evaluated2 <= prompt2 - prompt1 - n1 + 1
    # At the prompt: a hint, then a second Ctrl-C leaves.
    term.wait_at_prompt()
    term.child.sendintr()
    assert "Ctrl-C again" in term.prompt()
    term.wait_at_prompt()
    term.child.sendintr()
    term.leave()


def test_trace_colours_each_verify_batch_and_ctrl_d_leaves(stories, truncated_draft):
    term = Terminal("--target", stories, "--draft", truncated_draft, "--k", "3", "--max-tokens", "12",
                    "--trace")
    traced = term.say("Hello")
    steps = re.findall(r"verify @(\d+): accepted (\d)/(\d)", traced)
    assert steps and all(int(n) <= int(k) <= 3 for _, n, k in steps)
    # Each batch lists its positions; drafts are green when accepted, red when rolled back.
    first_position = int(next(position for position, _, k in steps if int(k)))  # the first token drafts none
    assert re.search(rf"\n\s+{first_position + 1} [✓✗] '", traced)
    assert re.search(r"\x1b\[31m\s+\d+ ✗ ", term.raw)  # some draft was rejected
    assert any(int(n) for _, n, _ in steps)  # and some accepted (the draft agrees on about half)
    assert re.search(r"\x1b\[32m\s+\d+ ✓ ", term.raw)
    assert "(trace off)" in term.say("/trace off")
    assert "verify @" not in term.say("Again")
    term.child.sendeof()
    term.leave()


@needs_smollm2
def test_smollm2_chat_shows_multibyte_text_whole():
    smollm2 = registry.fetch("smollm2-135m")
    term = Terminal("--target", smollm2, "--draft", smollm2, "--k", "3", "--max-tokens", "30",
                    "--system", "You are a concise assistant.")
    shown = term.say("Repeat exactly: 日本語 🎉")
    assert "🎉" in shown and "\ufffd" not in shown
    assert "acceptance 100%" in shown  # its own draft
    n1, _, prompt1 = status(shown)
    _, evaluated2, prompt2 = status(term.say("Thanks!"))
    assert evaluated2 <= prompt2 - prompt1 - n1 + 1
    term.child.sendline("/exit")
    term.leave()


@pytest.mark.parametrize("args,expected", [
    (["--target", "/nonexistent/model.gguf"], "error: model file not found"),
    (["--max-tokens", "0"], "error: --max-tokens must be at least 1"),
])
def test_bad_options_end_in_one_error_line(args, expected):
    result = subprocess.run([sys.executable, "-m", "llamaspec.chat_cli", *args], capture_output=True, text=True,
                            timeout=60, cwd=REPO)
    assert_one_error_line(result, expected, code=1)


# -- the session underneath ----------------------------------------------------------------

@pytest.fixture(scope="module")
def decoder(stories, truncated_draft) -> Iterator[SpeculativeDecoder]:
    with SpeculativeDecoder(stories, truncated_draft, k=3, options=OPTIONS) as decoder:
        yield decoder


def test_each_generation_carries_its_own_stats_and_slot_decoders_share_the_config(decoder):
    first = decoder.generate(STORY, max_tokens=6)
    second = decoder.generate(STORY, max_tokens=3)
    assert decoder.stats is second.stats  # the latest generation's, for the one-liner API
    assert len(list(second)) == 3 and len(list(first)) == 6  # both made before either ran: neither overwrites the other
    assert (first.stats.n_generated, second.stats.n_generated) == (6, 3)
    other = decoder.with_models(decoder.target, decoder.draft_model)
    assert other.config is decoder.config and other.drafter is not decoder.drafter
    assert other.stats.n_generated == 0  # a fresh decoder has generated nothing yet


def test_a_new_generation_ends_an_unfinished_one_on_the_same_caches(decoder):
    """Closed after a newer generation started, an unfinished one cut the caches under it and
    the newer one went on at shifted positions: wrong text, silently. It is now ended (its
    caches cut) when the newer one is made."""
    decoder.reset()
    want = list(decoder.generate(STORY, max_tokens=24))
    decoder.reset()
    old = decoder.generate("Hi", max_tokens=24)  # shorter than the newer one's cache: cut by it
    next(old), next(old)
    new = decoder.generate(STORY, max_tokens=24)
    got = [next(new), next(new)]
    old.close()
    assert got + list(new) == want and list(old) == []


def test_second_turn_evaluates_only_new_tokens_in_both_caches(decoder):
    session = ChatSession(decoder, system="You tell stories.", max_tokens=64)
    first = session.send(STORY)
    assert "".join(first)
    session.max_tokens = 4
    draft_before, draft_tokens = decoder.draft_model.n_evaluated, list(decoder.draft_model.tokens)
    second = session.send("Why?")
    list(second)
    new_tokens = second.n_prompt - first.n_prompt - first.stats.n_generated
    assert 0 < second.stats.n_prompt_evaluated <= new_tokens + 1
    # The draft catches up from what its cache shares with the new prompt (it lags behind where
    # lookups drafted the end of the first turn), then evaluates its drafts and one sync token
    # per step; re-reading the first turn (over 100 tokens) would break this bound.
    prompt = decoder.target.tokens[: second.n_prompt]
    kept = common_prefix_len(draft_tokens, prompt)
    assert kept >= first.n_prompt
    stats = second.stats
    assert decoder.draft_model.n_evaluated - draft_before <= second.n_prompt - kept + stats.n_drafted + 2 * stats.n_steps
    totals = session.totals
    assert totals.turns == 2 and totals.stats.n_generated == first.stats.n_generated + 4
    assert sum(totals.stats.accept_histogram) == totals.stats.n_steps == first.stats.n_steps + stats.n_steps
    assert len(totals.first_token_s) == 2


def test_context_overflow_drops_oldest_exchanges_keeps_system(decoder):
    session = ChatSession(decoder, system="You tell stories.", max_tokens=48)
    asked = [f"Tell me story number {i}." for i in range(8)]
    dropped = 0
    for text in asked:
        turn = session.send(text)
        list(turn)
        dropped += turn.dropped
        assert turn.n_prompt + session.max_tokens <= decoder.target.n_ctx
        assert session.messages[0] == {"role": "system", "content": "You tell stories."}
    assert dropped >= 2
    users = [m["content"] for m in session.history if m["role"] == "user"]
    assert users == asked[-len(users):] and len(session.history) == 2 * len(users)


def test_max_tokens_as_large_as_the_context_keeps_the_history_that_fits(decoder):
    """Room is kept for max_tokens or half the context, whichever is less: reserving all of
    it would drop every earlier message before each turn."""
    session = ChatSession(decoder, max_tokens=16)  # a short first answer, then the whole context
    first = session.send("Tell me a story.")
    assert "".join(first) and first.stats.n_generated > 0
    session.max_tokens = decoder.target.n_ctx
    second = session.send("And then?")
    list(second)
    assert second.dropped == 0 and session.history[0] == {"role": "user", "content": "Tell me a story."}
    assert second.n_prompt > first.n_prompt + first.stats.n_generated  # the first exchange is in the prompt


def test_paste_longer_than_the_context_is_a_message(decoder):
    session = ChatSession(decoder, max_tokens=16)
    session.ask("Hello")
    history = list(session.history)
    with pytest.raises(ContextFullError, match="context holds"):
        session.send("Once upon a time " * 200)
    assert session.history == history
    assert session.ask("Hello again")


def test_reset_keeps_the_system_prompt_and_empties_the_caches(decoder):
    session = ChatSession(decoder, system="You tell stories.", max_tokens=8)
    session.ask("Hi")
    drafter = decoder.drafter
    session.reset()
    assert session.messages == [{"role": "system", "content": "You tell stories."}]
    assert decoder.target.tokens == [] and decoder.draft_model.tokens == []
    assert decoder.drafter is not drafter  # no memory of the conversation (suffix trie, acceptance)
    turn = session.send("Hi")
    list(turn)
    assert turn.stats.n_prompt_evaluated == turn.n_prompt


def test_closing_a_turn_keeps_the_partial_answer(decoder):
    session = ChatSession(decoder, max_tokens=64)
    turn = session.send(STORY)
    pieces = [next(iter(turn)) for _ in range(3)]
    turn.close()
    assert turn.interrupted and session.history[-1]["content"] == "".join(pieces).lstrip()
    follow = session.send("Go on")
    list(follow)
    assert follow.stats.n_prompt_evaluated <= follow.n_prompt - turn.n_prompt - turn.stats.n_generated + 1


# -- UTF-8 ---------------------------------------------------------------------------------

MULTIBYTE = "naïve café, 日本語 🎉!"


def split_bytes(data: bytes, sizes: list[int]) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        size = sizes[len(out) % len(sizes)]
        out.append(data[i: i + size])
        i += size
    return out


@pytest.mark.parametrize("sizes", [[1], [2], [3, 1], [1, 2, 4]])
def test_text_stream_never_emits_a_broken_character(sizes):
    chunks = split_bytes(MULTIBYTE.encode(), sizes)
    stream = TextStream(lambda i: chunks[i])
    pieces = [stream.push(i) for i in range(len(chunks))] + [stream.flush()]
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) == MULTIBYTE
    # The power check: decoding token by token does break these characters.
    assert "\ufffd" in "".join(c.decode("utf-8", "replace") for c in chunks)


@needs_smollm2
def test_real_tokens_that_split_a_character_stream_whole():
    with SpeculativeDecoder(registry.fetch("smollm2-135m"), options=OPTIONS) as smollm2:
        session = ChatSession(smollm2, max_tokens=30)
        turn = session.send("Repeat exactly: 日本語 🎉")
        pieces = list(turn)
        tokens = smollm2.target.tokens[turn.n_prompt:]
        partial = [t for t in tokens if "\ufffd" in smollm2.target.token_bytes(t).decode("utf-8", "replace")]
        assert partial, "no generated token split a character: this test checked nothing"
        assert "🎉" in "".join(pieces) and not any("\ufffd" in piece for piece in pieces)


# -- llama-cpp-python's API ----------------------------------------------------------------

STORY_START = "Once upon a time"
CHAT = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": STORY}]


@pytest.fixture(scope="module")
def llama_cpp_reference(stories):
    """llama-cpp-python itself on the same model: the shapes to match."""
    from llama_cpp import Llama

    llm = Llama(str(stories), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)
    yield llm
    llm.close()


def keys(value: object) -> object:
    """The nested key structure of a response (list entries by position)."""
    if isinstance(value, dict):
        return {key: keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [keys(item) for item in value]
    return "None" if value is None else "value"


def without_speculative(response: dict) -> dict:
    assert response["speculative"]["mode"] == "speculative"
    return {key: value for key, value in response.items() if key != "speculative"}


def greedy_text(decoder: SpeculativeDecoder, prompt: list[int], max_tokens: int) -> str:
    return decoder.target.detokenize(list(decoder.generate(prompt, max_tokens=max_tokens)))


def test_create_completion_matches_llama_cpp_and_generate(decoder, llama_cpp_reference):
    ours = decoder.create_completion(STORY_START, max_tokens=16, temperature=0)
    theirs = llama_cpp_reference.create_completion(STORY_START, max_tokens=16, temperature=0)
    assert keys(without_speculative(ours)) == keys(theirs)
    assert ours["object"] == "text_completion" and ours["id"].startswith("cmpl-")
    assert ours["model"] == str(decoder.target.path)
    choice = ours["choices"][0]
    assert choice["text"] == theirs["choices"][0]["text"]  # llama-cpp-python's own greedy text
    assert choice["text"] == greedy_text(decoder, decoder.prompt_tokens(STORY_START), 16)
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert ours["usage"] == theirs["usage"]
    assert ours["usage"]["completion_tokens"] == 16
    assert ours["speculative"]["n_generated"] == 16
    assert decoder(STORY_START, max_tokens=16, temperature=0)["choices"][0]["text"] == choice["text"]


def test_create_completion_stream_chunks(decoder, llama_cpp_reference):
    whole = decoder.create_completion(STORY_START, max_tokens=16, temperature=0)
    chunks = list(decoder.create_completion(STORY_START, max_tokens=16, temperature=0, stream=True))
    theirs = list(llama_cpp_reference.create_completion(STORY_START, max_tokens=16, temperature=0, stream=True))
    assert keys(chunks[0]) == keys(theirs[0]) and keys(without_speculative(chunks[-1])) == keys(theirs[-1])
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def test_stop_strings_cut_the_text_streamed_or_not(decoder):
    full = greedy_text(decoder, decoder.prompt_tokens(STORY_START), 32)
    stop = full[len(full) // 2: len(full) // 2 + 4]
    expected = full[: full.index(stop)]
    whole = decoder.create_completion(STORY_START, max_tokens=32, temperature=0, stop=[stop, "never appears"])
    assert whole["choices"][0]["text"] == expected and whole["choices"][0]["finish_reason"] == "stop"
    chunks = list(decoder.create_completion(STORY_START, max_tokens=32, temperature=0, stop=stop, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("pieces,stop,expected", [
    (["Hel", "lo wo", "rld"], ["o w"], ["Hel", "l", ""]),
    (["hello wor", "ld and more"], ["world"], ["hello ", ""]),
    (["hello wor", "m!"], ["world"], ["hello ", "worm!"]),
    (["abc"], [], ["abc"]),
])
def test_stop_strings_hold_back_only_possible_starts(pieces, stop, expected):
    stops = StopStrings(stop)
    assert [stops.push(piece) for piece in pieces] == expected
    assert stops.flush() == ""


def test_a_prompt_longer_than_the_context_without_max_tokens_is_a_context_error(decoder):
    """max_tokens=None means "until the context is full"; a prompt past it is a full context
    (before: a negative max_tokens)."""
    with pytest.raises(ContextFullError, match="the prompt has 802 tokens but the context holds 256"):
        decoder.create_completion("Once upon a time " * 200, max_tokens=None)


def test_stop_strings_hold_back_the_longest_possible_start_and_are_capped():
    """Held back: the longest end of the text that begins a stop string (here brute force over
    every split, on random text of a small alphabet where partial matches are common)."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        stops = ["".join(rng.choice(list("abc"), rng.integers(1, 7))) for _ in range(rng.integers(1, 4))]
        text = "".join(rng.choice(list("abc"), rng.integers(0, 12)))
        if any(stop in text for stop in stops):
            continue
        want = max(n for n in range(len(text) + 1) for stop in stops
                   if n < len(stop) and stop.startswith(text[len(text) - n:]))
        held = StopStrings(stops)
        assert held.push(text) == text[: len(text) - want] and held.flush() == text[len(text) - want:], (stops, text)
    with pytest.raises(LlamaSpecError, match="at most 16 stop strings"):
        StopStrings([str(i) for i in range(17)])
    with pytest.raises(LlamaSpecError, match="at most 256 characters, got one of 257"):
        StopStrings("x" * 257)
    StopStrings(["x" * 256] * 16)


def test_create_chat_completion_matches_llama_cpp_and_generate(decoder, llama_cpp_reference):
    ours = decoder.create_chat_completion(CHAT, max_tokens=16, temperature=0)
    theirs = llama_cpp_reference.create_chat_completion(CHAT, max_tokens=16, temperature=0)
    assert keys(without_speculative(ours)) == keys(theirs)
    assert ours["object"] == "chat.completion" and ours["id"].startswith("chatcmpl-")
    # stories260K has no chat template: the fallback's plain-text turns, written out here
    rendered = decoder.target.tokenize(f"You tell stories.\n\nUser: {STORY}\nAssistant:")
    assert decoder.chat_tokens(CHAT) == rendered
    message = ours["choices"][0]["message"]
    assert message == {"role": "assistant", "content": greedy_text(decoder, rendered, 16)}
    assert ours["usage"]["prompt_tokens"] == len(rendered)

    chunks = list(decoder.create_chat_completion(CHAT, max_tokens=16, temperature=0, stream=True))
    reference = list(llama_cpp_reference.create_chat_completion(CHAT, max_tokens=16, temperature=0, stream=True))
    assert [keys(c) for c in (chunks[0], chunks[1])] == [keys(c) for c in (reference[0], reference[1])]
    assert keys(without_speculative(chunks[-1])) == keys(reference[-1])
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == message["content"]


def test_unlimited_max_tokens_runs_to_the_end_of_the_context(decoder):
    out = decoder.create_completion(STORY_START, max_tokens=None, temperature=0)
    usage = out["usage"]
    assert usage["total_tokens"] == decoder.target.n_ctx and out["choices"][0]["finish_reason"] == "length"


@needs_smollm2
def test_chat_completion_stops_at_the_end_of_turn():
    smollm2 = registry.fetch("smollm2-135m")
    with SpeculativeDecoder(smollm2, smollm2, k=3, options=OPTIONS) as decoder:
        out = decoder.create_chat_completion([{"role": "user", "content": "Say hi."}], max_tokens=64, temperature=0)
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] < 64
    assert "<|im_end|>" not in out["choices"][0]["message"]["content"]
