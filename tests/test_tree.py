"""Tree buffers checked entry by entry on small hand-written trees."""

import numpy as np
import pytest

from ppd_core.static_trees import STATIC_TREES
from ppd_core.tree import TreeSpec, build_tree, family_from_spec, root_only_tree

# root with 2 prompt tokens; candidates (0) with 1, (1) with 0, (0, 0) with 1; n = 2
HAND = TreeSpec({(): 2, (0,): 1, (1,): 0, (0, 0): 1})


def test_layout_and_positions():
    tree = build_tree(HAND, num_prompt_tokens=2)
    assert tree.paths == ((), (0,), (1,), (0, 0))
    assert tree.parents == (-1, 0, 0, 1)
    assert tree.node_paths == ((0,), (0, 1), (0, 2), (0, 1, 3))
    # tokens: 0 root, 1 (0), 2 (1), 3 (0,0), 4 root.p1, 5 root.p2, 6 (0).p1, 7 (0,0).p1
    assert tree.num_tokens == 8 == HAND.num_tokens
    assert tree.position_offsets.tolist() == [0, 1, 1, 2, 1, 2, 2, 3]
    assert tree.candidate_depths.tolist() == [1, 1, 2]
    assert tree.candidate_ranks.tolist() == [0, 1, 0]
    assert tree.prompt_embedding_index.tolist() == [0, 1, 0, 0]  # k * V + j
    assert tree.prompt_slots[:, :, 0].tolist() == [[4, 5], [6, -1], [-1, -1], [7, -1]]


def test_mask_entry_by_entry():
    tree = build_tree(HAND, num_prompt_tokens=2)
    expected = [
        # 0  1  2  3  4  5  6  7
        [1, 0, 0, 0, 0, 0, 0, 0],  # root
        [1, 1, 0, 0, 0, 0, 0, 0],  # (0)
        [1, 0, 1, 0, 0, 0, 0, 0],  # (1)
        [1, 1, 0, 1, 0, 0, 0, 0],  # (0, 0)
        [1, 0, 0, 0, 1, 0, 0, 0],  # root prompt 1
        [1, 0, 0, 0, 1, 1, 0, 0],  # root prompt 2 sees prompt 1
        [1, 1, 0, 0, 0, 0, 1, 0],  # (0) prompt 1
        [1, 1, 0, 1, 0, 0, 0, 1],  # (0, 0) prompt 1
    ]
    assert tree.attention_mask.dtype == np.bool_ and tree.attention_mask.astype(int).tolist() == expected


def test_buffers_are_numpy_arrays():
    """Backends convert at their edge: the tree itself holds int64 index arrays and a bool mask."""
    tree = build_tree(HAND, num_prompt_tokens=2)
    for name in ("candidate_depths", "candidate_ranks", "position_offsets", "prompt_embedding_index", "prompt_slots"):
        array = getattr(tree, name)
        assert isinstance(array, np.ndarray) and array.dtype == np.int64, name
    assert tree.max_offset == 3 and not hasattr(tree, "to")


def test_ensemble_members_see_only_their_own_chain():
    tree = build_tree(TreeSpec({(): 3}), num_prompt_tokens=3, ensemble_size=2)
    # tokens: 0 root; then (k, j) for k = 1..3, j = 0..1 at 1 + 2 * (k - 1) + j
    slot = lambda k, j: 1 + 2 * (k - 1) + j  # noqa: E731
    for k in range(1, 4):
        for j in range(2):
            row = tree.attention_mask[slot(k, j)]
            seen = {i for i in range(tree.num_tokens) if row[i]}
            assert seen == {0} | {slot(kk, j) for kk in range(1, k + 1)}
            assert tree.position_offsets[slot(k, j)] == k
            assert tree.prompt_embedding_index[slot(k, j) - 1] == (k - 1) * 2 + j


def test_every_static_tree_is_valid():
    for spec in STATIC_TREES.values():
        family = family_from_spec("x", spec, num_prompt_tokens=3)
        for depth, tree in enumerate(family.trees):
            assert tree.depth <= depth
            for node, ancestors in enumerate(tree.node_paths):
                row = tree.attention_mask[node, : tree.num_nodes]
                assert set(np.flatnonzero(row).tolist()) == set(ancestors)
        assert family.num_tokens == spec.num_tokens


def test_static_tree_sizes():
    assert [STATIC_TREES[name].num_tokens for name in ("small", "medium", "large")] == [8, 16, 31]


def test_root_only_tree_is_one_token():
    tree = root_only_tree()
    assert tree.num_tokens == 1 and tree.num_nodes == 1 and tree.prompt_counts == (0,)


@pytest.mark.parametrize(
    "spec, message",
    [
        (TreeSpec({(0,): 1}), "no root"),
        (TreeSpec({(): 1, (0, 0): 1}), "no parent"),
        (TreeSpec({(): 1, (0,): 4}), "prompt tokens"),
        (TreeSpec({(): 1, (0,): 1, (0, 0): 1, (0, 0, 0): 1}), "deeper"),
        (TreeSpec({(): 1, (-1,): 1}), "negative"),
    ],
)
def test_invalid_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        build_tree(spec, num_prompt_tokens=2 if message == "deeper" else 3)


def test_spec_json_round_trip():
    spec = STATIC_TREES["large"]
    assert TreeSpec.from_json(spec.to_json()) == spec
