"""numba_hopper.attention without a GPU: the kernels' SASS (each tuned configuration, and f16 once), the tile
walk and block counts against brute force, the host checks on CPU tensors, the op's fake
implementation, and the kit's overlap check.

    python -m pytest -q -n 0 tests/test_attention_cpu.py
"""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from numba_hopper.attention.config import (HEAD_DIMS, SHORT_CAUSAL_64, AttentionConfig, argument_types,
                                           attention_config, l2_section, tuned_configs)
from numba_hopper.attention.kernel import make_attention_kernel, warp_split
from numba_hopper.attention.scheduler import (NO_TILE, TILE_OVERHEAD, balanced_schedule, make_key_blocks,
                                              schedule_walks, tile_costs, walk_host)
from numba_hopper.kit.overlap import make_wait_after, wgmma_stages
from numba_hopper.tools.sass import inspect_kernel

# One compile per code path: each tuned configuration has its own tile, ring depth, turn-taking and
# output staging (tuned_configs); the dtype only names the wgmmas' and the packs' element type, so
# f16 is compiled once, at the quickest head dim. (A parameter's tests are one xdist unit: conftest.py.)
KERNELS = tuned_configs(("bf16",)) + [attention_config(64, "f16")]


@pytest.fixture(scope="module", params=KERNELS, ids=[f"d{c.head_dim}-{c.dtype}-{c.block_m}" for c in KERNELS])
def compiled(request):
    cfg = request.param
    return cfg, inspect_kernel(make_attention_kernel(cfg), argument_types(cfg))


@pytest.mark.kernel_matrix
def test_kernel_compiles_without_spills_or_serialization(compiled):
    cfg, r = compiled
    assert r.spill_bytes == 0 and r.stack_frame == 0, r.summary()
    assert not r.warnings, r.summary()  # no C7513/C7514/C7517 (serialized or waited wgmmas), no C7508
    assert not r.setmaxnreg_ignored and r.count("USETMAXREG") == 2, r.summary()
    assert not r.warpsync_before_wgmma, r.summary()
    assert "CALL" not in r.sass, "a subroutine call (64-bit division, precise reciprocal) in the kernel"


@pytest.mark.kernel_matrix
def test_kernel_has_the_intended_instructions(compiled):
    cfg, r = compiled
    wgmmas = [line.split("HGMMA.")[1] for line in r.sass.splitlines() if "HGMMA." in line]
    qk = [w for w in wgmmas if w.startswith("64x%dx16" % cfg.block_n) and "tnspB" not in w]
    pv = [w for w in wgmmas if w.startswith("64x%dx16" % cfg.head_dim) and "tnspB" in w]
    assert len(qk) == 3 * cfg.head_dim // 16  # S = Q K^T: the first block, the masked and the plain steps
    assert len(pv) == 3 * cfg.block_n // 16 and len(wgmmas) == len(qk) + len(pv)  # O += P V: the steps, the tail
    assert all(w.split(",")[1].strip().startswith("R") for w in pv)  # P from registers (RS)
    assert r.count("UTMALDG") >= 3 * cfg.boxes and r.count("UTMASTG") == cfg.boxes
    assert r.count("STSM") == cfg.head_dim // 16 and r.count("MUFU.EX2") >= 3 * cfg.block_n // 2
    assert r.count("WARPGROUP.ARRIVE") == 6 and r.count("SHFL.BFLY") >= 8
    assert (r.count("BAR.ARV") >= 2) == cfg.take_turns  # the consumers' turns


@pytest.mark.kernel_matrix
def test_softmax_runs_under_the_p_v_wgmmas(compiled):
    """In both loop bodies every exponential of the block's softmax lies between the P V wgmmas'
    issue and their wait, and nothing writes P's registers while those wgmmas run."""
    cfg, r = compiled
    stages = [s for s in wgmma_stages(r.sass) if s.a_registers and s.count("WARPGROUP.DEPBAR")]
    assert len(stages) == 2, [(s.first_line, s.wait_line) for s in wgmma_stages(r.sass)]
    for stage in stages:
        assert stage.count("MUFU.EX2") >= cfg.block_n // 2 + 2, stage
        assert stage.count("SHFL.BFLY") >= 4 and not stage.a_register_writes, stage


