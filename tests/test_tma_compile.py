"""TMA, bulk-copy and cluster intrinsics compile for sm_90a to the expected SASS (no GPU needed).

SASS spellings checked here (ptxas 13.x, sm_90a):
  tma_load_Nd               UTMALDG.ND            tma_load_multicast_Nd  UTMALDG.ND.MULTICAST
  tma_store_Nd              UTMASTG.ND            tma_reduce_Nd("add")   UTMAREDG.ND.ADD
  tma_prefetch_Nd           UTMAPF.L2.ND          prefetch_tensormap     UTMACCTL.PF
  fence_proxy_tensormap_acquire UTMACCTL.IV       bulk_wait_group(n)     DEPBAR.LE SB0, n
  bulk_copy_g2s/s2g         UBLKCP.S.G / UBLKCP.G.S
  cluster_arrive/_wait      UCGABAR_ARV / UCGABAR_WAIT
  mapa + ld/st.shared::cluster: no opcode of its own; PRMT builds the cluster address and
  generic LD.E/ST.E (through the shared window SR_SWINHI) access it.
"""

import pytest
from numba import cuda
from numba.core.errors import TypingError

from numba_hopper import intrinsics as I
from numba_hopper.tools.sass import inspect_kernel


@cuda.jit(launch_bounds=(128, 1))
def _loads(tmap, smem, bar, x, y, out):
    I.fence_proxy_tensormap_acquire(tmap)
    I.prefetch_tensormap(tmap)
    I.tma_load_1d(smem, tmap, x, bar)
    I.tma_load_2d(smem, tmap, x, y, bar)
    I.tma_load_3d(smem, tmap, x, y, 2, bar)
    I.tma_load_4d(smem, tmap, x, y, 2, 3, bar)
    I.tma_load_5d(smem, tmap, x, y, 2, 3, 4, bar)
    I.tma_load_multicast_2d(smem, tmap, x, y, bar, 0b11)
    I.tma_load_multicast_3d(smem, tmap, x, y, 1, bar, 0b1111)
    policy = I.createpolicy_fractional("evict_last")
    I.tma_load_2d_cache_hint(smem, tmap, x, y, bar, policy)
    I.tma_prefetch_2d(tmap, x, y)
    out[0] = 1


