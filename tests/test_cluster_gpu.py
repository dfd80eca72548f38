"""Cluster launch, DSMEM, large dynamic shared memory and launch-time validation on the GPU."""

import numpy as np
import pytest
from numba import cuda

from numba_hopper import intrinsics as I
from numba_hopper.runtime.launch import as_stream_handle, device_limits, launch

pytestmark = pytest.mark.gpu

WORDS = 256


@cuda.jit
def dsmem_kernel(out, meta):
    """Each CTA fills its buffer with rank*1000 + i, then reads its right neighbour's through
    mapa, and writes its rank into its left neighbour's inboxes through st.shared::cluster."""
    mine = cuda.shared.array(WORDS, np.uint32)
    inbox = cuda.shared.array(1, np.uint32)
    finbox = cuda.shared.array(1, np.float32)
    t = cuda.threadIdx.x
    b = cuda.blockIdx.x
    rank = I.cluster_ctarank()
    n = I.cluster_nctarank()
    for i in range(t, WORDS, cuda.blockDim.x):
        mine[i] = rank * 1000 + i
    if t == 0:
        inbox[0] = 0xFFFFFFFF
    I.cluster_sync()  # every CTA has started and filled its buffer
    right = (rank + 1) % n
    left = (rank + n - 1) % n
    remote = I.mapa(I.shared_address(mine), right)
    for i in range(t, WORDS, cuda.blockDim.x):
        out[b, i] = I.ld_shared_cluster_u32(remote + 4 * i)
    if t == 0:
        I.st_shared_cluster_u32(I.mapa(I.shared_address(inbox), left), rank)
        I.st_shared_cluster_f32(I.mapa(I.shared_address(finbox), left), rank + 0.5)
        meta[b, 0] = rank
        meta[b, 1] = n
        meta[b, 2] = I.cluster_id_x()
        meta[b, 3] = I.cluster_ctaid_x()
        meta[b, 4] = I.cluster_nctaid_x()
        meta[b, 5] = I.getctarank(remote)
    I.cluster_sync()  # no CTA exits while a neighbour still reads it; the inbox write landed
    if t == 0:
        meta[b, 6] = inbox[0]
        # this CTA's own float, read back through its shared::cluster address
        meta[b, 7] = np.uint32(I.ld_shared_cluster_f32(I.mapa(I.shared_address(finbox), rank)) * 2.0)
    I.cluster_sync()


def test_dsmem_neighbour_reads_in_a_4_cta_cluster():
    nblocks = 8
    out = cuda.to_device(np.full((nblocks, WORDS), 0xFFFFFFFF, np.uint32))
    meta = cuda.to_device(np.full((nblocks, 8), 0xFFFFFFFF, np.uint32))
    stream = cuda.stream()
    launch(dsmem_kernel, nblocks, 128, (out, meta), cluster=4, stream=stream)
    stream.synchronize()
    out, meta = out.copy_to_host(), meta.copy_to_host()
    for b in range(nblocks):
        rank = b % 4
        right = (rank + 1) % 4
        np.testing.assert_array_equal(out[b], right * 1000 + np.arange(WORDS), err_msg=f"block {b}")
        # meta 6/7: what the right neighbour wrote into this CTA's inbox (u32, and f32 r + 0.5)
        assert list(meta[b]) == [rank, 4, b // 4, rank, 4, right, right, 2 * right + 1], (b, meta[b])


@cuda.jit
def cluster_ids_kernel(meta):
    if cuda.threadIdx.x == 0:
        b = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y
        meta[b, 0] = cuda.gridDim.x
        meta[b, 1] = cuda.gridDim.y
        meta[b, 2] = I.cluster_nctaid_x()
        meta[b, 3] = I.cluster_nctaid_y()
        meta[b, 4] = I.cluster_ctaid_x()
        meta[b, 5] = I.cluster_ctaid_y()
        meta[b, 6] = I.cluster_id_x()
        meta[b, 7] = I.cluster_id_y()
        meta[b, 8] = I.cluster_nclusterid_x()
        meta[b, 9] = I.cluster_ctarank()


def test_grid_counts_blocks_with_a_2d_cluster():
    """grid=(4, 2) blocks in (2, 2) clusters: 8 blocks, 2 clusters, whatever cuda.core's unit."""
    meta = cuda.to_device(np.full((8, 10), 0xFFFFFFFF, np.uint32))
    launch(cluster_ids_kernel, (4, 2), 32, (meta,), cluster=(2, 2))
    cuda.synchronize()
    meta = meta.copy_to_host()
    for by in range(2):
        for bx in range(4):
            row = meta[bx + 4 * by]
            cx, cy = bx % 2, by % 2
            assert list(row) == [4, 2, 2, 2, cx, cy, bx // 2, by // 2, 2, cx + 2 * cy], (bx, by, row)


@cuda.jit
def big_smem_kernel(x, out):
    dyn = cuda.shared.array(0, np.float32)
    n = x.shape[0]
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        dyn[i] = x[i] * 2.0
    cuda.syncthreads()
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        out[i] = dyn[n - 1 - i]


def test_200kb_dynamic_shared_memory():
    n = 200 * 1024 // 4
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    out = cuda.to_device(np.full(n, np.nan, np.float32))
    launch(big_smem_kernel, 1, 512, (cuda.to_device(x), out), shared_mem=200 * 1024)
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), (x * 2.0)[::-1])


