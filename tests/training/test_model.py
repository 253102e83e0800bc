"""The Llama decoder: shapes, causality, RoPE, GQA, init statistics, FLOP counting, and that it learns."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from training.errors import ConfigError
from training.model import (
    DEFAULT_SDPA_PRIORITY,
    MODEL_PRESETS,
    SDPA_PRIORITIES,
    ModelConfig,
    Transformer,
    apply_rope,
    build_model_config,
    count_params,
    flops_per_token,
    num_params,
    rope_cos_sin,
    set_sdpa_priority,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(**overrides) -> ModelConfig:
    return build_model_config("tiny", **overrides)


def built(cfg: ModelConfig, seed: int = 0) -> Transformer:
    model = Transformer(cfg)
    model.init_weights(seed=seed)
    return model


def test_forward_gives_logits_per_position():
    model = built(tiny())
    tokens = torch.randint(0, 256, (3, 17))
    assert model(tokens).shape == (3, 17, 320)


def test_changing_a_later_token_leaves_earlier_logits_unchanged():
    model = built(tiny())
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 256
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :7], after[:, :7], rtol=0, atol=0)
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_rope_rotation_preserves_norm_and_scores_depend_only_on_offset():
    head_dim, seq_len = 16, 32
    cos, sin = rope_cos_sin(seq_len, head_dim, 10000.0, torch.device("cpu"))
    q = torch.randn(head_dim).expand(1, 1, seq_len, head_dim)
    k = torch.randn(head_dim).expand(1, 1, seq_len, head_dim)
    rq, rk = apply_rope(q, cos, sin)[0, 0], apply_rope(k, cos, sin)[0, 0]
    torch.testing.assert_close(rq.norm(dim=-1), q[0, 0].norm(dim=-1))
    # the same vectors at positions (i, j) score alike for every pair with the same j - i
    scores = rq @ rk.T
    torch.testing.assert_close(scores[3, 5], scores[20, 22], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores[10, 0], scores[30, 20], rtol=1e-5, atol=1e-5)
    assert not torch.isclose(scores[3, 5], scores[3, 9])
    # position 0 is not rotated
    torch.testing.assert_close(rq[0], q[0, 0, 0])


def test_grouped_query_attention_has_fewer_kv_projections():
    cfg = tiny(dim=64, n_heads=8, n_kv_heads=2)
    attention = Transformer(cfg).layers[0].attention
    assert attention.wq.weight.shape == (64, 64)
    assert attention.wk.weight.shape == (16, 64)  # 2 kv heads x head_dim 8
    assert attention.wv.weight.shape == (16, 64)


def test_gqa_equals_multi_head_attention_with_repeated_kv_heads():
    """Grouped-query attention is MHA whose k/v heads are shared: copying each kv head over its group of
    query heads into an MHA model gives the same logits."""
    gqa = built(tiny(n_heads=4, n_kv_heads=2))
    mha = Transformer(tiny(n_heads=4, n_kv_heads=4))
    state = gqa.state_dict()
    for name, value in list(state.items()):
        if name.endswith(("wk.weight", "wv.weight")):  # [2 * head_dim, dim] -> [4 * head_dim, dim]
            state[name] = (
                value.view(2, -1, value.shape[1]).repeat_interleave(2, dim=0).reshape(-1, value.shape[1])
            )
    mha.load_state_dict(state)
    tokens = torch.randint(0, 256, (2, 10))
    torch.testing.assert_close(gqa(tokens), mha(tokens), rtol=1e-5, atol=1e-5)


def test_init_is_a_function_of_the_seed_and_has_the_documented_scales():
    a, b, c = built(tiny(), seed=1), built(tiny(), seed=1), built(tiny(), seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        if "norm" not in name:
            assert not torch.equal(pa, pc), name
    big = built(build_model_config("tiny", dim=256, ffn_dim=512, n_heads=4, n_kv_heads=2, n_layers=4))
    assert big.tok_embeddings.weight.std().item() == pytest.approx(1.0, rel=0.05)
    # truncation at 2 std shrinks the std by a factor of ~0.88
    assert big.layers[0].attention.wq.weight.std().item() == pytest.approx(0.02 * 0.88, rel=0.05)
    assert big.layers[3].feed_forward.w2.weight.std().item() == pytest.approx(
        0.02 / math.sqrt(8) * 0.88, rel=0.05
    )
    assert big.output.weight.abs().max().item() <= 3 * 256**-0.5
    assert torch.equal(big.norm.weight, torch.ones(256))


def test_count_params_matches_the_built_model_for_every_preset():
    for name in MODEL_PRESETS:
        cfg = build_model_config(name)
        with torch.device("meta"):  # shapes only: a 70B model costs no memory here
            model = Transformer(cfg)
        assert count_params(cfg) == num_params(model), name
    assert count_params(build_model_config("llama3-8b")) == 8_030_261_248  # Meta's 8.03B
    assert count_params(build_model_config("llama3-70b")) == 70_553_706_496  # Meta's 70.6B
    # 1b: Llama-3.2-1B's 1,235,814,400 plus the untied output head (128256 x 2048)
    assert count_params(build_model_config("1b")) == 1_235_814_400 + 128256 * 2048


def test_flops_per_token_by_hand():
    cfg = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, vocab_size=256)
    # per block: wq 64*64 + wk 64*32 + wv 64*32 + wo 64*64 = 12288; ffn 3*64*192 = 36864; norms 128
    block = 12288 + 36864 + 128
    non_embedding = 2 * block + 64 + 64 * 256  # + final norm + output head
    assert count_params(cfg, include_embedding=False) == non_embedding
    expected = 6 * non_embedding + 12 * 2 * 64 * 128  # attention: 12 * layers * dim * seq_len
    assert flops_per_token(cfg, 128) == expected
    assert flops_per_token(cfg, 256) - flops_per_token(cfg, 128) == 12 * 2 * 64 * 128


def test_tiny_model_learns_a_deterministic_successor_task():
    torch.manual_seed(0)
    model = built(tiny())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    successor = torch.randperm(256)
    losses = []
    for _ in range(40):
        tokens = torch.empty(8, 33, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, 256, (8,))
        for j in range(1, 33):
            tokens[:, j] = successor[tokens[:, j - 1]]
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(256), rel=0.15)
    assert sum(losses[-5:]) / 5 < 0.3 * losses[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_heads", 5, "model.n_heads=5: allowed: a divisor of model.dim (64)"),
        ("n_kv_heads", 3, "model.n_kv_heads=3: allowed: a divisor of model.n_heads (4)"),
        ("dim", 0, "model.dim=0: allowed: an integer >= 1"),
        ("vocab_size", 2.5, "model.vocab_size=2.5: allowed: an integer >= 1"),
        ("rope_theta", -1.0, "model.rope_theta=-1.0: allowed: a finite number > 0"),
        (
            "preset",
            "13b",
            "model.preset='13b': allowed: tiny, 125m, 1b, llama3-8b, llama3-70b or '' (custom)",
        ),
    ],
)
def test_invalid_model_config_names_the_field(field, value, message):
    cfg = ModelConfig(**{field: value})
    with pytest.raises(ConfigError) as excinfo:
        cfg.validate()
    assert str(excinfo.value) == message


def test_odd_head_dim_is_rejected_for_rope():
    with pytest.raises(ConfigError, match=r"model.n_heads=4: .*even head_dim .*= 15\)"):
        ModelConfig(dim=60, n_heads=4, n_kv_heads=2).validate()


def sdpa_order() -> list:
    """This process's scaled_dot_product_attention backends, in priority order (torch's own reader)."""
    from torch.nn.attention import _cur_sdpa_kernel_backends

    return _cur_sdpa_kernel_backends(with_priority=True)


def test_the_attention_order_is_set_for_the_process_and_a_model_sets_the_default_only_if_none_was():
    try:
        set_sdpa_priority("flash")
        Transformer(tiny())  # the bench sets its order before it builds: the model keeps it
        assert sdpa_order()[:4] == SDPA_PRIORITIES["flash"]
        set_sdpa_priority(DEFAULT_SDPA_PRIORITY)
        assert sdpa_order()[:4] == SDPA_PRIORITIES["cudnn"]
        with pytest.raises(ConfigError) as excinfo:
            set_sdpa_priority("xformers")
        assert str(excinfo.value) == "sdpa priority 'xformers': allowed: cudnn, flash"
        assert sdpa_order()[:4] == SDPA_PRIORITIES["cudnn"]  # a refused name changes nothing
    finally:
        set_sdpa_priority(DEFAULT_SDPA_PRIORITY)


def test_a_compiled_blocks_graph_is_one_aot_autograds_cache_keeps():
    """A sdpa_kernel block inside the compiled region put its calls into the graph, and AOTAutograd's cache
    bypassed it: a warm restart traced and partitioned every block's forward and backward again. The check is
    the cache's own (check_cacheable raises BypassAOTAutogradCache), on the graph dynamo gives Inductor."""
    from torch._functorch._aot_autograd.autograd_cache import check_cacheable

    model = built(tiny())
    graphs = []

    def keep_graph(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    tokens = torch.randint(0, 256, (2, 16))
    cos, sin = rope_cos_sin(16, model.cfg.head_dim, model.cfg.rope_theta, tokens.device, model.cfg)
    torch._dynamo.reset()
    try:
        block = torch.compile(model.layers[0], backend=keep_graph, fullgraph=True)
        block(model.tok_embeddings(tokens), cos, sin)
    finally:
        torch._dynamo.reset()
    (graph,) = graphs
    assert any(node.target is F.scaled_dot_product_attention for node in graph.graph.nodes)
    check_cacheable(graph)
