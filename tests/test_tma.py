"""The host side of the TMA kernel (backends/cuda/tma.py) that runs without a GPU: which
operands a tensor map can describe as they are, and the zero-padded copies of the others."""

import threading

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
    (maps, addresses), = launch_maps._maps.values()
    address = maps.data_ptr()
    assert first == addresses == (a.data_ptr(), b.data_ptr(), address)
    assert maps.numel() == 2 * tma.MAP_BYTES and torch.equal(maps, torch.zeros_like(maps))
    assert launch_maps(a, b)[2] == address
    assert encoded == [a.data_ptr(), b.data_ptr()]
    odd = torch.randn(8 * 16 + 1, dtype=torch.float16)[1:].view(8, 16)  # copied: not kept
    launch_maps(odd, b)
    padded = launch_maps(odd, b)
    assert len(encoded) == 6
    held_maps, pa, pb = launch_maps._padded.kept  # held until this thread's next padded call
    assert padded == (pa.data_ptr(), b.data_ptr(), held_maps.data_ptr())
    assert pb is b and pa.data_ptr() % 16 == 0 and torch.equal(pa[:, :16], odd)
    others = [torch.randn(8, 16, dtype=torch.float16) for _ in range(2)]
    for other in others:
        launch_maps(other, b)
    assert len(launch_maps._maps) == 2 and (a.data_ptr(), b.data_ptr()) not in launch_maps._maps
    launch_maps(a, b)  # evicted: encoded again
    assert len(encoded) == 12
    odd_too = torch.randn(8 * 16 + 1, dtype=torch.float16)[1:].view(8, 16)
    other_thread = threading.Thread(target=launch_maps, args=(odd_too, b))
    other_thread.start()
    other_thread.join()
    assert len(encoded) == 14  # padded and encoded in the other thread...
    assert launch_maps._padded.kept[0] is held_maps  # ...without dropping this thread's copies