def test_bad_launches_raise_before_launching():
    out = cuda.to_device(np.full(16, np.nan, np.float32))
    x = cuda.to_device(np.ones(16, np.float32))
    with pytest.raises(ValueError, match="does not divide grid dimension 3"):
        launch(big_smem_kernel, 3, 32, (x, out), cluster=2)
    with pytest.raises(ValueError, match="at most 8"):
        launch(big_smem_kernel, 16, 32, (x, out), cluster=16)
    limit = device_limits(cuda.get_current_device().id).max_shared_per_block_optin
    with pytest.raises(ValueError, match="exceeds the .* bytes available per block"):
        launch(big_smem_kernel, 1, 32, (x, out), shared_mem=limit + 1024)
    with pytest.raises(ValueError, match="1025 threads"):
        launch(big_smem_kernel, 1, 1025, (x, out))
    cuda.synchronize()
    assert np.all(np.isnan(out.copy_to_host()))  # nothing ran


def test_device_limits_of_this_hopper():
    lim = device_limits(cuda.get_current_device().id)
    assert lim.cc[0] == 9 and lim.cluster_launch
    assert lim.max_shared_per_block_optin >= 227 * 1024
    assert lim.sm_count >= 100


def test_non_portable_cluster_of_16():
    meta = cuda.to_device(np.full((16, 10), 0xFFFFFFFF, np.uint32))
    launch(cluster_ids_kernel, 16, 32, (meta,), cluster=16, non_portable_cluster=True)
    cuda.synchronize()
    meta = meta.copy_to_host()
    assert list(meta[:, 9]) == list(range(16))
    assert set(meta[:, 2]) == {16}


def test_launch_on_streams_of_other_libraries():
    from cuda.core import Device

    meta = cuda.to_device(np.full((8, 10), 0xFFFFFFFF, np.uint32))
    dev = Device(cuda.get_current_device().id)
    dev.set_current()
    core_stream = dev.create_stream()
    launch(cluster_ids_kernel, (4, 2), 32, (meta,), cluster=(2, 1), stream=core_stream)
    core_stream.sync()
    assert as_stream_handle(core_stream) != 0
    assert meta.copy_to_host()[0, 2] == 2


def test_torch_tensor_and_stream():
    torch = pytest.importorskip("torch")
    from numba_hopper.runtime.tensormap import TensorMap

    from test_tma_gpu import expected_box, load2d_kernel, unswizzle

    a = torch.randn((64, 128), dtype=torch.bfloat16, device="cuda")
    t = TensorMap(a, (16, 64), swizzle=128)
    assert t.dtype == "bf16"
    coords = cuda.to_device(np.array([[64, 48]], np.int32))  # column 64, row 48
    out = torch.full((1, t.box_bytes // 4), -1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream()
    launch(load2d_kernel, 1, 128, (t.device_ptr, coords, t.box_bytes, out), stream=stream)
    stream.synchronize()
    raw = out.cpu().numpy().view(np.uint8)[0]
    got = unswizzle(raw, 128).view(np.uint16).reshape(16, 64)
    host = a.view(torch.int16).cpu().numpy().view(np.uint16)
    np.testing.assert_array_equal(got, expected_box(host, (48, 64), (16, 64)))
