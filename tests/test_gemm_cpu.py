"""The GEMM on a CPU: what its kernels compile to, its host logic and its input checks."""

import re

import numpy as np
import pytest

from numba_hopper.kernels import gemm_argument_types, shipped_kernels
from numba_hopper.matmul.heuristics import max_stages
from numba_hopper.kernels.gemm_config import GemmConfig
from numba_hopper.kernels.epilogue import EpilogueConfig
from numba_hopper.kernels.gemm_sm90 import make_gemm_kernel, register_budget
from numba_hopper.kit.scheduler import grouped_tile_host as host_grouped_tile
from numba_hopper.tools.sass import inspect_kernel

# One compile per code path, not one per combination of options. The majors change the TMA
# boxes and wgmma descriptors, the output dtype the epilogue's conversion and sub-tiles, block_n
# the wgmma shape and the accumulator (and, when 64 does not divide it, 32-column sub-tiles),
# block_m the consumer count (setmaxnreg), a cluster the multicast; the input dtype and the stage
# count are an instruction variant and a constant. So each value of each option is compiled at
# least once, and the options are spread over the configs rather than crossed.
ALL_CONFIGS = [
    # every pair of majors at 128 x 256, the dtypes and a stage count spread over them
    GemmConfig("bf16", "bf16", "K", "N"),
    GemmConfig("bf16", "bf16", "M", "K"),
    GemmConfig("f16", "f32", "K", "K"),
    GemmConfig("f16", "f16", "M", "N", stages=3),
    # each multicast alone, then both (on 128 x 128 tiles, as rows straddling sectors run), with the other majors
    GemmConfig("bf16", "bf16", "K", "N", cluster_m=2),
    GemmConfig("bf16", "bf16", "K", "N", cluster_n=2),
    GemmConfig("bf16", "bf16", "M", "K", block_n=128, cluster_m=2, cluster_n=2),
    # narrower tiles: each wgmma width, 160 (32-column sub-tiles) with both B majors, f32 at 192
    *(GemmConfig("bf16", "bf16", "K", "N", block_n=bn, stages=4) for bn in (64, 128, 160)),
    GemmConfig("bf16", "bf16", "M", "K", block_n=160, stages=4),
    GemmConfig("bf16", "f32", "K", "N", block_n=192, stages=4),
    # 32- and 16-column sub-tiles of the K-major B's widths
    GemmConfig("bf16", "bf16", "K", "K", block_n=224, stages=4),
    GemmConfig("bf16", "f32", "M", "K", block_n=144, stages=4),
    # 64-row tiles (one consumer warpgroup): each width, f32 and the other majors at the widest
    *(GemmConfig("bf16", "bf16", "K", "N", block_m=64, block_n=bn, stages=8) for bn in (32, 64)),
    GemmConfig("bf16", "f32", "M", "K", block_m=64, block_n=128, stages=8),
    # 192-row tiles (three consumer warpgroups, 512 threads): the widest alone and with each
    # multicast, 128 with the other majors and f32
    GemmConfig("bf16", "bf16", "K", "K", block_m=192, block_n=192, stages=3),
    GemmConfig("bf16", "bf16", "K", "K", block_m=192, block_n=192, stages=3, cluster_m=2),
    GemmConfig("bf16", "bf16", "K", "N", block_m=192, block_n=128, stages=3, cluster_n=2),
    GemmConfig("bf16", "f32", "M", "N", block_m=192, block_n=128, stages=3),
    # one output buffer per consumer (a fourth slot for 192 x 192 tiles), in each cluster they run in
    GemmConfig("bf16", "bf16", "K", "N", block_m=192, block_n=192, stages=4, cluster_n=2, epi_buffers=1),
    GemmConfig("bf16", "bf16", "M", "K", block_m=192, block_n=192, stages=4, cluster_m=2, epi_buffers=1),
    # column-major outputs (swapped decode products): each narrow width, both 16-bit types and A
    # majors, one accumulator per wgmma of a k-block (as the heuristic runs them) and one in all
    GemmConfig("bf16", "bf16", "K", "K", block_m=64, block_n=8, stages=16, out_major="M", acc_chains=4),
    GemmConfig("f16", "f16", "M", "K", block_m=64, block_n=16, stages=12, out_major="M", acc_chains=4),
    GemmConfig("bf16", "bf16", "K", "K", block_m=64, block_n=16, stages=12, out_major="M"),
    # ping-pong consumers (whole tiles, each issuing both halves' wgmmas): both widths the heuristic
    # runs, the 176-wide with 16-column sub-tiles, and an M-major A (its halves are two boxes) with f32
    GemmConfig("bf16", "bf16", "K", "K", block_n=176, stages=5, pingpong=True),
    GemmConfig("f16", "f32", "M", "N", block_n=128, stages=4, pingpong=True),
    # 256-row tiles (two consumers of 128 rows, two wgmmas a k-step each): cuBLAS's 1x2 cluster
    # with an M-major A (its four boxes split over the cluster), 2x1 with a K-major A and f32
    GemmConfig("bf16", "bf16", "M", "N", block_m=256, block_n=128, cluster_n=2),
    GemmConfig("f16", "f32", "K", "K", block_m=256, block_n=128, stages=3, cluster_m=2),
    # clusters in GPC order (slots claimed with atomics): the 1x2 tile the heuristic runs, and the
    # training tiles' 2x1 over the raster walked row by row
    GemmConfig("bf16", "bf16", "K", "K", block_n=112, stages=6, cluster_n=2, cluster_order="gpc"),
    GemmConfig("bf16", "bf16", "M", "N", cluster_m=2, cluster_order="gpc", group_n=8),
    # the dynamic schedule (tiles taken off a counter, handed through a ring of ids): the
    # training tiles' 2x1 cluster, and unclustered
    GemmConfig("bf16", "bf16", "M", "N", cluster_m=2, dynamic_schedule=True),
    GemmConfig("bf16", "f32", "K", "K", dynamic_schedule=True),
]


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("cfg", ALL_CONFIGS, ids=lambda c: f"{c.in_dtype}-{c.out_dtype}-{c.a_major}{c.b_major}-c{c.cluster_m}x{c.cluster_n}-{c.block_m}x{c.block_n}"
                         + ("-colmajor" if c.out_major == "M" else "") + ("-gpc" if c.cluster_order == "gpc" else "")
                         + ("-pingpong" if c.pingpong else "") + ("-dynamic" if c.dynamic_schedule else "")
                         + f"-a{c.acc_chains}")
