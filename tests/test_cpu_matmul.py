"""Skinny CPU matmuls: same results as nn.Linear for every row count, gradients included."""

import pytest
import torch
from torch import nn

from conftest import tiny_llama
from ppd_core.cpu_matmul import SkinnyLinear, use_skinny_matmuls


@pytest.mark.parametrize("rows", [1, 2, 3, 16, 64, 65, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_equals_linear(rows, bias):
    torch.manual_seed(rows)
    plain = nn.Linear(96, 40, bias=bias)
    skinny = nn.Linear(96, 40, bias=bias)
    skinny.load_state_dict(plain.state_dict())
    assert use_skinny_matmuls(skinny) == 1 and type(skinny) is SkinnyLinear
    x = torch.randn(1, rows, 96, requires_grad=True)
    out = skinny(x)
    torch.testing.assert_close(out, plain(x), atol=1e-5, rtol=1e-5)
    assert out.is_contiguous()  # attention kernels need a unit last-dim stride
    (grad,) = torch.autograd.grad(skinny(x).square().sum(), x)
    (expected,) = torch.autograd.grad(plain(x).square().sum(), x)
    torch.testing.assert_close(grad, expected, atol=1e-4, rtol=1e-4)


def test_only_fp32_cpu_linear_layers_switch():
    model = tiny_llama()
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert use_skinny_matmuls(model) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert use_skinny_matmuls(nn.Linear(4, 4).to(torch.bfloat16)) == 0
