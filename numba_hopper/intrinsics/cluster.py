"""Thread-block clusters: ids, distributed shared memory (DSMEM) and cluster barriers.

A kernel runs in clusters only when launched with one (``numba_hopper.launch.launch(...,
cluster=...)``); otherwise every CTA is a cluster of one.

DSMEM: ``mapa(addr, rank)`` turns this CTA's 32-bit shared address ``addr`` into the
``shared::cluster`` address of the same offset in CTA ``rank`` of the cluster; read and
write it with ``ld_shared_cluster_*``/``st_shared_cluster_*``. A CTA's shared memory must
not be accessed by others before it has started or after it has exited: bracket DSMEM use
with ``cluster_sync()`` (or ``cluster_arrive()`` ... ``cluster_wait()``).

The cluster barrier instructions are ``.aligned``: every thread of a warp executes the same
one (no divergent calls), and every thread of every CTA in the cluster must arrive.
"""

from ._ptx import ptx_intrinsic

__all__ = [
    "cluster_ctarank",
    "cluster_nctarank",
    "mapa",
    "getctarank",
    "cluster_arrive",
    "cluster_arrive_relaxed",
    "cluster_wait",
    "cluster_sync",
    "ld_shared_cluster_u32",
    "ld_shared_cluster_f32",
    "st_shared_cluster_u32",
    "st_shared_cluster_f32",
]

_SREG = "PTX ISA 10 Special Registers"

cluster_ctarank = ptx_intrinsic(
    "cluster_ctarank",
    "mov.u32 {out}, %cluster_ctarank;",
    result="u32",
    pure=True,
    doc=f"{_SREG}: %cluster_ctarank, this CTA's rank in its cluster (0..cluster_nctarank()-1).",
)

cluster_nctarank = ptx_intrinsic(
    "cluster_nctarank",
    "mov.u32 {out}, %cluster_nctarank;",
    result="u32",
    pure=True,
    doc=f"{_SREG}: %cluster_nctarank, the number of CTAs in the cluster.",
)

# %clusterid (cluster index in the grid), %nclusterid (clusters in the grid),
# %cluster_ctaid (CTA index in the cluster), %cluster_nctaid (cluster shape), per axis.
_AXES_DOC = {
    "cluster_id": ("clusterid", "this cluster's index in the grid"),
    "cluster_nclusterid": ("nclusterid", "the number of clusters in the grid"),
    "cluster_ctaid": ("cluster_ctaid", "this CTA's index in its cluster"),
    "cluster_nctaid": ("cluster_nctaid", "the cluster's shape in CTAs"),
}
for _name, (_reg, _what) in _AXES_DOC.items():
    for _axis in "xyz":
        globals()[f"{_name}_{_axis}"] = ptx_intrinsic(
            f"{_name}_{_axis}",
            f"mov.u32 {{out}}, %{_reg}.{_axis};",
            result="u32",
            pure=True,
            doc=f"{_SREG}: %{_reg}.{_axis}, {_what} along {_axis}.",
        )
        __all__.append(f"{_name}_{_axis}")

mapa = ptx_intrinsic(
    "mapa",
    "mapa.shared::cluster.u32 {out}, {addr}, {rank};",
    result="u32",
    pure=True,
    doc="PTX ISA 9.7.9.23 mapa: the shared::cluster address of shared address `addr` in the "
    "CTA of cluster rank `rank`.",
    addr="u32",
    rank="u32",
)

getctarank = ptx_intrinsic(
    "getctarank",
    "getctarank.shared::cluster.u32 {out}, {addr};",
    result="u32",
    pure=True,
    doc="PTX ISA 9.7.9.24 getctarank: the cluster rank of the CTA owning shared::cluster "
    "address `addr`.",
    addr="u32",
)

cluster_arrive = ptx_intrinsic(
    "cluster_arrive",
    "barrier.cluster.arrive.release.aligned;",
    doc="PTX ISA 9.7.13.3 barrier.cluster: arrive (release) at the cluster barrier.",
)

cluster_arrive_relaxed = ptx_intrinsic(
    "cluster_arrive_relaxed",
    "barrier.cluster.arrive.relaxed.aligned;",
    doc="PTX ISA 9.7.13.3 barrier.cluster: arrive without memory ordering (e.g. only to say "
    "'this CTA has started').",
)

cluster_wait = ptx_intrinsic(
    "cluster_wait",
    "barrier.cluster.wait.acquire.aligned;",
    doc="PTX ISA 9.7.13.3 barrier.cluster: wait (acquire) until every thread of the cluster "
    "has arrived.",
)

cluster_sync = ptx_intrinsic(
    "cluster_sync",
    "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;",
    doc="PTX ISA 9.7.13.3 barrier.cluster: arrive (release) then wait (acquire): a cluster-wide "
    "__syncthreads.",
)

ld_shared_cluster_u32 = ptx_intrinsic(
    "ld_shared_cluster_u32",
    "ld.shared::cluster.u32 {out}, [{addr}];",
    result="u32",
    doc="PTX ISA 9.7.9.8 ld: load a u32 from shared::cluster address `addr` (see mapa).",
    addr="u32",
)

ld_shared_cluster_f32 = ptx_intrinsic(
    "ld_shared_cluster_f32",
    "ld.shared::cluster.f32 {out}, [{addr}];",
    result="f32",
    doc="PTX ISA 9.7.9.8 ld: load an f32 from shared::cluster address `addr` (see mapa).",
    addr="u32",
)

st_shared_cluster_u32 = ptx_intrinsic(
    "st_shared_cluster_u32",
    "st.shared::cluster.u32 [{addr}], {value};",
    doc="PTX ISA 9.7.9.10 st: store a u32 to shared::cluster address `addr` (see mapa).",
    addr="u32",
    value="u32",
)

st_shared_cluster_f32 = ptx_intrinsic(
    "st_shared_cluster_f32",
    "st.shared::cluster.f32 [{addr}], {value};",
    doc="PTX ISA 9.7.9.10 st: store an f32 to shared::cluster address `addr` (see mapa).",
    addr="u32",
    value="f32",
)

del _name, _reg, _what, _axis
