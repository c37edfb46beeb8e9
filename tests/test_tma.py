"""The host side of the TMA kernel (backends/cuda/tma.py) that runs without a GPU: which
operands a tensor map can describe as they are, and the zero-padded copies of the others."""

import pytest
import torch

from backends.cuda import tma


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_aligned_operands_are_used_as_they_are(dtype):
    a = torch.randn(37, 776, dtype=dtype)  # 776 * 2 bytes = 97 * 16
    b = torch.randn(776, 1992, dtype=dtype)
    pa, pb = tma.operands(a, b)
    assert pa is a and pb is b


@pytest.mark.parametrize("k,n", [(777, 1992), (776, 1999), (1, 1), (9, 3)])
def test_unaligned_rows_are_zero_padded_to_16_bytes(k, n):
    a = torch.randn(5, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    pa, pb = tma.operands(a, b)
    for t, p in ((a, pa), (b, pb)):
        assert p.shape[0] == t.shape[0]
        assert p.stride(0) * p.element_size() % 16 == 0 and p.stride(1) == 1
        assert p.shape[1] - t.shape[1] < 8  # the least padding that aligns the rows
        assert torch.equal(p[:, :t.shape[1]], t)
        assert not p[:, t.shape[1]:].any()


def test_a_misaligned_base_address_is_copied():
    b = torch.randn(8, 16, dtype=torch.float16)
    odd = torch.randn(65, dtype=torch.float16)[1:].view(8, 8)  # base 2 bytes past alignment
    assert odd.data_ptr() % 16 != 0
    pa, pb = tma.operands(odd, b)
    assert pb is b and pa is not odd
    assert pa.data_ptr() % 16 == 0 and torch.equal(pa[:, :8], odd)


def test_a_binding_encodes_the_maps_of_an_address_pair_once(monkeypatch):
    """``LaunchMaps`` encodes per new (A, B) address pair; aligned operands seen before reuse
    their buffer, padded copies (new addresses each call) are encoded every call, and at
    most ``kept`` buffers are held."""
    encoded = []

    def encode(address, *args):
        encoded.append(address)
        return bytes(tma.MAP_BYTES)

    monkeypatch.setattr(tma, "encode_2d", encode)
    launch_maps = tma.LaunchMaps(k=16, n=16, block_m=64, block_k=64, kept=2)
    a, b = torch.randn(8, 16, dtype=torch.float16), torch.randn(16, 16, dtype=torch.float16)
    first = launch_maps(a, b)
    (maps, address), = launch_maps._maps.values()
    assert first == (a, b, address) and maps.data_ptr() == address
    assert maps.numel() == 2 * tma.MAP_BYTES and torch.equal(maps, torch.zeros_like(maps))
    assert launch_maps(a, b)[2] == address
    assert encoded == [a.data_ptr(), b.data_ptr()]
    odd = torch.randn(8 * 16 + 1, dtype=torch.float16)[1:].view(8, 16)  # copied: not kept
    launch_maps(odd, b)
    padded = launch_maps(odd, b)
    assert len(encoded) == 6
    assert padded[2] == launch_maps._padded.data_ptr()  # held until the next padded call
    others = [torch.randn(8, 16, dtype=torch.float16) for _ in range(2)]
    for other in others:
        launch_maps(other, b)
    assert len(launch_maps._maps) == 2 and (a.data_ptr(), b.data_ptr()) not in launch_maps._maps
    launch_maps(a, b)  # evicted: encoded again
    assert len(encoded) == 12
