"""A step's logits answer verification's questions the same way on the host (NumPy) and on a device (torch), and
as brute force over the whole array does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ppd_core.backends.torch.decoder import DeviceLogits
from ppd_core.sampling.logits import HostLogits, top_k


def brute_top(values: np.ndarray, k: int) -> np.ndarray:
    """The k largest, largest first, ties to the lower index: by sorting every entry."""
    order = sorted(range(values.shape[-1]), key=lambda i: (-values[i], i))
    return np.array(order[:k])


@pytest.mark.parametrize("seed", range(5))
def test_host_and_device_logits_agree_with_brute_force(seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((7, 300)).astype(np.float32)  # [rows, vocab]
    values[2, 17] = values[2, 250] = values[2].max() + 1  # a tie at the top: the lower index wins
    host, device = HostLogits(values), DeviceLogits(torch.from_numpy(values.copy()))
    assert host.num_rows == device.num_rows == 7
    expected_argmax = np.array([brute_top(row, 1)[0] for row in values])
    assert np.array_equal(host.argmax(), expected_argmax) and np.array_equal(device.argmax(), expected_argmax)
    assert host.argmax()[2] == 17
    assert np.array_equal(host.rows(slice(3, 5)), values[3:5]) and np.array_equal(device.rows(slice(3, 5)), values[3:5])
    slots = np.array([[4, 5], [6, 1]])  # [m, V]: two ensemble members per depth
    mean = values[slots].mean(1)  # [m, vocab]
    for k in (1, 5, 10):
        expected = np.stack([brute_top(row, k) for row in mean])
        assert np.array_equal(host.top_of_mean(slots, k), expected)
        # torch's topk orders exact ties its own way; the set and the values agree
        got = device.top_of_mean(slots, k)
        assert np.allclose(np.take_along_axis(mean, got, -1), np.take_along_axis(mean, expected, -1))


def test_top_k_of_a_single_member_is_its_row():
    rng = np.random.default_rng(1)
    values = rng.standard_normal((3, 50)).astype(np.float32)
    slots = np.array([[0], [2]])
    assert np.array_equal(HostLogits(values).top_of_mean(slots, 4), top_k(values[[0, 2]], 4))
    assert np.array_equal(top_k(values, 60)[0], brute_top(values[0], 50))  # k past the vocabulary: all of it
