"""memra.gpu.ops.attention.splits_for: the smaller grid a prefill chunk's attention launches
with lays every row out exactly as the plan's split count does (kernels/attention.cu's
key_range, restated here from the kernel: chunk = max(ATT_MIN_CHUNK, roundup(ceil(n / S),
ATT_TILE)), n_active = ceil(n / chunk))."""
import itertools

import pytest

from memra.gpu.ops.attention import split_marks, splits_for


def key_range(n: int, S: int, min_chunk: int, tile: int) -> tuple[int, int]:
    chunk = max(min_chunk, -(-(-(-n // S)) // tile) * tile)
    return chunk, -(-n // chunk)


@pytest.mark.parametrize("S,min_chunk,tile", [(88, 128, 64), (33, 128, 64), (16, 100, 64), (8, 64, 32),
                                              (132, 256, 64), (5, 128, 64)])
def test_every_row_up_to_the_deepest_gets_the_plans_layout(S, min_chunk, tile):
    config = {"ATT_MIN_CHUNK": min_chunk, "ATT_TILE": tile}
    for max_keys in itertools.chain(range(1, 300), range(300, 20000, 97)):
        s = splits_for(max_keys, S, 64, config)
        assert 1 <= s <= S
        if s < S:
            assert s & (s - 1) == 0  # a power of two: few graphs per prefill bucket
        for n in range(1, max_keys + 1, max(1, max_keys // 200)):
            assert key_range(n, s, min_chunk, tile) == key_range(n, S, min_chunk, tile), (max_keys, n, s)


def test_a_shallow_chunk_launches_few_splits_and_a_deep_one_all():
    assert splits_for(512, 88, 64) == 4       # SmolLM2's pp512 at depth 0: 4 of 88 splits
    assert splits_for(4608, 88, 64) == 64     # at depth 4096
    assert splits_for(4608, 33, 128) == 33    # the 8B at depth 4096: chunks grow past 128 keys


@pytest.mark.parametrize("S,min_chunk,tile", [(88, 128, 64), (33, 128, 64), (16, 100, 64), (7, 192, 64)])
def test_split_marks_reach_every_value_splits_for_takes(S, min_chunk, tile):
    config = {"ATT_MIN_CHUNK": min_chunk, "ATT_TILE": tile}
    for max_len in (1, 100, 4096, 8192, 40000):
        want = sorted({splits_for(m, S, 64, config) for m in range(1, max_len + 1)})
        assert sorted({splits_for(m, S, 64, config) for m in split_marks(max_len, S, 64, config)}) == want