@pytest.mark.kernel_matrix
def test_a_share_of_exponentials_moves_to_the_fma_pipe():
    """``exp2_fma_eighths=2``: a quarter of each block's exponentials leave the MUFU for the
    cubic (``ex2_fma``), still under the P V wgmmas, without spills."""
    cfg = AttentionConfig(64, block_n=128, stages=3, early_q_release=False, exp2_fma_eighths=2)
    r = inspect_kernel(make_attention_kernel(cfg), argument_types(cfg))
    assert r.spill_bytes == 0 and r.stack_frame == 0 and not r.warnings, r.summary()
    stages = [s for s in wgmma_stages(r.sass) if s.a_registers and s.count("WARPGROUP.DEPBAR")]
    assert len(stages) == 2
    for stage in stages:  # 3/4 of the block's 64 a thread, and the two corrections
        assert stage.count("MUFU.EX2") == cfg.block_n // 2 * 3 // 4 + 2, stage
        assert stage.count("FFMA") >= cfg.block_n // 2 + 3 * cfg.block_n // 8, stage
    with pytest.raises(ValueError, match="exp2_fma_eighths"):
        AttentionConfig(64, exp2_fma_eighths=9)


def test_register_budget_and_shared_memory():
    for cfg in tuned_configs():
        ws = warp_split(cfg)
        assert ws.threads == cfg.threads == 128 * (1 + cfg.consumers)
        assert ws.consumer_regs == cfg.consumer_regs == {2: 240, 3: 160}[cfg.consumers]
        assert cfg.shared_bytes <= 232448
        offsets = cfg.smem.offsets
        assert all(offsets[n] % 1024 == 0 for n in ("q", "k", "v")) and offsets["pin"] % 8 == 0
    with pytest.raises(ValueError, match="head_dim"):
        AttentionConfig(96)


def test_head_dim_64_short_causal_calls_take_128_row_tiles():
    long_tiles = attention_config(64, "bf16")
    assert long_tiles.block_m == 192 and long_tiles.early_q_release
    assert attention_config(64, "bf16", True, SHORT_CAUSAL_64) == long_tiles
    short = attention_config(64, "bf16", True, SHORT_CAUSAL_64 - 1)
    assert short.block_m == 128 and not short.early_q_release
    assert attention_config(64, "bf16", False, 1) == long_tiles
    assert attention_config(128, "bf16", True, 1) == attention_config(128, "bf16")
    assert len(tuned_configs()) == 2 * (len(HEAD_DIMS) + 1)
    with pytest.raises(ValueError, match="shared memory"):
        AttentionConfig(256, block_n=128, stages=2)


@pytest.mark.parametrize("m_blocks, pairs, section, causal, ctas", [
    (5, 7, 1, False, 4), (4, 6, 4, True, 5), (9, 3, 2, True, 4), (1, 1, 1, True, 3), (7, 5, 5, True, 132)])
def test_walk_covers_every_tile_once(m_blocks, pairs, section, causal, ctas):
    walks = walk_host(m_blocks, pairs, section, causal, ctas)
    tiles = [tile for walk in walks for tile in walk]
    assert sorted(tiles) == sorted(itertools.product(range(m_blocks), range(pairs)))


# (m_blocks, pairs, section) of the benchmark's causal launches: d64 / d128 / d256 at 2k and 16k
# tokens a sequence, MHA and GQA (l2_section's sections).
CAUSAL_LAUNCHES = [(16, 256, 32), (128, 32, 8), (16, 128, 16), (128, 16, 4), (16, 64, 16), (128, 8, 2),
                   (16, 128, 128), (128, 16, 16)]


@pytest.mark.parametrize("m_blocks, pairs, section", CAUSAL_LAUNCHES)
def test_causal_walk_balances_the_ctas(m_blocks, pairs, section):
    """Each CTA's key blocks (what its time goes with) within 5% of the mean of 132 CTAs."""
    key_blocks = make_key_blocks(128, 128)
    S = m_blocks * 128
    loads = [sum(key_blocks(m * 128, S, S, 0)[0] for m, _ in walk) for walk in walk_host(m_blocks, pairs, section, True, 132)]
    assert max(loads) <= 1.05 * sum(loads) / len(loads)


