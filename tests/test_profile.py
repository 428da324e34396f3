"""llama/profile.py: every graph node timed alone, matrix products by their weights' type."""

from __future__ import annotations

import numpy as np
import pytest

from llamaspec.errors import LlamaSpecError
from llamaspec.llama import Model, ModelOptions
from llamaspec.llama.profile import by_operation


def test_by_operation_sums_matrix_products_by_weight_type():
    nodes = [("MUL_MAT q4_K", 2.0), ("RMS_NORM", 0.5), ("MUL_MAT q6_K", 3.0), ("MUL_MAT q4_K", 1.0),
             ("FLASH_ATTN_EXT", 0.25), ("MUL_MAT_ID q8_0", 4.0), ("ADD", 0.5)]
    assert by_operation(nodes) == {"q4_K": 3.0, "q6_K": 3.0, "q8_0": 4.0, "attention": 0.25, "other": 1.0}


@pytest.mark.parametrize("fixture, weights", [("stories", "f32"), ("tiny_random", "f16")])
def test_every_matrix_product_is_timed_and_the_numbers_do_not_change(request, fixture, weights):
    path = request.getfixturevalue(fixture)
    options = ModelOptions(n_ctx=64, flash_attn="on")
    with Model(path, options) as plain, Model(path, ModelOptions(n_ctx=64, flash_attn="on", profile_ops=True)) as model:
        tokens = model.tokenize("Once upon a time there was")
        assert plain.op_timer is None
        expected = plain.eval(tokens, all_logits=True).copy()
        assert np.array_equal(model.eval(tokens, all_logits=True), expected)  # node by node, same numbers
        nodes = model.op_timer.take()
        assert model.op_timer.take() == []
        # q, k, v, output, gate, up, down per layer, and the output head
        assert sum(op == f"MUL_MAT {weights}" for op, _ in nodes) == 7 * model.n_layer + 1
        parts = by_operation(nodes)
        assert set(parts) == {weights, "attention", "other"}
        assert all(ms >= 0 for ms in parts.values()) and parts[weights] > 0
        model.eval(tokens[:1])  # each take() holds one eval's nodes
        assert sum(op == f"MUL_MAT {weights}" for op, _ in model.op_timer.take()) == 7 * model.n_layer + 1


def test_a_struct_layout_that_does_not_match_is_one_clear_error(stories, monkeypatch):
    with Model(stories, ModelOptions(n_ctx=64, profile_ops=True)) as model:
        timer = model.op_timer
        timer._checked = False
        monkeypatch.setattr(timer, "_get_name", lambda _pointer: b"not this node")
        model.eval(model.tokenize("Once upon a time"))
        with pytest.raises(LlamaSpecError, match="struct ggml_tensor"):
            timer.take()
