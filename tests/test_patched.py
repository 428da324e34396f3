"""The default (patched) llama.cpp build, cpp_patches/: verify batches of every size up to 16
must give logits bit-identical to sequential decoding, through the multi-row kernels too.

Runs `llamaspec audit` in a subprocess (each with its own kernel environment). The kernel
tests quantize a random 256-wide model to one type per tensor (Q4_K, Q5_K, Q6_K, Q4_0, Q8_0, F16),
so every matmul runs that type's kernel at batches 1..16 (tiles of up to 16 rows, groups and odd
tails), at 1 and 2 threads; a control run with another reduction order or rounding on all but the
first row of a tile must be caught, so the comparison has power. A batch of 1 can run the multi-row
kernels too (where the CPU decodes faster with them): the audit compares batch 1 across the two
kernels (the single-row one is stock llama.cpp's path for one token), under both settings, and a
control that rounds every multi-row row another way must be caught there.
The Gemma 3 270M cases are marked slow (they fetch the model on first use, like tests/test_slow.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from conftest import REPO

if TYPE_CHECKING:
    from llamaspec.llama import Model

BATCH_MAX = 16
# a prompt long enough that the KV cache passes 256 and 512 cells, where flash attention's
# stock kernel switches from one pass to KV chunks split by thread count
LONG_TEXT = ("Once upon a time there was a little girl who lived in a village near the forest. "
             "Every day she walked to the river with her dog and her grandmother's basket. ") * 24
KERNEL_TYPES = ["q4_k_s", "q5_k_s", "q6_k", "q4_0", "q8_0", "f16"]
MULTIROW_TYPES = {"q4_k_s": "Q4_K", "q5_k_s": "Q5_K", "q6_k": "Q6_K", "q4_0": "Q4_0", "q8_0": "Q8_0", "f16": "F16"}


def system_info() -> str:
    from llamaspec.llama import system_info as info

    text = info()
    if "BATCH_INVARIANT" not in text:
        pytest.fail(f"this llama-cpp-python is not the patched build (system info: {text!r}); "
                    "run scripts/install.sh without LLAMASPEC_STOCK")
    return text


def audit(tmp_path: Path, target: Path, *extra: str, prompts: list[str] | None = None,
          max_tokens: int = 32, limit: int = 2, timeout: int = 1800, env: dict[str, str] | None = None) -> dict:
    system_info()
    out = tmp_path / f"audit-{target.stem}-{'-'.join(e.strip('-') for e in extra) or 'default'}.json"
    command = [sys.executable, "-m", "llamaspec.cli", "audit", "--target", str(target),
               "--limit", str(limit), "--max-tokens", str(max_tokens), "--batch-max", str(BATCH_MAX),
               "--json", str(out), *extra]
    if prompts is not None:
        prompt_file = tmp_path / "prompts.jsonl"
        prompt_file.write_text("".join(json.dumps({"id": f"p{i}", "category": "test", "prompt": p}) + "\n"
                                       for i, p in enumerate(prompts)), encoding="utf-8")
        command += ["--prompts", str(prompt_file)]
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_CPU_")} | (env or {})
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=run_env, timeout=timeout,
                          check=False)
    assert done.returncode == 0, f"audit failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


def assert_every_size(report: dict) -> dict:
    """The audit's rows by verify size, which must be every size from 2 to BATCH_MAX (a check
    over none of them would pass anything)."""
    sizes = report["batch_sizes"]
    assert sorted(map(int, sizes)) == list(range(2, BATCH_MAX + 1)), sorted(sizes)
    return sizes


def assert_bit_exact(report: dict) -> None:
    sizes = assert_every_size(report)
    bad = {size: (row["max_abs_diff"], row["rows_different"], row["rows_compared"])
           for size, row in sizes.items() if row["rows_compared"] == 0 or row["max_abs_diff"] != 0
           or row["rows_different"] != 0}
    assert not bad, f"not bit-exact (size: max |dlogit|, rows different, rows compared): {bad}"
    assert report["bit_exact_sizes"] == list(range(2, BATCH_MAX + 1))


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_patched_stories_bit_exact(tmp_path, stories, flash_attn):
    assert_bit_exact(audit(tmp_path, stories, "--flash-attn", flash_attn))


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_patched_tiny_random_bit_exact(tmp_path, tiny_random, flash_attn):
    assert_bit_exact(audit(tmp_path, tiny_random, "--flash-attn", flash_attn))


def test_patched_tiny_random_long_context_bit_exact(tmp_path, tiny_random):
    """Batches that straddle the 256- and 512-cell KV boundaries (flash attention chunking)."""
    assert_bit_exact(audit(tmp_path, tiny_random, "--flash-attn", "on", prompts=[LONG_TEXT], limit=1,
                           max_tokens=48))


@pytest.mark.slow
def test_patched_gemma_bit_exact(tmp_path):
    from llamaspec import models

    gemma = models.fetch("gemma-3-270m")
    assert_bit_exact(audit(tmp_path, gemma))


@pytest.mark.slow
def test_patched_gemma_long_context_bit_exact(tmp_path):
    """Past Gemma 3's 512-token sliding window."""
    from llamaspec import models

    gemma = models.fetch("gemma-3-270m")
    assert_bit_exact(audit(tmp_path, gemma, prompts=[LONG_TEXT * 2], limit=1, max_tokens=32))