@pytest.mark.parametrize("m_blocks, pairs, section, ctas", [(5, 7, 1, 4), (4, 6, 4, 5), (1, 1, 1, 1), (7, 5, 5, 35)])
def test_balanced_schedule_covers_every_tile_once(m_blocks, pairs, section, ctas):
    table = balanced_schedule(tile_costs(m_blocks, 128, 128, 128 * m_blocks, 128 * m_blocks, 0), pairs, section, ctas)
    assert table.shape[1] == ctas and (table[-1] == NO_TILE).all()
    tiles = [tile for walk in schedule_walks(table, m_blocks) for tile in walk]
    assert sorted(tiles) == sorted(itertools.product(range(m_blocks), range(pairs)))
    for column in table.T:  # a CTA's tiles come first, then NO_TILE only
        assert (column[:(column != NO_TILE).sum()] != NO_TILE).all()


@pytest.mark.parametrize("m_blocks, pairs, section", CAUSAL_LAUNCHES)
def test_balanced_schedule_beats_the_paired_walk(m_blocks, pairs, section):
    """In the cost model, every CTA ends within one tile of the mean (list scheduling's bound),
    and the launch (its slowest CTA) ends sooner than the paired walk's."""
    S = 128 * m_blocks
    costs = tile_costs(m_blocks, 128, 128, S, S, 0)
    assert costs == [m + 1 + TILE_OVERHEAD for m in range(m_blocks)]
    mean = sum(costs) * pairs / 132
    scheduled = [sum(costs[m] for m, _ in walk) for walk in schedule_walks(balanced_schedule(costs, pairs, section, 132),
                                                                          m_blocks)]
    paired = [sum(costs[m] for m, _ in walk) for walk in walk_host(m_blocks, pairs, section, True, 132)]
    assert max(scheduled) <= mean + max(costs) and max(scheduled) < max(paired)


def test_l2_section():
    assert l2_section(64, 16384, 128, 1) == 4  # 8 MB of K and V per head: 4 in 32 MB
    assert l2_section(64, 1 << 20, 128, 8) == 8  # one K/V head per section, its 8 query heads
    assert l2_section(3, 1024, 64, 1) == 3


@pytest.mark.parametrize("block_n,block_m", [(80, 128), (128, 128), (128, 192)])
def test_key_blocks_against_brute_force(block_n, block_m):
    """The blocks a tile visits cover every key one of its rows sees; the unmasked ones are
    seen whole by every row."""
    key_blocks = make_key_blocks(block_n, block_m)
    for sq, sk, causal, bottom_right in itertools.product((1, 100, 129, 300), (0, 1, 80, 129, 300), (False, True),
                                                          (False, True)):
        diag = (sk - sq if bottom_right else 0) if causal else sk
        for m0 in range(0, sq, block_m):
            rows = np.arange(m0, min(m0 + block_m, sq))[:, None]
            keys = np.arange(sk)[None, :]
            visible = (keys <= rows + diag) & (keys < sk)
            n_blocks, n_masked = (int(x) for x in key_blocks(np.int32(m0), np.int32(sq), np.int32(sk),
                                                              np.int32(diag)))
            needed = 0 if not visible.any() else int(np.nonzero(visible.any(0))[0].max()) // block_n + 1
            assert n_blocks == needed, (sq, sk, causal, bottom_right, m0)
            for n in range(n_blocks - n_masked):  # unmasked: every row of the tile sees the whole block
                assert n * block_n + block_n <= sk and visible[:, n * block_n:(n + 1) * block_n].all()


# --- host checks (CPU tensors: every check before the device is reached) ------------------


torch = pytest.importorskip("torch")


def _t(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype)