def test_gemm_sass_has_hopper_instructions_and_no_spills(cfg):
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    assert r.count("HGMMA") >= 4, r.summary()  # 4 k16 steps per 64-wide k-block
    assert r.count("UTMALDG") >= 2 and r.count("UTMASTG") >= 1
    # producer dec, consumer inc; a single consumer warpgroup keeps every register
    assert r.count("USETMAXREG") == (2 if cfg.consumers > 1 else 0)
    if cfg.cluster_size > 1:  # the shared operand is loaded once per cluster and multicast
        assert r.count("UTMALDG.3D.MULTICAST") > 0 and r.count("UCGABAR_WAIT") > 0
    # in GPC order a cluster reads its SM and prefetches its claim before the wait for the
    # previous kernel (whose last cluster cleared the claims), claims its slot after it and
    # counts itself once
    gpc = cfg.cluster_order == "gpc"
    assert ("SR_VIRTUALSMID" in r.sass, "ATOMG.E.CAS" in r.sass) == (gpc, gpc)
    # a dynamic schedule's leader takes tiles off the counter and counts its cluster done
    adds = r.count("ATOMG.E.ADD")
    assert adds >= 2 if cfg.dynamic_schedule else adds == int(gpc)
    if gpc:
        order = [r.sass.index(op) for op in ("SR_VIRTUALSMID", "CCTL.E.PF2", "ACQBULK", "ATOMG.E.CAS", "UTMALDG")]
        assert order == sorted(order)
    assert r.count("SYNCS") > 0  # mbarrier
    # a barrier wait that does not pass at once sleeps until the barrier changes, not spinning
    assert r.count("NANOSLEEP.SYNCS") >= 2, r.summary()
    # programmatic dependent launch: one wait before the first global access, one release
    assert r.count("ACQBULK") == 1 and r.count("PREEXIT") == 1
    assert r.sass.index("ACQBULK") < r.sass.index("UTMALDG")
    # A, B and D's tensor maps are fetched into the descriptor cache before that wait
    assert r.count("UTMACCTL.PF") == 3 and r.sass.index("UTMACCTL.PF") < r.sass.index("ACQBULK")
    # a decode kernel (column-major output) prefetches its first k-blocks into L2 before that wait
    if cfg.out_major == "M":
        assert r.count("UTMAPF.L2") > 0 and r.sass.index("UTMAPF.L2") < r.sass.index("ACQBULK")
    else:
        assert r.count("UTMAPF") == 0
    # the consumers keep mma_depth k-blocks of wgmmas in flight (deeper on 64-row tiles' long rings)
    assert f"WARPGROUP.DEPBAR.LE gsb0, {cfg.mma_depth:#x} " in r.sass
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert not r.setmaxnreg_ignored
    assert not any("C7517" in w or "C75" in w for w in r.warnings), r.warnings
    # the consumers' k-block loop (unrolled or not) computes its wgmma descriptors in uniform
    # registers: none is moved there from a vector register before its wgmma
    loop = _k_block_loop(r.sass)
    assert sum("GMMA." in line for line in loop) % (cfg.block_k // 16) == 0, loop
    assert not [line for line in loop if "R2UR" in line], loop


@pytest.mark.parametrize("a_evict,b_evict", [("first", "last"), ("last", "normal")])
def test_l2_priorities_hint_only_the_loads_of_their_operand(a_evict, b_evict):
    """Each operand's loads carry the cache-hint operand (``desc[...]``) exactly when its priority
    is not "normal", in a 2x1 cluster whose B loads are multicast; nothing else changes."""
    cfg = GemmConfig("bf16", "bf16", "M", "N", cluster_m=2, a_evict=a_evict, b_evict=b_evict)
    plain = inspect_kernel(make_gemm_kernel(GemmConfig("bf16", "bf16", "M", "N", cluster_m=2)),
                           gemm_argument_types(cfg))
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    loads = [line for line in r.sass.splitlines() if "UTMALDG" in line]
    a_loads = [line for line in loads if "MULTICAST" not in line]
    b_loads = [line for line in loads if "MULTICAST" in line]
    assert a_loads and b_loads and len(loads) == plain.count("UTMALDG")
    assert all(("desc[" in line) == (a_evict != "normal") for line in a_loads), a_loads
    assert all(("desc[" in line) == (b_evict != "normal") for line in b_loads), b_loads
    for e in ("first", "last"):
        assert (f"createpolicy.fractional.L2::evict_{e}" in r.ptx) == (e in (a_evict, b_evict))
    assert r.spill_bytes == 0 and r.registers <= plain.registers, r.summary()


def _k_block_loop(sass):
    """The SASS lines of the innermost loop around a wgmma (the consumers' k-block loop; a kernel
    that issues each tile's first k-block before the previous tile's store has one more wgmma
    group, in its tile loop): from the label that a later branch jumps back to, to that branch."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    loops = [(labels[m.group(1)], j) for j, line in enumerate(lines)
             if (m := re.search(r"BRA\S* `\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), j) < j]
    around = [(b - a, a, b) for a, b in loops if any("GMMA." in line for line in lines[a:b])]
    if not around:
        raise AssertionError("no loop around a wgmma")
    _, a, b = min(around)
    return [line for line in lines[a:b + 1] if "/*" in line]


@pytest.mark.kernel_matrix
@pytest.mark.parametrize("cfg", [GemmConfig("bf16", "bf16", "K", "N"),
                                 GemmConfig("bf16", "bf16", "M", "N", cluster_m=2, dynamic_schedule=True),
                                 GemmConfig("f16", "f16", "K", "K", block_m=192, block_n=128, stages=3)],
                         ids=lambda c: f"{c.a_major}{c.b_major}-c{c.cluster_size}-{c.block_m}x{c.block_n}")
def test_plain_store_runs_behind_the_next_first_k_block(cfg):
    """A plain 16-bit tile of two consumers (three at 128 columns) is converted to packed pairs,
    then the next tile's first k-block is issued and the stmatrix stores follow before any wait
    for it, its wgmmas unserialized; the packed tile beside the fresh accumulator spills
    nothing."""
    assert cfg.overlaps_store
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    lines = [line for line in r.sass.splitlines() if "GMMA" in line or "WARPGROUP.DEPBAR" in line or "STSM" in line
             or "F2FP" in line]
    first_store = next(i for i, line in enumerate(lines) if "STSM" in line)
    issued = max(i for i, line in enumerate(lines[:first_store]) if "GMMA" in line)
    assert "gsb0" in lines[issued] and not [line for line in lines[issued:first_store] if "DEPBAR" in line], \
        lines[issued:first_store]
    assert not [line for line in lines[issued:first_store] if "F2FP" in line]  # converted before the issue
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert not [w for w in r.warnings if "C7514" in w or "C7517" in w], r.warnings


@pytest.mark.parametrize("cfg,depth", [
    (GemmConfig(), 1), (GemmConfig(block_m=64, block_n=128, stages=8), 2), (GemmConfig(block_m=64, block_n=256, stages=5), 1),
    (GemmConfig(block_m=64, block_n=8, b_major="K", stages=23, out_major="M", acc_chains=4), 1),
    (GemmConfig(block_m=64, block_n=64, stages=4), 1),
])
def test_consumers_keep_wgmmas_in_flight_where_the_ring_has_slots_to_spare(cfg, depth):
    assert cfg.mma_depth == depth
    assert cfg.mma_depth + 1 < cfg.stages  # the producer still has slots to load into


@pytest.mark.parametrize("cfg,budget", [
    (GemmConfig(), (40, 232)), (GemmConfig(cluster_n=2), (56, 224)),
    (GemmConfig(epilogue=EpilogueConfig(activation="silu")), (24, 240)),
    (GemmConfig(epilogue=EpilogueConfig(activation="silu"), cluster_m=2), (40, 232)),
    # 32 + 2 x 240 asks for more than the 3 x 168 of the launch: setmaxnreg.inc never returned
    (GemmConfig(block_n=64, epilogue=EpilogueConfig(activation="silu"), grouped="contiguous"), (32, 232)),
    (GemmConfig(block_m=192, block_n=192), (40, 152)), (GemmConfig(block_m=192, block_n=192, cluster_n=2), (56, 152)),
    (GemmConfig(block_m=192, block_n=192, epilogue=EpilogueConfig(activation="silu")), (24, 160)),
    # a plain tile stored behind the next one's first k-block keeps the plain budgets
    (GemmConfig(cluster_m=2, dynamic_schedule=True), (56, 224)), (GemmConfig(block_m=192, block_n=128), (40, 152)),
], ids=lambda v: f"{v.block_m}x{v.block_n}-c{v.cluster_size}-{v.grouped or ''}{'fused' if v.epilogue else 'plain'}"
   if isinstance(v, GemmConfig) else "")
def test_setmaxnreg_trades_only_the_registers_of_the_launch(cfg, budget):
    producer, consumer = register_budget(cfg)
    assert (producer, consumer) == budget
    at_launch = 65536 // cfg.threads // 8 * 8  # launch_bounds(threads, 1)
    assert 128 * producer + 128 * cfg.consumers * consumer <= at_launch * cfg.threads


# The fix-up's loads and stores follow block_n; the widest, with the f32 output and the other
# majors, has the fewest registers to spare.
@pytest.mark.kernel_matrix
@pytest.mark.parametrize("cfg", [*(GemmConfig("bf16", "bf16", "K", "N", block_n=bn, stream_k=True) for bn in (64, 128)),
                                 GemmConfig("bf16", "f32", "M", "K", block_n=192, stream_k=True)],
                         ids=lambda c: f"{c.out_dtype}-{c.a_major}{c.b_major}-n{c.block_n}")
def test_stream_k_sass_has_the_fixup_and_no_spills(cfg):
    r = inspect_kernel(make_gemm_kernel(cfg), gemm_argument_types(cfg))
    quads = cfg.block_n // 8  # float4s of a consumer thread's partial
    assert r.count("STG.E.128") == quads and r.count("LDG.E.128.STRONG.GPU") == quads, r.summary()
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()


def test_stream_k_rejects_what_it_cannot_compile():
    with pytest.raises(ValueError, match="block_n <= 192"):
        GemmConfig(stream_k=True)  # 256 wide
    with pytest.raises(ValueError, match="without a cluster"):
        GemmConfig(block_n=128, stream_k=True, cluster_n=2)


@pytest.mark.parametrize("tiles,k_blocks", [(98, 64), (27, 16), (360, 13), (64, 64), (300, 3), (1, 1), (5, 100),
                                            (132, 7), (264, 2), (17, 1)])
def test_stream_k_walk_covers_every_k_block_once(tiles, k_blocks):
    """Every (tile, k-block) is done by exactly one CTA; a tile a CTA leaves unfinished goes
    on in the next CTA, whose first stream-K item it is (what the fix-up waits for)."""
    from numba_hopper.matmul.heuristics import stream_k_schedule as _stream_k_schedule
    from numba_hopper.kernels.scheduler import host_work_walk

    first_item, next_item = host_work_walk()
    grid, dp_tiles = _stream_k_schedule(tiles, k_blocks, 132)
    done = np.zeros((tiles, k_blocks), dtype=int)
    runs = []
    for cta in range(grid):
        items, item = [], first_item(cta, grid, dp_tiles, tiles, k_blocks)
        while item[0] < tiles:
            assert 0 <= item[1] < item[2] <= k_blocks
            items.append(item)
            item = next_item(item, cta, grid, dp_tiles, tiles, k_blocks)
        assert items, "an idle CTA"
        for tile, k0, k1 in items:
            done[tile, k0:k1] += 1
        assert all(k0 == 0 and k1 == k_blocks for tile, k0, k1 in items if tile < dp_tiles)
        run = [item for item in items if item[0] >= dp_tiles]  # the stream-K run
        assert all(k0 == 0 for _, k0, _ in run[1:])  # only its first item starts mid-tile
        runs.append(run)
    assert (done == 1).all()
    for cta, run in enumerate(runs):
        if run and run[-1][2] < k_blocks:  # the fix-up reads the next CTA's partial of this tile
            assert runs[cta + 1][0][:2] == run[-1][::2]


def test_shipped_kernels_are_listed():
    labels = [label for label, _, sig in shipped_kernels()]
    assert labels and all("gemm" in x for x in labels)


@pytest.mark.parametrize("tiles_m,tiles_n,group", [(1, 1, 8), (7, 3, 8), (32, 16, 8), (5, 40, 4), (9, 2, 1)])
def test_grouped_tile_is_a_bijection(tiles_m, tiles_n, group):
    seen = {host_grouped_tile(t, tiles_m, tiles_n, group) for t in range(tiles_m * tiles_n)}
    assert seen == {(m, n) for m in range(tiles_m) for n in range(tiles_n)}


def test_grouped_tile_walks_down_a_group_first():
    order = [host_grouped_tile(t, 16, 16, 8) for t in range(10)]
    assert order[:8] == [(m, 0) for m in range(8)] and order[8:10] == [(0, 1), (1, 1)]


def test_stage_count_fills_shared_memory():
    limit = 227 * 1024
    s = max_stages("bf16", "bf16", 256, limit)
    assert GemmConfig(stages=s).shared_bytes <= limit < GemmConfig(stages=s + 1).shared_bytes
    assert s >= 3


@pytest.mark.parametrize("kw,msg", [
    (dict(in_dtype="f32"), "in_dtype"), (dict(out_dtype="i8"), "out_dtype"),
    (dict(a_major="N"), "majors"), (dict(block_m=96), "block_m"), (dict(block_m=64, cluster_n=2), "block_m = 64"),
    (dict(block_n=32), "block_n = 32"), (dict(block_n=100), "block_n"),
    (dict(block_n=8), "out_major"), (dict(block_m=64, block_n=64, out_major="M"), "out_major"),
    (dict(block_m=64, block_n=8, b_major="K", out_major="M", out_dtype="f32"), "plain 16-bit"),
    (dict(block_m=64, block_n=8, out_major="M"), "K-major B"),
    (dict(stages=1), "stages"), (dict(cluster_m=4), "cluster"), (dict(epi_buffers=3), "epi_buffers"),
    (dict(block_m=192), "block_n <= 192"), (dict(block_m=192, block_n=128, stream_k=True), "block_m = 192"),
    (dict(block_m=192, block_n=128, a_major="M", cluster_n=2), "block_m = 192"),
    (dict(cluster_order="smid"), "cluster_order"), (dict(cluster_order="gpc"), "2-CTA clusters"),
    (dict(a_evict="evict_last"), "a_evict"), (dict(b_evict="never"), "b_evict"),
    (dict(group_m=0), "group_m"), (dict(group_n=-1), "group_n"),
    (dict(block_n=128, grouped="contiguous", group_n=8), "group_n runs ungrouped"),
    *((dict(dict(dynamic_schedule=True), **kw), "dynamic_schedule") for kw in (
        dict(block_n=128, stream_k=True), dict(block_n=128, pingpong=True), dict(grouped="contiguous", block_n=128),
        dict(cluster_n=2, cluster_order="gpc"), dict(in_dtype="e4m3", b_major="K", block_n=128, promoted=True))),
    (dict(block_n=128, cluster_m=2, cluster_n=2, cluster_order="gpc"), "2-CTA clusters"),
    *((dict(dict(block_n=128, pingpong=True), **kw), "pingpong") for kw in (
        dict(block_m=64), dict(block_n=256), dict(in_dtype="e4m3", b_major="K", promoted=True), dict(cluster_n=2),
        dict(stream_k=True), dict(grouped="contiguous"), dict(epilogue=EpilogueConfig(c_dtype="bf16")))),
])
def test_config_rejects_bad_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        GemmConfig(**kw)


# --- gemm()'s checks, which run before it needs a GPU -------------------------------------

from _fakes import FakeCAI  # noqa: E402

from numba_hopper import gemm  # noqa: E402


def _m(rows, cols, typestr="<f2"):
    return FakeCAI((rows, cols), typestr)


@pytest.mark.parametrize("a,b,kw,exc,msg", [
    (_m(4, 8, "<f4"), _m(8, 4, "<f4"), {}, TypeError, "a.dtype"),
    (_m(4, 8), _m(8, 4, "<u2"), dict(dtype=None), TypeError, "b.dtype"),
    (_m(4, 8), _m(9, 4), {}, ValueError, "shape mismatch"),
    (_m(4, 8), FakeCAI((8, 4, 2), "<f2"), {}, ValueError, "b must be 2-D"),
    (_m(4, 8, "<u2"), _m(8, 4, "<u2"), dict(dtype="bf16", out_dtype="i8"), TypeError, "out_dtype"),
    (_m(4, 8), _m(8, 4), dict(out=_m(4, 5)), ValueError, "out has shape"),
    (_m(4, 8), _m(8, 4), dict(out=_m(4, 4, "<i4")), TypeError, "out.dtype"),
])
def test_gemm_rejects_bad_input_before_launch(a, b, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        gemm(a, b, **kw)


def test_gemm_rejects_host_arrays():
    with pytest.raises(TypeError):
        gemm(np.zeros((4, 8), np.float16), np.zeros((8, 4), np.float16))


def test_gemm_without_hopper_gpu_says_so(monkeypatch):
    import numba_hopper.matmul.plan_cache as g

    monkeypatch.setattr(g, "hopper_device_reason", lambda: "device 0 is compute capability 8.0, not Hopper (9.x)")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU.*8.0"):
        gemm(_m(4, 8), _m(8, 4))


@pytest.mark.parametrize("M,N,K,units,tile", [
    (4096, 4096, 4096, 1, (128, 256)), (6144, 6144, 6144, 1, (128, 256)), (256, 14336, 4096, 1, (128, 256)),
    (8192, 8192, 8192, 1, (128, 192)),  # many waves: 192 columns as cheap as 256, fuller last wave
    (16384, 57344, 8192, 1, (128, 256)),  # ... but 256 where the two are within half a percent
    (512, 28672, 4096, 1, (128, 128)),  # 7 waves of 128-wide tiles beat 5 of 192 and 4 of 256
    (1792, 1280, 4096, 1, (128, 160)), (1920, 1280, 4096, 1, (128, 160)),  # one wave of 160-wide tiles
    (1000, 7, 64, 1, (128, 64)), (16384, 128, 64, 1, (128, 128)), (1024, 1024, 128, 32, (128, 256)),
    # M <= 128: 64-row tiles of the shortest estimated streaming time
    (1, 14336, 4096, 1, (64, 128)), (64, 6144, 4096, 1, (64, 128)), (128, 8192, 4096, 1, (64, 128)),
    (1, 3584, 3584, 1, (64, 64)), (1, 4096, 14336, 1, (64, 128)),
    (128, 4096, 4096, 1, (64, 64)), (128, 3584, 3584, 1, (64, 64)),  # two row tiles share B: 64-wide fill the wave
    (128, 8192, 28672, 1, (64, 128)),
    (128, 10240, 8192, 1, (64, 256)),  # 80 tiles, one wave, rather than 160 (a wave of 28)
    # M = 112-128 and at most 80 64 x 128 tiles: one 128 x 64 tile streams the two row tiles' B
    (128, 4608, 3584, 1, (128, 64)), (112, 4608, 3584, 1, (128, 64)), (128, 5120, 4096, 1, (128, 64)),
    (96, 4608, 3584, 1, (64, 128)), (128, 4608, 2048, 1, (64, 128)), (128, 5632, 4096, 1, (64, 128)),
    (128, 4608, 3584, 2, (64, 256)),  # measured on single products only: the 64-row rule
])
def test_tile_shape_heuristic(M, N, K, units, tile):
    from numba_hopper.matmul.heuristics import tile_shape as _tile_shape

    assert _tile_shape(M, N, K, units, 132) == tile


def test_rows_together_needs_a_on_128_byte_lines():
    """A 128 x 64 tile reads all of A's rows: not where they straddle 128-byte lines (K = 3104)."""
    from numba_hopper.matmul.heuristics import tile_shape

    assert tile_shape(128, 4608, 3104, 1, 132) == (128, 64)
    assert tile_shape(128, 4608, 3104, 1, 132, a_lines=False) == (64, 128)


@pytest.mark.parametrize("M,N,K,tile", [
    (1024, 3584, 3584, (128, 224)), (2048, 3584, 18944, (128, 224)),  # 128 and 256 tiles: whole waves
    (512, 3584, 18944, (128, 112)), (512, 4608, 3584, (128, 144)), (1024, 4608, 3584, (128, 144)),
    (4096, 6144, 4096, (128, 256)), (4096, 32000, 2048, (128, 192)),  # 256 and 192 fill their waves as well
    (1024, 14336, 4096, (128, 224)),  # ties 128 by the estimate; measured 2.5% faster (bench_gemm --configs)
])
def test_tiles_of_a_k_major_b_fill_waves_with_224_144_and_112_columns(M, N, K, tile):
    from numba_hopper.runtime.arrays import transpose
    from numba_hopper.matmul.heuristics import choose_config, pingpong_width, tile_shape
    from numba_hopper.tools.prebuild import H100, _view

    assert tile_shape(M, N, K, 1, 132, k_major_widths=True) == tile
    x, w, out = _view(M, K, "bf16", True), _view(N, K, "bf16", True), _view(M, N, "bf16", True)
    rc = choose_config(x, transpose(w), out, None, False, limits=H100)  # x @ w.T
    assert rc.block_n == (pingpong_width(M, N, -(-K // 64), 1, 132, tile[1], True) or tile[1])
    # measured only there: not with a row-major B
    rr = choose_config(x, _view(K, N, "bf16", True), out, None, False, limits=H100)
    coop = tile_shape(M, N, K, 1, 132)[1]
    assert rr.block_n == (pingpong_width(M, N, -(-K // 64), 1, 132, coop, False) or coop) and rr.block_n not in (224, 176, 144, 112)


@pytest.mark.parametrize("M,N,K,layout,width", [
    # measured faster than the cooperative default (docs/design/tiles.md)
    (1024, 14336, 4096, "RC", 176), (512, 28672, 4096, "RC", 176), (4096, 5632, 2048, "RC", 176),
    (4096, 4096, 1024, "RC", 128), (4096, 4096, 4096, "RR", 128), (4096, 2048, 2048, "RC", 128),
    # an N-major B takes no 176-wide tiles
    (1024, 14336, 4096, "RR", 128), (4096, 5632, 2048, "RR", 128),
    # under two tiles a CTA (no second tile to hide an epilogue under), many waves (unmeasured), a
    # K over 8192 (measured slower), 64-row tiles
    (512, 3584, 3584, "RC", None), (512, 10240, 8192, "RC", None), (16384, 8192, 8192, "RC", None),
    (4096, 3584, 18944, "RC", None), (4096, 4096, 8256, "RC", None), (128, 4096, 4096, "RC", None),
    # a cluster's tile (128 x 256 in 1x2 over 12 waves) and GPC-ordered clusters keep theirs
    (16384, 4096, 4096, "RR", None), (512, 3584, 18944, "RC", None),
])
def test_plain_products_take_ping_pong_tiles_where_they_fill_waves(M, N, K, layout, width):
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    a, b = _view(M, K, "bf16", layout[0] == "R"), _view(K, N, "bf16", layout[1] == "R")
    cfg = choose_config(a, b, _view(M, N, "bf16", True), None, False, limits=H100)
    assert (cfg.block_n if cfg.pingpong else None) == width, cfg
    if width:
        assert (cfg.block_m, cfg.cluster_size) == (128, 1)
        assert choose_config(a, b, _view(M, N, "f32", True), None, False, limits=H100).pingpong  # f32 out: plain too


@pytest.mark.parametrize("M,N,K,pingpong", [
    # measured faster in 128 x 128 ping-pong tiles with a bias and gelu_tanh (epilogue-pingpong-h200.json)
    (4096, 4096, 4096, True), (8192, 8192, 8192, True), (4096, 5632, 2048, True), (8192, 14336, 4096, True),
    # under two tiles a CTA: no second tile to hide the first's epilogue under
    (1024, 4096, 4096, False), (512, 3584, 3584, False),
])
def test_fused_16_bit_products_take_ping_pong_tiles_where_they_pay(M, N, K, pingpong):
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    gelu = EpilogueConfig(bias="col", bias_dtype="bf16", activation="gelu_tanh")
    residual = EpilogueConfig(c_dtype="bf16", bias="col", bias_dtype="bf16")
    for layout in ("RC", "RR"):
        a, b, out = _view(M, K, "bf16", True), _view(K, N, "bf16", layout[1] == "R"), _view(M, N, "bf16", True)
        fused = choose_config(a, b, out, None, False, epilogue=gelu, limits=H100)
        assert fused.pingpong == pingpong and (not pingpong or fused.block_n == 128), fused
        assert not choose_config(a, b, out, None, False, epilogue=residual, limits=H100).pingpong  # C: cooperative


@pytest.mark.parametrize("M,N,K,layout,clustered", [
    # a training step's forward (RC) and dW (CR) products: 2x1 clusters, in place of unclustered
    # 128 x 256 or 128 x 192, ping-pong, or the default's 1x2 clusters
    (8192, 2560, 9728, "RC", True), (8192, 4096, 4096, "RC", True), (9728, 2560, 8192, "CR", True),
    (8192, 151936, 2560, "RC", True), (8192, 9728, 2560, "RC", True), (32000, 2048, 8192, "CR", True),
    (151936, 2560, 8192, "CR", True), (14336, 4096, 8192, "CR", True),
    # ping-pong tiles' products of 2.7 and 3.9 waves of clusters, dX (RR) included
    (5632, 2048, 8192, "CR", True), (8192, 2048, 5632, "RC", True), (8192, 2048, 2048, "RR", True),
    # a dX in unclustered 128 x 256 tiles; 2.4 waves (4096x2560: a last wave 42% full); 1 wave
    (8192, 4096, 14336, "RR", False), (4096, 2560, 8192, "CR", False), (2048, 2048, 2048, "RC", False),
])
def test_sustained_config_takes_2x1_clusters_where_they_fill_their_waves(M, N, K, layout, clustered):
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    a, b = _view(M, K, "bf16", layout[0] == "R"), _view(K, N, "bf16", layout[1] == "R")
    out = _view(M, N, "bf16", True)
    default = choose_config(a, b, out, None, False, limits=H100)
    sustained = choose_config(a, b, out, None, False, limits=H100, sustained=True)
    if clustered:
        assert default.cluster_m == 1
        assert (sustained.block_m, sustained.block_n, sustained.cluster_m, sustained.cluster_n) == (128, 256, 2, 1)
        assert not sustained.pingpong
        # the output layer's products (48 waves of clusters or more) take their tiles dynamically,
        # the others in GPC order over the raster walked row by row
        dynamic = M * N >= 151936 * 2560
        assert sustained.dynamic_schedule == dynamic
        assert (sustained.cluster_order, sustained.group_n) == (("launch", 0) if dynamic else ("gpc", 8))
    else:
        assert sustained == default
    fused = EpilogueConfig(activation="relu")  # plain products only: what was measured
    assert choose_config(a, b, out, None, False, fused, limits=H100, sustained=True) == \
        choose_config(a, b, out, None, False, fused, limits=H100)


@pytest.mark.parametrize("M,N,K,layout,tile", [
    # one wave of 1x2 cluster tiles under 128 wide, 3/4 full or more, over K >= 8192: GPC-ordered clusters
    (512, 3584, 18944, "RC", (128, 112)), (256, 3584, 18944, "RC", (128, 64)),
    # none: tiles 128 or more wide, several waves, too few tiles, a short K loop, 64-row tiles
    (512, 4096, 14336, "RC", None), (1024, 3584, 18944, "RC", None), (512, 8192, 8192, "RR", None),
    (4096, 4096, 16384, "RC", None), (128, 3584, 18944, "RC", None), (512, 3584, 4096, "RC", None),
    (64, 4096, 14336, "RC", None)])
def test_gpc_ordered_clusters_take_one_long_wave(M, N, K, layout, tile):
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    a, b, out = _view(M, K, "bf16", layout[0] == "R"), _view(K, N, "bf16", layout[1] == "R"), _view(M, N, "bf16", True)
    cfg = choose_config(a, b, out, None, False, limits=H100)
    got = (cfg.block_m, cfg.block_n) if cfg.cluster_order == "gpc" else None
    assert got == tile, cfg
    if tile:
        assert (cfg.cluster_m, cfg.cluster_n) == (1, 2)
        # only for plain products with 16-bit outputs (where it was measured)
        f32_out = choose_config(a, b, _view(M, N, "f32", True), None, False, limits=H100)
        assert f32_out.cluster_order == "launch"


def test_configs_that_cannot_run_are_refused():
    with pytest.raises(ValueError, match="16-column sub-tiles"):
        GemmConfig("e4m3", "e4m3", "K", "K", block_n=144)
    with pytest.raises(ValueError, match="multiple of 128 columns"):  # 3 boxes of B over 2 CTAs
        GemmConfig(block_n=192, cluster_m=2)
    assert GemmConfig(block_n=192, cluster_m=2, b_major="K").b_box == (1, 96, 64)


@pytest.mark.parametrize("block_n,out_dtype,cols,swizzle", [(256, "bf16", 64, 128), (224, "bf16", 32, 64),
                                                            (144, "bf16", 16, 32), (112, "f32", 16, 64)])
def test_epilogue_sub_tiles_divide_the_tile(block_n, out_dtype, cols, swizzle):
    cfg = GemmConfig(out_dtype=out_dtype, block_n=block_n)
    assert (cfg.epi_cols, cfg.epi_swizzle) == (cols, swizzle) and block_n % cols == 0


@pytest.mark.parametrize("M,N,K,block_n", [
    (8, 2048, 2048, 8), (1, 3584, 3584, 8), (16, 4096, 4096, 16), (9, 2048, 5632, 16),
    (17, 2048, 2048, None),  # more tokens than wgmma's narrow N takes
    (8, 2048, 8192, 8), (1, 4096, 14336, 8), (16, 3584, 18944, 16),  # ... in two K slices
    (8, 2048, 16384, None), (1, 2048, 65536, None),  # ... in four
    (8, 32000, 2048, 8), (1, 6144, 4096, 8), (16, 57344, 8192, 16),  # wider 64-row tiles, whole K
])
def test_decode_products_run_swapped_unless_the_64_row_tiling_splits_k_in_four(M, N, K, block_n):
    from numba_hopper.runtime.arrays import DeviceView, transpose
    from numba_hopper.matmul.heuristics import choose_config, narrow_config, narrow_tokens
    from numba_hopper.tools.prebuild import H100, _view

    assert narrow_tokens(M, N, K, 132) == block_n
    a, w, out = _view(M, K, "bf16", True), _view(N, K, "bf16", True), _view(M, N, "bf16", True)
    cfg = narrow_config(a, transpose(w), out, H100)  # x @ w.t()
    assert (cfg and cfg.block_n) == block_n
    if cfg is not None:  # the swapped product's kernel: w row-major as A, the tokens K-major as B
        run = choose_config(w, transpose(a), transpose(out), cfg, False, limits=H100)
        assert (run.a_major, run.b_major, run.out_major, run.block_m, run.stages) == ("K", "K", "M", 64, 12)
        assert run.shared_bytes <= H100.max_shared_per_block_optin
    f32_out = DeviceView(1 << 20, (M, N), (N, 1), "f32", 4, 0, "numba")
    col_major_a = _view(M, K, "bf16", False)
    assert narrow_config(a, transpose(w), f32_out, H100) is None
    assert narrow_config(col_major_a, transpose(w), out, H100) is None or M == 1


@pytest.mark.parametrize("tiles,K,b_major,cluster", [
    (2048, 4096, "N", True), (2048, 8192, "N", True), (512, 4096, "N", False), (1152, 6144, "N", False),
    (4096, 1024, "N", False), (1024, 512, "N", False), (2048, 8192, "K", False)])
def test_cluster_heuristic(tiles, K, b_major, cluster):
    from numba_hopper.matmul.heuristics import cluster_pays as _cluster_pays

    assert _cluster_pays(tiles, K, b_major, 132) == cluster


@pytest.mark.parametrize("M,N,K,layout,tile", [
    # both operands' rows straddle: 192 x 192 tiles in 1x2 or 2x1 clusters where they take
    # fewer waves, else 2x2 clusters of 128 x 128 tiles (always with a row-major B and a
    # column-major A)
    (3000, 3000, 3000, "RR", (192, 192, 1, 2)), (3000, 3000, 3000, "CC", (192, 192, 2, 1)),
    (5000, 5000, 5000, "RR", (192, 192, 1, 2)), (16384, 3000, 3000, "RC", (192, 192, 1, 2)),
    (8192, 5000, 5000, "RC", (192, 192, 2, 1)),  # 27 tiles across: 1x2 clusters would pad to 28
    (3000, 3000, 3000, "CR", (128, 128, 2, 2)), (2000, 3000, 3000, "RR", (128, 128, 2, 2)),
    (1024, 5000, 5000, "RC", (128, 128, 2, 2)), (512, 3000, 3000, "RC", (128, 128, 2, 2)),
    (1000, 1000, 1000, "CR", (128, 128, 2, 2)),
    # B's alone: 2x1 clusters sharing B, 256 or 128 wide by waves
    (4096, 1000, 4096, "RR", (128, 256, 2, 1)), (8192, 3000, 4096, "RR", (128, 256, 2, 1)),
    (2048, 1000, 4096, "RR", (128, 128, 2, 1)), (1024, 5000, 4096, "RR", (128, 128, 2, 1)),
    # none: A's rows alone, rows along M or N (aligned), pitches of a multiple of 32 bytes, 16 tiles, 64-row tiles
    (4096, 4096, 3000, "RR", None), (4096, 4096, 3000, "CR", None), (4096, 3000, 4096, "RC", None),
    (2000, 2000, 2000, "RR", None), (6000, 6000, 6000, "RR", None), (256, 1000, 1000, "RC", None),
    (128, 3000, 3000, "RC", None)])
def test_rows_straddling_sectors_run_in_clusters(M, N, K, layout, tile):
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    a, b = _view(M, K, "bf16", layout[0] == "R"), _view(K, N, "bf16", layout[1] == "R")
    cfg = choose_config(a, b, _view(M, N, "bf16", True), None, False, limits=H100)
    if tile is None:
        assert (cfg.cluster_m, cfg.cluster_n) == (1, 1)
    else:
        assert (cfg.block_m, cfg.block_n, cfg.cluster_m, cfg.cluster_n) == tile
        # three consumers keep one output buffer each, for a fourth ring slot
        assert cfg.epi_buffers == 2 if cfg.block_m == 128 else (cfg.epi_buffers, cfg.stages) == (1, 4)


def test_straddling_192_tiles_only_for_plain_16_bit_outputs():
    from numba_hopper.matmul.heuristics import choose_config
    from numba_hopper.tools.prebuild import H100, _view

    a, b = _view(3000, 3000, "bf16", True), _view(3000, 3000, "bf16", True)
    for out, epilogue in [(_view(3000, 3000, "f32", True), None),
                          (_view(3000, 3000, "bf16", True), EpilogueConfig(activation="silu"))]:
        cfg = choose_config(a, b, out, None, False, epilogue=epilogue, limits=H100)
        assert (cfg.block_m, cfg.block_n, cfg.cluster_m, cfg.cluster_n, cfg.epi_buffers) == (128, 128, 2, 2, 2)


@pytest.mark.parametrize("M,N,K,block,splits", [
    (64, 4096, 4096, (128, 64), 1), (1024, 1024, 1024, (128, 64), 1), (64, 2048, 16384, (128, 64), 4),
    (128, 1024, 65536, (128, 64), 8), (64, 256, 4096, (128, 64), 1),
    # 64-row tiles: slices where they stream faster, only for M <= 64
    (1, 4096, 14336, (64, 128), 2), (1, 3584, 18944, (64, 128), 2), (16, 8192, 8192, (64, 128), 1),
    (1, 4096, 14336, (64, 64), 1), (128, 4096, 14336, (64, 128), 1)])
def test_split_k_heuristic(M, N, K, block, splits):
    from numba_hopper.matmul.heuristics import split_count as _split_count

    assert _split_count(GemmConfig(block_m=block[0], block_n=block[1]), M, N, K, 132) == splits