@pytest.fixture(scope="session")
def kernel_models(stories: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random 2-layer llama, 256 wide (K-quant blocks), with every tensor of one type: F32 as
    made, and each of KERNEL_TYPES."""
    from llamaspec.gguf_tools import random_llama
    from llamaspec.llama import quantize

    folder = tmp_path_factory.mktemp("kernels")
    f32 = random_llama(stories, folder / "random-f32.gguf", n_embd=256, n_ff=512)
    quantized = {quant: quantize(f32, folder / f"random-{quant}.gguf", quant, pure=True) for quant in KERNEL_TYPES}
    return {"f32": f32, **quantized}


def test_system_info_names_the_multirow_kernels():
    from llamaspec.llama import cpu_kernels

    info = system_info()
    if " AVX2 = 1" in info:
        assert "MULTIROW = Q4_0,Q4_K,Q5_K,Q6_K,Q8_0,F16" in info, info
        assert cpu_kernels().startswith("batch-invariant up to 16 tokens, multi-row kernels for Q4_0, Q4_K, Q5_K, "
                                        "Q6_K, Q8_0, F16")
    else:  # no AVX2 (or not x86): F16 at most (generic SIMD), the quantized types per row, and it says so
        assert "MULTIROW = F16" in info or "MULTIROW = none" in info, info
        assert "Q4_K" not in cpu_kernels()


@pytest.mark.parametrize("batch1", ["1", "2"])  # GGML_CPU_MULTIROW: batch 1 multi-row, or single-row
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("quant", KERNEL_TYPES)
def test_kernels_bit_exact_at_every_batch(tmp_path, kernel_models, quant, threads, batch1):
    report = audit(tmp_path, kernel_models[quant], "--threads", str(threads), max_tokens=24,
                   env={"GGML_CPU_MULTIROW": batch1})
    assert_bit_exact(report)
    batch1_kernels = report["batch1_kernels"]
    assert batch1_kernels["bit_identical"] and batch1_kernels["rows_compared"] > 0, batch1_kernels
    if " AVX2 = 1" in system_info():
        assert MULTIROW_TYPES[quant] in report["meta"]["kernels"]


@pytest.mark.parametrize("quant", KERNEL_TYPES)
def test_multirow_control_rounding_is_caught(tmp_path, kernel_models, quant):
    """The same audit with GGML_CPU_MULTIROW_CONTROL=1 (rows 1.. of a tile reduced in another
    order or rounded another way): every size from 2 up must differ, so the multi-row kernel of
    this type really ran and the audit sees it."""
    if " AVX2 = 1" not in system_info():
        pytest.skip("no multi-row kernels on this CPU")
    report = audit(tmp_path, kernel_models[quant], env={"GGML_CPU_MULTIROW_CONTROL": "1"}, max_tokens=24)
    assert report["bit_exact_sizes"] == [], report["summary"]
    assert all(row["rows_different"] > 0 for row in assert_every_size(report).values())
    assert report["batch1_kernels"]["bit_identical"]  # row 0, a batch of 1, is left alone


@pytest.mark.parametrize("quant", KERNEL_TYPES)
@pytest.mark.parametrize("batch1", ["1", "2"])
def test_multirow_control_on_every_row_is_caught_at_batch_1(tmp_path, kernel_models, quant, batch1):
    """GGML_CPU_MULTIROW_CONTROL=2 rounds every row of the multi-row kernels another way, a batch
    of 1 included. With batch 1 on the multi-row kernels (GGML_CPU_MULTIROW=1) batches then agree
    with each other; with batch 1 on the single-row kernels (2) they all differ from it. Either
    way the audit's batch-1 comparison of the two kernels must see it: batch 1 really runs this
    type's multi-row kernel under the setting that says so, and that comparison has power."""
    if " AVX2 = 1" not in system_info():
        pytest.skip("no multi-row kernels on this CPU")
    report = audit(tmp_path, kernel_models[quant], env={"GGML_CPU_MULTIROW_CONTROL": "2", "GGML_CPU_MULTIROW": batch1},
                   max_tokens=24)
    if batch1 == "1":
        assert_bit_exact(report)
    else:
        assert report["bit_exact_sizes"] == [], report["summary"]
        assert all(row["rows_different"] > 0 for row in assert_every_size(report).values())
    compared = report["batch1_kernels"]
    assert not compared["bit_identical"] and compared["rows_different"] == compared["rows_compared"] > 0, compared
    assert "Batch 1 differs between the multi-row and the single-row kernels" in report["summary"]


def test_stock_kernels_are_not_batch_invariant(tmp_path, kernel_models):
    """GGML_CPU_BATCH_INVARIANT=0 (stock kernels, same build): Q4_K from batch 4 on (repacked
    gemm) differs from batch 1 — the difference the patches remove."""
    report = audit(tmp_path, kernel_models["q4_k_s"], env={"GGML_CPU_BATCH_INVARIANT": "0"}, max_tokens=24)
    assert "stock kernels" in report["meta"]["kernels"]
    assert report["batch1_kernels"] is None  # stock kernels decode one token with the single-row ones
    assert all(size not in report["bit_exact_sizes"] for size in (4, 8, 16)), report["summary"]


def rows_alone(model: Model, tokens: list[int], size: int) -> np.ndarray:
    """Every row's logits of `tokens` decoded on the model's single sequence, `size` at a time."""
    return np.concatenate([model.eval(tokens[i : i + size], all_logits=True).copy() for i in range(0, len(tokens), size)])


def rows_shared(model: Model, seq: int, tokens: list[int], size: int) -> np.ndarray:
    """The same through decode_many on sequence `seq` of a shared cache."""
    return np.concatenate([model.decode_many([(seq, tokens[i : i + size], True)])[0] for i in range(0, len(tokens), size)])


def test_a_shared_round_decodes_every_row_as_the_sequence_alone(kernel_models, monkeypatch):
    """The server's shared batch: three sequences' 7 tokens each (21 rows) go through llama.cpp
    in decodes of at most 16 rows, so every row equals its sequence decoded alone. The control,
    the same round in one decode of 21 rows (stock kernels past 16), differs."""
    from llamaspec.llama import Model, ModelOptions

    system_info()
    path = kernel_models["q4_k_s"]
    texts = ["Once upon a time there was a girl", "The dog ran to the big red ball", "Tom and Sue went to the park"]
    with Model(path, ModelOptions(n_ctx=64)) as alone:
        seqs = [alone.tokenize(text)[:7] for text in texts]
        assert all(len(tokens) == 7 for tokens in seqs)
        want = []
        for tokens in seqs:
            alone.reset()
            want.append(alone.eval(tokens, all_logits=True).copy())
    with Model(path, ModelOptions(n_ctx=64, n_seq=3)) as shared:
        assert shared.exact_rows() == BATCH_MAX
        got = shared.decode_many([(seq, tokens, True) for seq, tokens in enumerate(seqs)])
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
        shared.reset()
        monkeypatch.setattr(shared, "exact_rows", lambda: 0)
        one_decode = shared.decode_many([(seq, tokens, True) for seq, tokens in enumerate(seqs)])
        assert any(not np.array_equal(g, w) for g, w in zip(one_decode, want))
        shared.reset()
        monkeypatch.undo()  # and the cache was left clean: in pieces again, equal again
        again = shared.decode_many([(seq, tokens, True) for seq, tokens in enumerate(seqs)])
        assert all(np.array_equal(g, w) for g, w in zip(again, want))


def test_a_shared_round_takes_prompts_in_pieces_where_the_server_chose_them(kernel_models):
    """With prompt_rows at the batch-invariant size (calibrate.choose_prompt_rows, the server's
    choice where it is faster), a 40-token prompt sharing a round with a generation step gives
    every row as the prompt decoded alone in 16-token evals, and the step as alone; in one
    decode of up to n_batch rows (stock kernels) the prompt's rows differ."""
    from llamaspec.calibrate import choose_prompt_rows
    from llamaspec.llama import Model, ModelOptions

    system_info()
    path = kernel_models["q4_k_s"]
    text = "Once upon a time there was a little girl who lived in a village near the forest. " * 4
    with Model(path, ModelOptions(n_ctx=128)) as alone:
        prompt, step = alone.tokenize(text)[:40], alone.tokenize("The dog ran")[:3]
        assert len(prompt) == 40
        want_prompt = rows_alone(alone, prompt, BATCH_MAX)
        alone.reset()
        want_step = alone.eval(step, all_logits=True).copy()
    with Model(path, ModelOptions(n_ctx=128, n_seq=2)) as shared:
        choice = choose_prompt_rows([shared])
        assert choice[path.name] in (shared.n_batch, BATCH_MAX)  # measured and remembered
        shared.prompt_rows = BATCH_MAX
        got_prompt, got_step = shared.decode_many([(0, prompt, True), (1, step, True)])
        np.testing.assert_array_equal(got_prompt, want_prompt)
        np.testing.assert_array_equal(got_step, want_step)
        shared.reset()
        shared.prompt_rows = shared.n_batch
        stock_prompt, stock_step = shared.decode_many([(0, prompt, True), (1, step, True)])
        assert not np.array_equal(stock_prompt, want_prompt)
        np.testing.assert_array_equal(stock_step, want_step)


def test_a_sequence_decodes_as_alone_wherever_its_cells_lie_in_the_shared_cache(kernel_models):
    """In the server's shared (unified) cache a sequence's cells lie between other sequences'
    cells, wherever cells were free. Two sequences of 300 tokens share every round, 12 rows
    each, the second with 4 more rows it then rolls back (a rejected draft: a gap the next round
    fills), so each sequence's cells interleave with the other's and cross the 256-cell
    mark at another place than alone: every row still equals the sequence decoded alone, as
    attention takes a row's cells in one pass, in cell order. F16 weights: the random model
    whose attention differed when rows were summed by lane or merged by 256-cell chunks."""
    from llamaspec.llama import Model, ModelOptions

    system_info()
    path = kernel_models["f16"]
    text = "Once upon a time there was a little girl who lived in a village near the forest. " * 30
    with Model(path, ModelOptions(n_ctx=512)) as alone:
        tokens = alone.tokenize(text)
        seqs, junk = [tokens[:300], tokens[9:309]], tokens[400:404]
        want = []
        for seq in seqs:
            alone.reset()
            want.append(rows_alone(alone, seq, 12))
    with Model(path, ModelOptions(n_ctx=512, n_seq=2)) as shared:
        got: list[list[np.ndarray]] = [[], []]
        for i in range(0, 300, 12):
            a, b = shared.decode_many([(0, seqs[0][i : i + 12], True), (1, seqs[1][i : i + 12] + junk, True)])
            got[0].append(a)
            got[1].append(b[: len(b) - len(junk)])
            shared.rollback(i + 12, seq=1)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(np.concatenate(g), w)


def test_a_running_sequence_never_takes_cells_below_its_own(kernel_models):
    """A finished request frees cells below a running sequence's. llama.cpp would place the
    running sequence's next tokens there (its search restarts at cell 0 when enough cells
    below the head are free), so attention would meet that sequence's cells out of position
    order, and sum them in another order than alone. The patched cache places a sequence's
    new tokens above its last cell: after the request in slot 0 (48 tokens) ends, the one in
    slot 1 decodes its next 96 rows exactly as alone. The next request in slot 0 fills the
    freed cells, then the only ones left, above slot 1's, and decodes exactly as alone too
    (in pieces of up to 16 rows, as the server's generation steps; a prompt's larger decodes
    have attention tiles of their own)."""
    from llamaspec.llama import Model, ModelOptions

    system_info()
    path = kernel_models["f16"]
    text = "Once upon a time there was a little girl who lived in a village near the forest. " * 10
    with Model(path, ModelOptions(n_ctx=256)) as alone:
        tokens = alone.tokenize(text)
        first, later, new = tokens[:48], tokens[48:144], tokens[:112]
        alone.eval(first)
        want = rows_alone(alone, later, 12)
        alone.reset()
        want_new = rows_alone(alone, new, 8)
    with Model(path, ModelOptions(n_ctx=128, n_seq=2)) as shared:  # 256 cells
        shared.decode_many([(0, tokens[100:148], True)])
        shared.decode_many([(1, first, True)])
        shared.rollback(0, seq=0)
        got = rows_shared(shared, 1, later, 12)
        np.testing.assert_array_equal(got, want)
        got_new = rows_shared(shared, 0, new, 8)
        np.testing.assert_array_equal(got_new, want_new)


def test_a_sequence_at_the_top_of_the_cache_still_takes_the_cells_freed_below(kernel_models):
    """Where no free cell lies above a sequence's last one, its tokens go where llama.cpp would
    put them (the order, and with it exactness, is lost, but the request goes on)."""
    from llamaspec.llama import Model, ModelOptions

    with Model(kernel_models["f16"], ModelOptions(n_ctx=128, n_seq=2)) as shared:  # 256 cells
        shared.decode_many([(0, list(range(10, 110)), True)])
        shared.decode_many([(1, list(range(20, 176)), True)])
        shared.rollback(0, seq=0)
        for i in range(0, 96, 12):
            shared.decode_many([(1, list(range(200 + i, 212 + i)), True)])
        assert shared.kv_tokens(1) == 252


@pytest.fixture
def multirow_settings():
    """The process's kernel settings (set_cpu_kernels), restored after the test; skips only on a
    CPU without multi-row kernels. Where the build lists them, a batch of 1 must have its second
    kernel: a missing switch or one turned off by the environment fails, not skips."""
    from llamaspec.llama import batch1_kernel_choice, cpu_kernel_settings, set_cpu_kernels

    if "MULTIROW = none" in system_info():
        pytest.skip("no multi-row kernels on this CPU")
    if batch1_kernel_choice() is None:
        pytest.fail(f"the build lists multi-row kernels but a batch of 1 has no choice of kernel "
                    f"(settings {cpu_kernel_settings()}; GGML_CPU_MULTIROW or GGML_CPU_BATCH_INVARIANT set?)")
    saved = cpu_kernel_settings()
    yield saved
    set_cpu_kernels(*saved)


def test_each_model_decodes_one_token_with_its_own_batch1_kernels(kernel_models, multirow_settings):
    """Model.batch1_kernels: the build's switch is one for the process, so a model with a batch-1
    choice of its own sets it before each one-token decode; larger batches (the same kernels
    under either choice) leave the process's settings as they are."""
    from llamaspec.llama import Model, ModelOptions, Multirow, cpu_kernel_settings, set_cpu_kernels

    batch_invariant, _, control = multirow_settings
    with (Model(kernel_models["q4_0"], ModelOptions(n_ctx=64)) as draft,
          Model(kernel_models["q4_k_s"], ModelOptions(n_ctx=64)) as target):
        draft.batch1_kernels = (batch_invariant, Multirow.ALL, control)
        target.batch1_kernels = (batch_invariant, Multirow.BATCHES, control)
        set_cpu_kernels(batch_invariant, Multirow.OFF, control)
        target.eval([1, 2, 3])
        assert cpu_kernel_settings()[1] == Multirow.OFF
        for model, mode in ((draft, Multirow.ALL), (target, Multirow.BATCHES), (draft, Multirow.ALL)):
            model.eval([5])
            assert cpu_kernel_settings()[1] == mode


def test_choose_batch1_kernels_gives_each_model_its_own(kernel_models, multirow_settings, monkeypatch):
    """calibrate.choose_batch1_kernels measures each model apart and leaves the process on the
    single-row kernels (one cache key, whatever ran before)."""
    from llamaspec.calibrate import choose_batch1_kernels
    from llamaspec.llama import Model, ModelOptions, Multirow, cpu_kernel_settings

    monkeypatch.delenv("GGML_CPU_MULTIROW", raising=False)
    batch_invariant, _, control = multirow_settings
    with (Model(kernel_models["q4_0"], ModelOptions(n_ctx=128)) as a,
          Model(kernel_models["q8_0"], ModelOptions(n_ctx=128)) as b):
        chosen = choose_batch1_kernels([a, b], repeats=3)
        assert set(chosen) == {a.path.name, b.path.name}
        for model in (a, b):
            assert model.batch1_kernels == (batch_invariant, chosen[model.path.name], control)
    assert cpu_kernel_settings() == (batch_invariant, Multirow.BATCHES, control)


def test_audit_sets_a_models_own_batch1_kernels_aside(kernel_models, multirow_settings):
    """The audit's batch-1 step switches the process to the other kernel; a model's own choice
    would switch it back before every one-token decode and compare a kernel with itself. With
    every multi-row row rounded another way (control 2), the comparison must still see the
    difference, and the model keep its choice afterwards."""
    from llamaspec.audit import run_audit
    from llamaspec.llama import Model, ModelOptions, Multirow, set_cpu_kernels

    batch_invariant = multirow_settings[0]
    set_cpu_kernels(batch_invariant, Multirow.BATCHES, 2)
    with Model(kernel_models["q4_0"], ModelOptions(n_ctx=128)) as model:
        model.batch1_kernels = (batch_invariant, Multirow.ALL, 2)
        report = run_audit(model, [model.tokenize("Once upon a time")], max_tokens=8, batch_max=2)
        assert model.batch1_kernels == (batch_invariant, Multirow.ALL, 2)
    assert report.batch1 is not None and report.batch1.rows_compared > 0
    assert not report.batch1.bit_identical


def test_q6_K_repack_agrees_with_the_unpacked_kernels(kernel_models):
    """cpp_patches/0005: with AVX512-VNNI, Q6_K weights are repacked 8 columns x 4 bytes and run
    through their own gemv and multi-row kernels, which round each block's exact integer dot
    product once where the unpacked kernel rounds 8 lane partials. So the logits must agree with
    the unrepacked model's (ModelOptions.repack=False) to float rounding, and not bit for bit:
    a mistake in the unpacking or the scales moves them by orders of magnitude more, and equal
    logits would mean the repack did not run."""
    from llamaspec.llama import Model, ModelOptions

    if " AVX512_VNNI = 1" not in system_info():
        pytest.skip("the Q6_K repack is for AVX512-VNNI CPUs")
    logits = {}
    for repack in (True, False):
        with Model(kernel_models["q6_k"], ModelOptions(n_threads=2, n_ctx=128, repack=repack)) as model:
            tokens = model.tokenize("Once upon a time there was a little girl who lived in a village", add_special=True)
            logits[repack] = model.eval(tokens, all_logits=True).copy()
    difference = np.abs(logits[True] - logits[False]).max()
    assert 0 < difference <= 1e-4 * np.abs(logits[False]).max(), difference


def _quantize_q8_K(function, x: np.ndarray) -> bytes:
    """One call of a ggml quantize_row_q8_K-shaped function on float32 x: the block_q8_K bytes."""
    out = ctypes.create_string_buffer(len(x) // 256 * (4 + 256 + 2 * 16))  # per block: d, qs, bsums
    function.argtypes, function.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    function(x.ctypes.data, out, len(x))
    return out.raw


def test_simd_activation_quantization_is_the_reference_bit_for_bit():
    """cpp_patches/0002: quantize_row_q8_K (every K-quant matmul's activations, stock paths too)
    runs in SIMD and must give quantize_row_q8_K_ref's bytes: exact ties at .5 after scaling
    (round half to even: checked to occur, so a round-half-away version fails), the first of two
    equal magnitudes setting the sign, zero blocks, NaNs, tiny values, long and short rows."""
    from llamaspec.llama import backend

    ggml = backend.ggml()
    simd, reference = ggml.quantize_row_q8_K, ggml.quantize_row_q8_K_ref
    rng = np.random.default_rng(7)
    ties = np.concatenate([[-127.0], np.arange(-127, 127) + 0.5, [0.0]])  # max -127: iscale 1, scaled x = x
    assert len(ties) == 256 and (np.abs(ties[1:-1] % 1) == 0.5).all()
    peaks = rng.uniform(-1, 1, 2048)
    peaks[7::256], peaks[9::256] = -5.0, 5.0
    peaks[256:512] = 0.0
    with_nan = rng.uniform(-3, 3, 1536)
    with_nan[[5, 300, 1000]] = np.nan
    cases = [rng.uniform(-2, 2, 8960), np.round(rng.uniform(-2, 2, 8960) * 8) / 8, rng.uniform(-1e-30, 1e-30, 1536),
             np.tile(ties, 6), peaks, with_nan]
    for x in cases:
        x = np.ascontiguousarray(x, dtype=np.float32)
        assert _quantize_q8_K(simd, x) == _quantize_q8_K(reference, x)
    quantized = np.frombuffer(_quantize_q8_K(simd, np.ascontiguousarray(ties, dtype=np.float32)), dtype=np.int8)[4:260]
    assert list(quantized[1:5]) == [-126, -126, -124, -124]  # -126.5 .. -123.5: ties to even


def _f16_multi(ggml, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """Every weight row's dot product with every activation row (F16, as ggml stores them), from
    one call of ggml_vec_dot_f16_multi: [activation row, weight row]."""
    (rows, n), ncols = weights.shape, len(activations)
    out = np.zeros((ncols, rows), dtype=np.float32)
    vy = (ctypes.c_void_p * ncols)(*(activations[c].ctypes.data for c in range(ncols)))
    s = (ctypes.c_void_p * ncols)(*(out[c].ctypes.data for c in range(ncols)))
    ggml.ggml_vec_dot_f16_multi.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    ggml.ggml_vec_dot_f16_multi(n, weights.ctypes.data, weights.strides[0], rows, vy, s, ncols)
    return out


def _f16_single(ggml, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """The same from ggml_vec_dot_f16 (the single-row kernel), pair by pair."""
    (rows, n), ncols = weights.shape, len(activations)
    out = np.zeros((ncols, rows), dtype=np.float32)
    ggml.ggml_vec_dot_f16.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for c in range(ncols):
        for r in range(rows):
            ggml.ggml_vec_dot_f16(n, out[c, r:].ctypes.data, 0, weights[r].ctypes.data, 0, activations[c].ctypes.data, 0, 1)
    return out


@pytest.mark.parametrize("n", [8960, 4099, 1536, 200])
def test_f16_multirow_kernel_is_the_single_row_kernel_bit_for_bit(n, multirow_settings):
    """The F16 multi-row kernel against ggml_vec_dot_f16, every pair, for 1..16 activation rows and
    37 weight rows (tiles and a leftover row): rows of 8960 (Qwen 1.5B's ffn_down) and 4099 (a
    3-element tail) are long enough to be computed in pieces (cpp_patches/0017), 1536 and 200 are
    not. With the test control on, rows 1.. must differ (sums of random signs depend on the order)."""
    from llamaspec.llama import backend, set_cpu_kernels

    ggml = backend.ggml()
    rng = np.random.default_rng(n)
    weights = rng.normal(0, 1, (37, n)).astype(np.float16)
    activations = rng.normal(0, 1, (BATCH_MAX, n)).astype(np.float16)
    single = _f16_single(ggml, weights, activations)
    for ncols in range(1, BATCH_MAX + 1):
        assert _f16_multi(ggml, weights, activations[:ncols]).tobytes() == single[:ncols].tobytes(), ncols
    set_cpu_kernels(multirow_settings[0], multirow_settings[1], 1)
    multi = _f16_multi(ggml, weights, activations[:6])
    assert multi[0].tobytes() == single[0].tobytes()
    assert all((multi[c] != single[c]).any() for c in range(1, 6))


_Q8_K_BLOCK = 292  # bytes: float d, 256 int8 quants, 16 int16 bsums
# block bytes; where the quants (and high bits) lie; the scales; the fp16 scales of the block
_K_QUANTS = {"q5_K": (176, slice(16, 176), slice(4, 16), slice(0, 4)),     # d, dmin, 12 scale bytes, qh, qs
             "q6_K": (210, slice(0, 192), slice(192, 208), slice(208, 210))}  # ql, qh, 16 int8 scales, d


def _k_quant_rows(rng: np.random.Generator, kind: str, rows: int, n: int, extreme: bool) -> np.ndarray:
    """Random Q5_K / Q6_K weight rows (uint8, a row per line); extreme: every quant and scale
    byte at its largest (Q6_K scales -128 / 127), the largest products the kernels' 16-bit sums
    take."""
    size, quants, scales, halves = _K_QUANTS[kind]
    blocks = np.empty((rows * n // 256, size), dtype=np.uint8)
    blocks[:, quants] = 255 if extreme else rng.integers(0, 256, (len(blocks), quants.stop - quants.start))
    if kind == "q6_K" and extreme:
        blocks[:, scales] = np.tile(np.array([-128, 127], dtype=np.int8).view(np.uint8), 8)
    else:
        blocks[:, scales] = 255 if extreme else rng.integers(0, 256, (len(blocks), scales.stop - scales.start))
    count = (halves.stop - halves.start) // 2
    blocks[:, halves] = rng.uniform(1e-3, 1e-2, (len(blocks), count)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _q8_K_extreme(n: int, value: int) -> np.ndarray:
    """A Q8_K row of one quant value throughout (d 1.0, bsums to match)."""
    block = np.zeros(_Q8_K_BLOCK, dtype=np.uint8)
    block[:4] = np.frombuffer(np.float32(1.0).tobytes(), dtype=np.uint8)
    block[4:260] = np.int8(value).view(np.uint8)
    block[260:] = np.full(16, 16 * value, dtype=np.int16).view(np.uint8)
    return np.tile(block, n // 256)


def _k_quant_multi(ggml, kind: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_{kind}_q8_K_multi, one call per weight row: [activation row, weight row]."""
    (rows, size), ncols = weights.shape, len(activations)
    out = np.zeros((ncols, rows), dtype=np.float32)
    fn = getattr(ggml, f"ggml_vec_dot_{kind}_q8_K_multi")
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_int]
    vy = (ctypes.c_void_p * ncols)(*(activations[c].ctypes.data for c in range(ncols)))
    for r in range(rows):
        s = (ctypes.c_void_p * ncols)(*(out[c, r:].ctypes.data for c in range(ncols)))
        fn(size // _K_QUANTS[kind][0] * 256, weights[r].ctypes.data, size, 1, vy, s, ncols)
    return out


def _k_quant_single(ggml, kind: str, weights: np.ndarray, activations: np.ndarray) -> np.ndarray:
    """The same from ggml_vec_dot_{kind}_q8_K (the single-row kernel), pair by pair."""
    (rows, size), ncols = weights.shape, len(activations)
    out = np.zeros((ncols, rows), dtype=np.float32)
    fn = getattr(ggml, f"ggml_vec_dot_{kind}_q8_K")
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.c_size_t, ctypes.c_int]
    for c in range(ncols):
        for r in range(rows):
            fn(size // _K_QUANTS[kind][0] * 256, out[c, r:].ctypes.data, 0, weights[r].ctypes.data, 0,
               activations[c].ctypes.data, 0, 1)
    return out


@pytest.mark.parametrize("n", [8960, 1536, 256])
@pytest.mark.parametrize("kind", ["q5_K", "q6_K"])
def test_k_quant_multirow_kernels_are_the_single_row_kernels_bit_for_bit(kind, n, multirow_settings):
    """The Q5_K and Q6_K multi-row kernels against the single-row ones, every pair, for 1..16
    activation rows: random blocks, and blocks of the largest quants and scales against rows of
    -128 and of 127 (a 16-bit sum that overflowed would differ). Without VNNI the Q6_K kernel
    takes its activations in word pairs (cpp_patches/0018, ggml_q8_K_multirow_word_pairs, as
    mul_mat prepares them): there the random activations as they are must give other results.
    With the test control on, rows 1.. must differ."""
    from llamaspec.llama import backend, set_cpu_kernels

    ggml = backend.ggml()
    if kind.upper() + "," not in system_info():  # the build lists the types its multi-row kernels cover here
        pytest.skip(f"no {kind} multi-row kernel on this CPU (AVX2 only)")
    assert hasattr(ggml, f"ggml_vec_dot_{kind}_q8_K_multi"), "the build lists the kernel but does not export it"
    rng = np.random.default_rng(n)
    plain = np.stack([np.frombuffer(_quantize_q8_K(ggml.quantize_row_q8_K, rng.normal(0, 1, n).astype(np.float32)),
                                    dtype=np.uint8) for _ in range(BATCH_MAX - 2)]
                     + [_q8_K_extreme(n, -128), _q8_K_extreme(n, 127)])
    prepared = plain.copy()
    pairs = kind == "q6_K" and hasattr(ggml, "ggml_q8_K_multirow_word_pairs")
    if pairs:
        ggml.ggml_q8_K_multirow_word_pairs.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        for row in prepared:
            ggml.ggml_q8_K_multirow_word_pairs(row.ctypes.data, n)
    for extreme in (True, False):  # the random weights last, for the checks after
        weights = _k_quant_rows(rng, kind, 9, n, extreme)
        single = _k_quant_single(ggml, kind, weights, plain)
        for ncols in range(1, BATCH_MAX + 1):
            rows = slice(BATCH_MAX - ncols, None)  # the extreme rows in every batch
            multi = _k_quant_multi(ggml, kind, weights, prepared[rows])
            assert multi.tobytes() == single[rows].tobytes(), (extreme, ncols)
    if pairs:
        random = slice(0, BATCH_MAX - 2)  # a row of one value throughout is its own word pairs
        assert (_k_quant_multi(ggml, kind, weights, plain[random]) != single[random]).any(axis=1).all()
    set_cpu_kernels(multirow_settings[0], multirow_settings[1], 1)
    multi = _k_quant_multi(ggml, kind, weights, prepared[:6])
    assert multi[0].tobytes() == single[0].tobytes()
    assert all((multi[c] != single[c]).any() for c in range(1, 6))


_HUGE_PAGE_PROBE = """
import sys
from pathlib import Path
from llamaspec.llama import Model, ModelOptions

def hinted_kib():  # this process's mappings marked MADV_HUGEPAGE (the "hg" VmFlag)
    total = size = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            size = int(line.split()[1])
        elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
            total += size
    return total

path, huge = sys.argv[1], sys.argv[2] == "huge"
before = hinted_kib()
with Model(path, ModelOptions(n_ctx=64, huge_pages=huge)):
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    print(hinted_kib() - before, path in Path("/proc/self/maps").read_text(), status["THP_enabled"].strip())
"""


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage").is_dir(), reason="a Linux kernel with THP")
def test_weights_are_read_onto_huge_page_hinted_memory(kernel_models):
    """cpp_patches/0004 + ModelOptions.huge_pages: on Linux a CPU model's GGUF is read, not
    mapped, into buffers ggml marks for transparent huge pages (a decode streams every weight;
    4 KiB pages cost a TLB miss per 4 KiB). The F32 random model's weights are ~6 MiB, one
    buffer: it must not be mapped from its file, and the hinted memory must grow by its size
    (less the last partial 2 MiB, which ggml leaves on small pages). Without huge pages (the
    default: they load slowly on some VMs) the file is mapped as llama.cpp does and the
    process has THP off. In a fresh process: in this one, malloc may place the buffer in
    memory an earlier test's buffer already hinted."""
    path = kernel_models["f32"]
    system_info()
    env = {k: v for k, v in os.environ.items() if k != "LLAMASPEC_MMAP"}

    def probe(mode: str) -> tuple[int, str, str]:
        done = subprocess.run([sys.executable, "-c", _HUGE_PAGE_PROBE, str(path), mode], capture_output=True,
                              text=True, cwd=REPO, env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        grown, mapped, thp = done.stdout.split()
        return int(grown), mapped, thp

    grown, mapped, thp = probe("huge")
    assert (mapped, thp) == ("False", "1")
    assert grown >= path.stat().st_size / 1024 - 2048, (grown, path.stat().st_size)
    grown, mapped, thp = probe("small")
    assert (mapped, thp) == ("True", "0")
    assert grown < path.stat().st_size / 1024 - 2048, grown