def test_bad_input_raises_before_launch():
    import numba_hopper
    from numba_hopper import DeviceMismatchError, DtypeError, LayoutError, ShapeError

    q = _t(2, 4, 100, 128)
    attn = numba_hopper.attention
    with pytest.raises(DtypeError, match="bfloat16 or float16"):
        attn(q.float(), q.float(), q.float())
    with pytest.raises(DtypeError, match="one dtype"):
        attn(q, q.half(), q)
    with pytest.raises(ShapeError, match="head dim 96"):
        attn(_t(2, 4, 100, 96), _t(2, 4, 100, 96), _t(2, 4, 100, 96))
    with pytest.raises(ShapeError, match="multiple of the key/value heads"):
        attn(q, _t(2, 3, 100, 128), _t(2, 3, 100, 128))
    with pytest.raises(ShapeError, match="batch"):
        attn(q, _t(3, 4, 100, 128), _t(3, 4, 100, 128))
    with pytest.raises(ShapeError, match="4-D"):
        attn(q[0], q[0], q[0])
    with pytest.raises(ShapeError, match="v must have k's shape"):
        attn(q, q, _t(2, 4, 100, 64))
    with pytest.raises(ValueError, match="causal_align"):
        attn(q, q, q, causal=True, causal_align="upper")
    with pytest.raises(ValueError, match="scale"):
        attn(q, q, q, scale=-1.0)
    with pytest.raises(LayoutError, match="out"):
        attn(q, q, q, out=_t(2, 4, 100, 256)[..., ::2])
    with pytest.raises(ShapeError, match="out"):
        attn(q, q, q, out=_t(2, 4, 101, 128))
    with pytest.raises(TypeError, match="CUDA"):
        attn(q, q, q)
    with pytest.raises(DeviceMismatchError):
        attn(q, q.to("meta"), q)


def test_an_explicit_config_must_be_of_the_calls_head_dim_and_dtype():
    from numba_hopper.attention.checks import check_config

    problem = SimpleNamespace(head_dim=128, dtype="bf16")
    check_config(AttentionConfig(128, block_n=176, o_aliases_q=True), problem)
    with pytest.raises(ValueError, match="head dim 64, bf16; the call has head dim 128"):
        check_config(AttentionConfig(64), problem)
    with pytest.raises(ValueError, match="f16"):
        check_config(AttentionConfig(128, "f16"), problem)
    with pytest.raises(TypeError, match="must be an AttentionConfig"):
        check_config({"block_n": 176}, problem)


def test_bad_packed_input_raises_before_launch():
    import numba_hopper
    from numba_hopper import ShapeError

    q, cu = _t(300, 4, 64), torch.tensor([0, 100, 300], dtype=torch.int32)
    attn = numba_hopper.attention
    with pytest.raises(ValueError, match="max_seqlen_q"):
        attn(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match="both"):
        attn(q, q, q, cu_seqlens_q=cu, max_seqlen_q=200, max_seqlen_k=200)
    with pytest.raises(ShapeError, match="int32"):
        attn(q, q, q, cu_seqlens_q=cu.long(), cu_seqlens_k=cu, max_seqlen_q=200, max_seqlen_k=200)
    with pytest.raises(ShapeError, match="3-D"):
        attn(q[None], q[None], q[None], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200, max_seqlen_k=200)
    with pytest.raises(TypeError, match="CUDA"):
        attn(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=200, max_seqlen_k=200)


def test_fake_implementation_shapes():
    import numba_hopper.torch  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = torch.ops.numba_hopper.attention.default
    with FakeTensorMode():
        q, k = torch.empty(2, 8, 100, 128, dtype=torch.bfloat16), torch.empty(2, 2, 70, 128, dtype=torch.bfloat16)
        out, lse = op(q, k, k, True, "top_left", None, None, None, None, None, False)
        assert out.shape == q.shape and lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        out, _ = op(q, k, k, False, "bottom_right", None, None, None, None, None, True)
        assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()  # (batch, seq, heads, dim) storage
        packed, cu = torch.empty(300, 8, 64, dtype=torch.float16), torch.empty(3, dtype=torch.int32)
        out, lse = op(packed, packed, packed, False, "bottom_right", None, cu, cu, 200, 200, False)
        assert out.shape == packed.shape and lse.shape == (8, 300)


