"""The verifier side of tree drafts: a 4-D tree mask with explicit position ids scores every node as if its
root-to-node path were run alone, and ``keep_slots`` gathers any kept set of new slots into place."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.runners import CausalLMRunner, UnsupportedModelError
from tiny_models import VOCAB, make_model

MODELS = {arch: make_model(arch) for arch in ("llama", "gpt2", "qwen3")}
TOL = dict(rtol=1e-4, atol=1e-4)


def _paths(parents: list[int]) -> list[list[int]]:
    """Root-to-node index paths of a tree given as parent indices (-1: child of the committed prefix)."""
    out = []
    for i, p in enumerate(parents):
        out.append((out[p] if p >= 0 else []) + [i])
    return out


def _tree(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tree mask [n, n]: node i sees its ancestors and itself, depth [n])."""
    paths = _paths(parents)
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool, device="cpu")
    for i, path in enumerate(paths):
        mask[i, path] = True
    return mask, torch.tensor([len(p) - 1 for p in paths], dtype=torch.long, device="cpu")


# a tree: node i's parent is any earlier node or the prefix
trees = st.integers(1, 7).flatmap(lambda n: st.tuples(*[st.integers(-1, i - 1) for i in range(n)]))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(sorted(MODELS)), prompt_len=st.integers(1, 9), parents=trees, data=st.data())
def test_tree_pass_scores_each_node_like_its_path_alone(arch, prompt_len, parents, data):
    model = MODELS[arch]
    gen = torch.Generator(device="cpu").manual_seed(prompt_len * 31 + len(parents))
    prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=gen, device="cpu")
    nodes = torch.randint(3, VOCAB, (1, len(parents)), generator=gen, device="cpu")
    runner = CausalLMRunner(model)
    session, _ = runner.prefill(prompt, None, 64)
    mask, depth = _tree(list(parents))
    positions = (prompt_len + depth).unsqueeze(0)
    tree_logits = session.forward(nodes, position_ids=positions, tree_mask=mask.unsqueeze(0)).logits[0]
    paths = _paths(list(parents))
    for i, path in enumerate(paths):
        _, alone = runner.prefill(torch.cat([prompt, nodes[:, path]], dim=1), None, 64)
        torch.testing.assert_close(tree_logits[i], alone.logits[0], **TOL)
    # keep one root-to-leaf path: the cache then equals a fresh prefill of prompt + path
    leaf = data.draw(st.integers(0, len(parents) - 1))
    keep = torch.zeros(1, len(parents), dtype=torch.bool, device="cpu")
    keep[0, paths[leaf]] = True
    session.keep_slots(keep)
    assert session.length == prompt_len + len(paths[leaf]) and int(session.counts[0]) == session.length
    probe = torch.tensor([[5]], device="cpu")
    _, fresh = runner.prefill(torch.cat([prompt, nodes[:, paths[leaf]], probe], dim=1), None, 64)
    torch.testing.assert_close(session.forward(probe).logits[0, -1], fresh.logits[0], **TOL)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(sorted(MODELS)), lens=st.lists(st.integers(1, 8), min_size=2, max_size=3),
       n=st.integers(1, 6), data=st.data())
def test_keep_slots_keeps_any_subset_per_row(arch, lens, n, data):
    """Ragged batch: each row keeps its own subset of the n new tokens; every row then continues exactly as a
    fresh single-row prefill of its prompt + kept tokens (as positions were assigned by count)."""
    model = MODELS[arch]
    gen = torch.Generator(device="cpu").manual_seed(sum(lens) * 7 + n)
    prompts = [torch.randint(3, VOCAB, (m,), generator=gen, device="cpu") for m in lens]
    width = max(lens)
    ids = torch.zeros(len(lens), width, dtype=torch.long, device="cpu")
    mask = torch.zeros(len(lens), width, dtype=torch.bool, device="cpu")
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, True
    runner = CausalLMRunner(model)
    session, _ = runner.prefill(ids, mask, 64)
    new = torch.randint(3, VOCAB, (len(lens), n), generator=gen, device="cpu")
    keep = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=n, max_size=n), min_size=len(lens),
                                           max_size=len(lens))), dtype=torch.bool, device="cpu")
    # a chain forward: kept tokens that are not a prefix see dropped ones, so score the block as a tree
    # in which each token sees only the kept tokens before it (the shape of an accepted path)
    tree = torch.tril(torch.ones(n, n, dtype=torch.bool, device="cpu")).unsqueeze(0) & (keep.unsqueeze(1) | torch.eye(n, dtype=torch.bool, device="cpu"))
    before = session.counts.clone()
    order = keep.long().cumsum(dim=1) - 1
    positions = before.unsqueeze(1) + order.clamp_min(0)
    session.forward(new, position_ids=positions, tree_mask=tree)
    session.keep_slots(keep)
    assert session.counts.tolist() == (before + keep.sum(dim=1)).tolist()
    probe = torch.full((len(lens), 1), 7, dtype=torch.long, device="cpu")
    got = session.forward(probe).logits[:, -1]
    for r, p in enumerate(prompts):
        row = torch.cat([p, new[r][keep[r]], probe[r]]).unsqueeze(0)
        _, ref = runner.prefill(row, None, 64)
        torch.testing.assert_close(got[r], ref.logits[0], **TOL)