def test_tma_loads_multicast_prefetch_and_fence():
    r = inspect_kernel(_loads, "void(uint64, uint32, uint32, int32, int32, int32[::1])")
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [" in r.ptx
    assert ".mbarrier::complete_tx::bytes.multicast::cluster" in r.ptx
    assert ".mbarrier::complete_tx::bytes.L2::cache_hint" in r.ptx
    assert "createpolicy.fractional.L2::evict_last.b64" in r.ptx
    assert "fence.proxy.tensormap::generic.acquire.gpu [" in r.ptx
    for n in range(1, 6):
        assert r.count(f"UTMALDG.{n}D") >= 1, (n, r.key_opcodes())
    assert r.count("UTMALDG.2D.MULTICAST") == 1
    assert r.count("UTMALDG.3D.MULTICAST") == 1
    assert r.count("UTMALDG") == 8
    assert r.count("UTMAPF.L2.2D") == 1
    assert r.count("UTMACCTL.PF") == 1  # prefetch.tensormap
    assert r.count("UTMACCTL.IV") == 1  # fence.proxy.tensormap acquire
    assert r.spill_bytes == 0


@cuda.jit(launch_bounds=(128, 1))
def _stores(tmap, smem, x, y):
    I.tma_store_1d(tmap, smem, x)
    I.tma_store_2d(tmap, smem, x, y)
    I.tma_store_3d(tmap, smem, x, y, 0)
    I.tma_store_4d(tmap, smem, x, y, 0, 1)
    I.tma_store_5d(tmap, smem, x, y, 0, 1, 2)
    I.tma_reduce_2d("add", tmap, smem, x, y)
    I.tma_reduce_5d("add", tmap, smem, x, y, 0, 1, 2)
    I.tma_reduce_2d("min", tmap, smem, x, y)
    I.tma_reduce_3d("max", tmap, smem, x, y, 1)
    I.bulk_commit_group()
    I.bulk_wait_group_read(1)
    I.bulk_wait_group(0)


def test_tma_stores_and_reductions():
    r = inspect_kernel(_stores, "void(uint64, uint32, int32, int32)")
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [" in r.ptx
    assert "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [" in r.ptx
    assert "cp.async.bulk.commit_group;" in r.ptx
    assert "cp.async.bulk.wait_group.read 1;" in r.ptx
    assert "cp.async.bulk.wait_group 0;" in r.ptx
    for n in range(1, 6):
        assert r.count(f"UTMASTG.{n}D") == 1, (n, r.key_opcodes())
    assert r.count("UTMAREDG.2D.ADD") == 1 and r.count("UTMAREDG.5D.ADD") == 1
    assert r.count("UTMAREDG.2D.MIN") == 1 and r.count("UTMAREDG.3D.MAX") == 1
    assert "DEPBAR.LE SB0, 0x1" in r.sass and "DEPBAR.LE SB0, 0x0" in r.sass
    assert r.spill_bytes == 0


@cuda.jit
def _bulk(dst_global, src_global, smem, bar, n):
    I.bulk_copy_g2s(smem, src_global, n, bar)
    I.bulk_copy_g2s_multicast(smem, src_global, n, bar, 0b11)
    I.bulk_copy_s2g(dst_global, smem, n)
    I.bulk_commit_group()
    I.bulk_wait_group(0)


def test_plain_bulk_copies():
    r = inspect_kernel(_bulk, "void(uint64, uint64, uint32, uint32, uint32)")
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [" in r.ptx
    assert "cp.async.bulk.global.shared::cta.bulk_group [" in r.ptx
    assert r.count("UBLKCP.S.G") == 2  # global -> shared, plain and multicast
    assert r.count("UBLKCP.G.S") == 1
    assert r.spill_bytes == 0


@cuda.jit(launch_bounds=(128, 1))
def _cluster(smem, out):
    I.cluster_sync()
    rank = I.cluster_ctarank()
    peer = I.mapa(smem, (rank + 1) % I.cluster_nctarank())
    v = I.ld_shared_cluster_u32(peer)
    I.st_shared_cluster_u32(peer, v + 1)
    f = I.ld_shared_cluster_f32(peer)
    I.st_shared_cluster_f32(peer, f * 2.0)
    I.cluster_arrive_relaxed()
    I.cluster_wait()
    I.cluster_arrive()
    I.cluster_wait()
    ids = I.cluster_id_x() + I.cluster_id_y() + I.cluster_id_z() + I.cluster_nclusterid_x()
    ids += I.cluster_ctaid_x() + I.cluster_ctaid_y() + I.cluster_ctaid_z()
    ids += I.cluster_nctaid_x() + I.cluster_nctaid_y() + I.cluster_nctaid_z()
    out[cuda.threadIdx.x] = v + I.getctarank(peer) + ids


def test_cluster_barriers_ids_and_dsmem():
    r = inspect_kernel(_cluster, "void(uint32, uint32[::1])")
    for text in (
        "barrier.cluster.arrive.release.aligned;",
        "barrier.cluster.arrive.relaxed.aligned;",
        "barrier.cluster.wait.acquire.aligned;",
        "mapa.shared::cluster.u32",
        "getctarank.shared::cluster.u32",
        "ld.shared::cluster.u32",
        "st.shared::cluster.f32",
        "%cluster_ctarank",
        "%cluster_nctarank",
        "%clusterid.x",
        "%cluster_nctaid.z",
    ):
        assert text in r.ptx, text
    assert r.count("UCGABAR_ARV") == 3
    assert r.count("UCGABAR_WAIT") == 3
    # DSMEM accesses become generic loads/stores through the shared window
    assert "SR_SWINHI" in r.sass
    assert r.count("LD.E") >= 1 and r.count("ST.E") >= 1
    assert r.spill_bytes == 0


@cuda.jit
def _wait_runtime(n):
    I.bulk_wait_group(n)


@cuda.jit
def _wait_too_many():
    I.bulk_wait_group(64)


@cuda.jit
def _load_missing_bar(tmap, smem, x, y):
    I.tma_load_2d(smem, tmap, x, y)


@cuda.jit
def _bad_policy():
    I.createpolicy_fractional("evict_sometimes")


@pytest.mark.parametrize(
    "kernel, sig, message",
    [
        (_wait_runtime, "void(int32)", r"bulk_wait_group"),  # n must be a literal
        (_wait_too_many, "void()", r"must be in \[0, 63\]"),
        (_load_missing_bar, "void(uint64, uint32, int32, int32)", r"tma_load_2d\(\) missing 1 required positional argument: 'bar'"),
        (_bad_policy, "void()", "must be one of"),
    ],
)
def test_typing_errors_name_the_intrinsic(kernel, sig, message):
    with pytest.raises((TypingError, TypeError), match=message):
        inspect_kernel(kernel, sig)


def test_every_rank_and_variant_is_exported():
    for n in range(1, 6):
        for name in ("tma_load_{}d", "tma_load_{}d_cache_hint", "tma_load_multicast_{}d",
                     "tma_load_multicast_{}d_cache_hint", "tma_store_{}d", "tma_reduce_{}d", "tma_prefetch_{}d"):
            assert hasattr(I, name.format(n)), name.format(n)
    for name in ("cluster_ctaid_x", "cluster_nctaid_y", "cluster_id_z", "cluster_nclusterid_x"):
        assert hasattr(I, name)