def _fake_encode(encoded):
    def encode(address, dtype, rows, cols, row_bytes, box_rows, box_cols):
        encoded.append((address, rows, cols, row_bytes, box_rows, box_cols))
        return address.to_bytes(8, "little") * (tma.MAP_BYTES // 8)
    return encode


def test_epilogue_maps_follow_the_kernels_conditions(monkeypatch):
    """D's map when N % 8 == 0 and D is 16-byte aligned, C's when C is also a full, aligned
    matrix; zeros where the kernel will not read a map; (D, C) pairs seen before are not
    encoded again."""
    encoded = []
    monkeypatch.setattr(tma, "encode_2d", _fake_encode(encoded))
    m, n = 40, 24
    d, c = torch.empty(m, n, dtype=torch.float16), torch.empty(m, n, dtype=torch.float16)
    maps = tma.EpilogueMaps(torch.float16, m, n, full_c=True)
    both = maps(d, c)
    assert len(both) == 2 * tma.MAP_BYTES
    assert both[:8] == d.data_ptr().to_bytes(8, "little")
    assert both[tma.MAP_BYTES:tma.MAP_BYTES + 8] == c.data_ptr().to_bytes(8, "little")
    assert encoded == [(d.data_ptr(), m, n, 2 * n, 64, 64), (c.data_ptr(), m, n, 2 * n, 64, 64)]
    assert maps(d, c) == both and len(encoded) == 2
    zeros = bytes(tma.MAP_BYTES)
    assert maps(d, None)[tma.MAP_BYTES:] == zeros  # no C
    bias = tma.EpilogueMaps(torch.float16, m, n, full_c=False)
    assert bias(d, torch.empty(n, dtype=torch.float16))[tma.MAP_BYTES:] == zeros
    odd_c = torch.empty(m * n + 1, dtype=torch.float16)[1:].view(m, n)  # 2 bytes off
    assert maps(d, odd_c)[tma.MAP_BYTES:] == zeros
    odd_d = torch.empty(m * n + 1, dtype=torch.float16)[1:].view(m, n)
    assert maps(odd_d, c) == 2 * zeros  # D from registers: no staging, no prefetch
    narrow = tma.EpilogueMaps(torch.float16, m, 20, full_c=True)  # N % 8 != 0
    assert narrow(torch.empty(m, 20, dtype=torch.float16),
                  torch.empty(m, 20, dtype=torch.float16)) == 2 * zeros


def test_epilogue_maps_keep_the_last_pairs(monkeypatch):
    encoded = []
    monkeypatch.setattr(tma, "encode_2d", _fake_encode(encoded))
    maps = tma.EpilogueMaps(torch.bfloat16, 8, 8, full_c=False, kept=2)
    ds = [torch.empty(8, 8, dtype=torch.bfloat16) for _ in range(3)]
    for d in ds:
        maps(d, None)
    assert len(encoded) == 3 and maps._maps.cache_info().currsize == 2
    maps(ds[0], None)  # evicted: encoded again
    assert len(encoded) == 4


def test_kernel_args_pass_blobs_by_value_64_byte_aligned():
    """Tensor maps by value: each blob parameter has its own 64-byte aligned 128 bytes after
    the 8-byte slots, and set_blobs rewrites them all."""
    import ctypes

    from backends.cuda import BLOB_BYTES, KernelArgs

    args = KernelArgs([1, 2, 3], blobs=2)
    pointers = list(args.argv)
    assert len(pointers) == 5
    assert [ctypes.c_uint64.from_address(p).value for p in pointers[:3]] == [1, 2, 3]
    assert pointers[3] % 64 == 0 and pointers[4] == pointers[3] + BLOB_BYTES
    data = bytes(range(256))
    args.set_blobs(data)
    assert ctypes.string_at(pointers[3], 2 * BLOB_BYTES) == data
    with pytest.raises(ValueError, match="256 bytes"):
        args.set_blobs(data[:128])
    assert len(list(KernelArgs([1]).argv)) == 1


def test_kernel_args_take_the_stream_k_workspace_and_token_after_the_maps_buffer():
    """Step 10's parameters before its tensor maps: the four pointers, M, N, K, ldc, relu, the
    maps' buffer, then the stream-K workspace and token (zeros unless a STREAM_K build
    launches), which set_pointers writes after the buffer."""
    import ctypes

    from backends.cuda import KernelArgs
    from backends.problem import Problem
    from backends.registry import CUDA_KERNELS

    kernel = CUDA_KERNELS["cuda_wgmma_persistent"]
    p = Problem(300, 200, 100, torch.float16, torch.device("cpu"), "full", True, False)
    values = kernel.parameter_values(p)
    assert values == [0, 0, 0, 0, 300, 200, 100, 200, 1, 0, 0, 0]
    args = KernelArgs(values, blobs=2)
    args.set_pointers((11, 12, 13, 14, 15, 16, 17))
    slots = [ctypes.c_uint64.from_address(a).value for a in list(args.argv)[:12]]
    assert slots == [11, 12, 13, 14, 300, 200, 100, 200, 1, 15, 16, 17]
    assert CUDA_KERNELS["cuda_wgmma"].parameter_values(p) == [0, 0, 0, 0, 300, 200, 100, 200,
                                                              1, 0]


def test_stream_k_workspace_fits_the_kernels_layout_and_never_reuses_a_token():
    """A flag per CTA and consumer warpgroup (padded to 16 bytes), then a BLOCK_M x BLOCK_N
    fp32 accumulator per CTA; every launch a token of its own, nonzero."""
    from dataclasses import replace

    from backends.cuda import StreamKWorkspace
    from backends.registry import CUDA_KERNELS

    kernel = CUDA_KERNELS["cuda_wgmma_persistent"]
    sk = replace(kernel, params={**kernel.params, "STREAM_K": 1})
    cpu = torch.device("cpu")
    assert StreamKWorkspace(sk, 132, cpu).bytes == 132 * 2 * 8 + 132 * 128 * 256 * 4
    narrow = replace(sk, params={**sk.params, "BLOCK_M": 64, "BLOCK_N": 128})
    assert StreamKWorkspace(narrow, 3, cpu).bytes == 32 + 3 * 64 * 128 * 4  # 3 flags: 24 -> 32
    workspace = StreamKWorkspace(sk, 132, cpu)
    launches = [workspace() for _ in range(5)]
    tokens = [token for _, token in launches]
    assert len(set(tokens)) == 5 and all(0 < t < 2**63 for t in tokens)
    assert all(w.dtype == torch.uint8 and w.numel() == workspace.bytes for w, _ in launches)


def test_pycuda_parameter_buffer_follows_the_drivers_layout():
    """The PyCUDA launch writes each parameter where the driver reads it: step 10's layout
    on sm_90 (the tensor maps 64-byte aligned at 0x80 and 0x100 after the stream-K
    workspace and token), zeros between, ints in their own size (two's complement), and
    refuses a count or a blob size that does not match."""
    from backends.cuda.pycuda_launch import parameter_buffer

    layout = ((0, 8), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4), (40, 4), (48, 8), (56, 4),
              (64, 8), (72, 8), (80, 8), (0x80, 128), (0x100, 128))
    map_d, map_c = bytes(range(128)), bytes(range(128, 256))
    values = (0x7F00_0000_1000, 2, 3, 4, 1000, 1999, -1, 1999, 1, 0x7F00_0000_2000,
              0x7F00_0000_3000, 2**62 + 5, map_d, map_c)
    buffer = parameter_buffer(values, layout)
    assert len(buffer) == 0x100 + 128
    assert buffer[0:8] == (0x7F00_0000_1000).to_bytes(8, "little")
    assert buffer[36:40] == (1999).to_bytes(4, "little") and buffer[40:44] == b"\xff" * 4
    assert buffer[80:88] == (2**62 + 5).to_bytes(8, "little")
    assert buffer[44:48] == bytes(4) and buffer[88:0x80] == bytes(0x80 - 88)
    assert buffer[0x80:0x100] == map_d and buffer[0x100:] == map_c
    with pytest.raises(RuntimeError, match="takes 14 parameters; got 13"):
        parameter_buffer(values[:-1], layout)
    with pytest.raises(RuntimeError, match="128-byte parameter got 64 bytes"):
        parameter_buffer((*values[:-1], map_c[:64]), layout)