def test_sdpa_drop_in_falls_back_on_the_cpu():
    import numba_hopper.torch as nht

    q = torch.randn(1, 2, 8, 64)
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.equal(nht.scaled_dot_product_attention(q, q, q, is_causal=True), ref)


def _mask_arguments(**changes):
    from transformers.masking_utils import causal_mask_function

    return dict(dict(batch_size=2, q_length=16, kv_length=16, q_offset=0, kv_offset=0,
                     mask_function=causal_mask_function, attention_mask=None, allow_is_causal_skip=True,
                     dtype=torch.float32, config=None, use_vmap=False, device="cpu"), **changes)


def test_causal_mask_leaves_out_an_unpadded_causal_mask_in_a_trace_too():
    pytest.importorskip("transformers")
    from numba_hopper.torch.attention import causal_mask

    for unpadded in (_mask_arguments(), _mask_arguments(q_length=1, kv_length=40, q_offset=39),
                     _mask_arguments(local_size=32)):
        assert causal_mask(**unpadded) is None
        traced = torch.compile(lambda x, a=unpadded: x if causal_mask(**a) is None else x + 1, backend="eager",
                               fullgraph=True)
        assert torch.equal(traced(torch.zeros(2)), torch.zeros(2)), unpadded

    padding = torch.ones(2, 16, dtype=torch.bool)
    padding[1, :5] = False
    masked = {"padding": _mask_arguments(attention_mask=padding),
              "no causal skip": _mask_arguments(allow_is_causal_skip=False),
              "queries after a prefix": _mask_arguments(q_length=8, q_offset=8),
              "window shorter than the keys": _mask_arguments(local_size=8)}
    for case, arguments in masked.items():
        mask = causal_mask(**arguments)
        assert mask is not None and mask.shape == (2, 1, arguments["q_length"], 16), case
    assert not causal_mask(**masked["padding"])[1, 0, :, :5].any()


def test_transformers_backend_matches_sdpa_on_the_cpu():
    transformers = pytest.importorskip("transformers")
    import numba_hopper.torch as nht

    name = nht.register_transformers_attention()
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (2, 12))
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, :4] = 0
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": padding}):
            model.set_attn_implementation("sdpa")
            ref = model(ids, **kwargs).logits
            model.set_attn_implementation(name)
            assert torch.allclose(model(ids, **kwargs).logits, ref, atol=1e-5), kwargs


def test_pinned_wait_factory_checks_its_count():
    with pytest.raises(ValueError, match="0..7"):
        make_wait_after(8)
    make_wait_after(1)


def test_wgmma_stages_reads_a_listing():
    sass = "\n".join([
        "        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, R100, gdesc[UR8].tnspB, R24, gsb0 ;",
        "        /*0010*/                   MUFU.EX2 R3, R4 ;",
        "        /*0020*/                   IMAD.MOV.U32 R101, RZ, RZ, R3 ;",
        "        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
        "        /*0040*/                   MUFU.EX2 R5, R6 ;",
    ])
    (stage,) = wgmma_stages(sass)
    assert stage.wgmmas == 1 and stage.count("MUFU.EX2") == 1 and stage.a_registers == {100, 101, 102, 103}
    assert len(stage.a_register_writes) == 1 and "R101" in stage.a_register_writes[0]


def test_new_intrinsics_compile():
    """``st_global_f32`` is one STG.E; ``opaque_u32`` costs nothing once ptxas has removed its mov,
    yet keeps LLVM from hoisting what depends on it out of a loop."""
    from numba import cuda

    from numba_hopper.intrinsics.gmem_f32 import st_global_f32
    from numba_hopper.intrinsics.opaque import opaque_u32

    @cuda.jit
    def store(addr, x, n):
        for i in range(n):
            base = opaque_u32(np.uint32(addr))  # loop-invariant, but computed in the loop
            st_global_f32(np.uint64(base) + 4 * i, x)

    r = inspect_kernel(store, "void(int64, float32, int32)")
    assert r.count("STG.E") >= 1 and r.spill_bytes == 0 and "st.global.f32" in r.ptx, r.summary()
    assert "mov.b32" in r.ptx