def test_prefix_keep_slots_equals_keep_and_copies_nothing():
    model = MODELS["llama"]
    runner = CausalLMRunner(model)
    a, _ = runner.prefill(torch.tensor([[4, 5, 6]], device="cpu"), None, 32)
    b, _ = runner.prefill(torch.tensor([[4, 5, 6]], device="cpu"), None, 32)
    block = torch.tensor([[7, 8, 9, 10]], device="cpu")
    a.forward(block)
    b.forward(block)
    pointers = [layer.keys.data_ptr() for layer in a.cache.layers]
    snapshot = [layer.keys[:, :, :7].clone() for layer in a.cache.layers]
    a.keep_slots(torch.tensor([[True, True, False, False]], device="cpu"))
    b.keep(b.counts - 2)
    assert a.length == b.length == 5 and torch.equal(a.valid, b.valid) and torch.equal(a.counts, b.counts)
    assert [layer.keys.data_ptr() for layer in a.cache.layers] == pointers
    assert all(torch.equal(layer.keys[:, :, :7], s) for layer, s in zip(a.cache.layers, snapshot))


def test_keep_slots_rejects_bad_input():
    runner = CausalLMRunner(MODELS["llama"])
    session, _ = runner.prefill(torch.tensor([[4, 5, 6]], device="cpu"), None, 32)
    session.forward(torch.tensor([[7, 8]], device="cpu"), valid=torch.tensor([[False, True]], device="cpu"))
    with pytest.raises(ValueError, match="holds no real token"):
        session.keep_slots(torch.tensor([[True, True]], device="cpu"))
    with pytest.raises(ValueError, match="keep must be"):
        session.keep_slots(torch.ones(2, 2, dtype=torch.bool, device="cpu"))


def test_tree_masks_refused_where_they_would_be_ignored():
    llama = make_model("llama")
    llama.config._attn_implementation = "flash_attention_2"
    runner = CausalLMRunner(llama)
    with pytest.raises(UnsupportedModelError, match="ignores custom 4-D masks"):
        runner.check_tree_masks()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(sorted(MODELS)), prompt_len=st.integers(1, 6), parents=trees, split=st.integers(1, 6))
def test_tree_over_several_forwards_scores_each_node_like_its_path_alone(arch, prompt_len, parents, split):
    """A model drafter grows its tree depth by depth: a later forward's mask spans the tree slots written by
    earlier ones (``tree_mask [1, n, t]``, ``t > n``); every node still sees exactly its ancestors."""
    model = MODELS[arch]
    parents = list(parents)
    split = min(split, len(parents))
    gen = torch.Generator(device="cpu").manual_seed(prompt_len * 17 + len(parents))
    prompt = torch.randint(3, VOCAB, (1, prompt_len), generator=gen, device="cpu")
    nodes = torch.randint(3, VOCAB, (1, len(parents)), generator=gen, device="cpu")
    runner = CausalLMRunner(model)
    session, _ = runner.prefill(prompt, None, 64)
    mask, depth = _tree(parents)
    logits = []
    for lo, hi in ((0, split), (split, len(parents))):
        if hi > lo:
            out = session.forward(nodes[:, lo:hi], position_ids=(prompt_len + depth[lo:hi]).unsqueeze(0),
                                  tree_mask=mask[lo:hi, :hi].unsqueeze(0))
            logits.append(out.logits[0])
    logits = torch.cat(logits)
    for i, path in enumerate(_paths(parents)):
        _, alone = runner.prefill(torch.cat([prompt, nodes[:, path]], dim=1), None, 64)
        torch.testing.assert_close(logits[i], alone.logits[0], **TOL)
