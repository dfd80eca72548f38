"""Thread-block clusters: ids, distributed shared memory (DSMEM), cluster barriers, and the SM a
CTA runs on.

A kernel runs in clusters only when launched with one (``numba_hopper.runtime.launch.launch(...,
cluster=...)``); otherwise every CTA is a cluster of one.

DSMEM: ``mapa(addr, rank)`` turns this CTA's 32-bit shared address ``addr`` into the
``shared::cluster`` address of the same offset in CTA ``rank`` of the cluster; read and
write it with ``ld_shared_cluster_*``/``st_shared_cluster_*``. A CTA's shared memory must
not be accessed by others before it has started or after it has exited: bracket DSMEM use
with ``cluster_sync()`` (or ``cluster_arrive()`` ... ``cluster_wait()``).

The cluster barrier instructions are ``.aligned``: every thread of a warp executes the same
one (no divergent calls), and every thread of every CTA in the cluster must arrive.
"""

from ._ptx import f32, ptx_asm, u32

__all__ = [
    "cluster_ctarank",
    "cluster_nctarank",
    "cluster_id_x",
    "cluster_id_y",
    "cluster_id_z",
    "cluster_nclusterid_x",
    "cluster_nclusterid_y",
    "cluster_nclusterid_z",
    "cluster_ctaid_x",
    "cluster_ctaid_y",
    "cluster_ctaid_z",
    "cluster_nctaid_x",
    "cluster_nctaid_y",
    "cluster_nctaid_z",
    "smid",
    "nsmid",
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


# --- special registers: where this CTA is in its cluster, and the cluster in the grid ------
@ptx_asm("mov.u32 {out}, %cluster_ctarank;", pure=True)
def cluster_ctarank() -> u32:
    """PTX ISA 10 Special Registers: %cluster_ctarank, this CTA's rank in its cluster
    (0..cluster_nctarank()-1).
    """


@ptx_asm("mov.u32 {out}, %cluster_nctarank;", pure=True)
def cluster_nctarank() -> u32:
    """PTX ISA 10 Special Registers: %cluster_nctarank, the number of CTAs in the cluster."""


@ptx_asm("mov.u32 {out}, %clusterid.x;", pure=True)
def cluster_id_x() -> u32:
    """PTX ISA 10 Special Registers: %clusterid.x, this cluster's index in the grid along x."""


@ptx_asm("mov.u32 {out}, %clusterid.y;", pure=True)
def cluster_id_y() -> u32:
    """PTX ISA 10 Special Registers: %clusterid.y, this cluster's index in the grid along y."""


@ptx_asm("mov.u32 {out}, %clusterid.z;", pure=True)
def cluster_id_z() -> u32:
    """PTX ISA 10 Special Registers: %clusterid.z, this cluster's index in the grid along z."""


@ptx_asm("mov.u32 {out}, %nclusterid.x;", pure=True)
def cluster_nclusterid_x() -> u32:
    """PTX ISA 10 Special Registers: %nclusterid.x, the number of clusters in the grid along x."""


@ptx_asm("mov.u32 {out}, %nclusterid.y;", pure=True)
def cluster_nclusterid_y() -> u32:
    """PTX ISA 10 Special Registers: %nclusterid.y, the number of clusters in the grid along y."""


@ptx_asm("mov.u32 {out}, %nclusterid.z;", pure=True)
def cluster_nclusterid_z() -> u32:
    """PTX ISA 10 Special Registers: %nclusterid.z, the number of clusters in the grid along z."""


@ptx_asm("mov.u32 {out}, %cluster_ctaid.x;", pure=True)
def cluster_ctaid_x() -> u32:
    """PTX ISA 10 Special Registers: %cluster_ctaid.x, this CTA's index in its cluster along x."""


@ptx_asm("mov.u32 {out}, %cluster_ctaid.y;", pure=True)
def cluster_ctaid_y() -> u32:
    """PTX ISA 10 Special Registers: %cluster_ctaid.y, this CTA's index in its cluster along y."""


@ptx_asm("mov.u32 {out}, %cluster_ctaid.z;", pure=True)
def cluster_ctaid_z() -> u32:
    """PTX ISA 10 Special Registers: %cluster_ctaid.z, this CTA's index in its cluster along z."""


@ptx_asm("mov.u32 {out}, %cluster_nctaid.x;", pure=True)
def cluster_nctaid_x() -> u32:
    """PTX ISA 10 Special Registers: %cluster_nctaid.x, the cluster's shape in CTAs along x."""


@ptx_asm("mov.u32 {out}, %cluster_nctaid.y;", pure=True)
def cluster_nctaid_y() -> u32:
    """PTX ISA 10 Special Registers: %cluster_nctaid.y, the cluster's shape in CTAs along y."""


@ptx_asm("mov.u32 {out}, %cluster_nctaid.z;", pure=True)
def cluster_nctaid_z() -> u32:
    """PTX ISA 10 Special Registers: %cluster_nctaid.z, the cluster's shape in CTAs along z."""


# --- where the CTA runs ------------------------------------------------------------------

@ptx_asm("mov.u32 {out}, %smid;")
def smid() -> u32:
    """PTX ISA 10 Special Registers: %smid, the SM this thread runs on, in ``[0, %nsmid)`` (numbers need not be
    contiguous). Not pure: a CTA may be preempted and resumed on another SM, so every read is a
    new value. A cluster's CTAs run in one GPC; a CTA pair of a 2-CTA cluster on one TPC
    (SMs 2t and 2t + 1)."""


@ptx_asm("mov.u32 {out}, %nsmid;", pure=True)
def nsmid() -> u32:
    """PTX ISA 10 Special Registers: %nsmid, the bound on %smid."""


# --- distributed shared memory ------------------------------------------------------------
@ptx_asm("mapa.shared::cluster.u32 {out}, {addr}, {rank};", pure=True)
def mapa(addr: u32, rank: u32) -> u32:
    """PTX ISA 9.7.9.23 mapa: the shared::cluster address of shared address ``addr`` in the CTA
    of cluster rank ``rank``.
    """


@ptx_asm("getctarank.shared::cluster.u32 {out}, {addr};", pure=True)
def getctarank(addr: u32) -> u32:
    """PTX ISA 9.7.9.24 getctarank: the cluster rank of the CTA owning shared::cluster address
    ``addr``.
    """


@ptx_asm("ld.shared::cluster.u32 {out}, [{addr}];")
def ld_shared_cluster_u32(addr: u32) -> u32:
    """PTX ISA 9.7.9.8 ld: load a u32 from shared::cluster address ``addr`` (see mapa)."""


@ptx_asm("ld.shared::cluster.f32 {out}, [{addr}];")
def ld_shared_cluster_f32(addr: u32) -> f32:
    """PTX ISA 9.7.9.8 ld: load an f32 from shared::cluster address ``addr`` (see mapa)."""


@ptx_asm("st.shared::cluster.u32 [{addr}], {value};")
def st_shared_cluster_u32(addr: u32, value: u32):
    """PTX ISA 9.7.9.10 st: store a u32 to shared::cluster address ``addr`` (see mapa)."""


@ptx_asm("st.shared::cluster.f32 [{addr}], {value};")
def st_shared_cluster_f32(addr: u32, value: f32):
    """PTX ISA 9.7.9.10 st: store an f32 to shared::cluster address ``addr`` (see mapa)."""


# --- cluster barrier ----------------------------------------------------------------------
@ptx_asm("barrier.cluster.arrive.release.aligned;")
def cluster_arrive():
    """PTX ISA 9.7.13.3 barrier.cluster: arrive (release) at the cluster barrier."""


@ptx_asm("barrier.cluster.arrive.relaxed.aligned;")
def cluster_arrive_relaxed():
    """PTX ISA 9.7.13.3 barrier.cluster: arrive without memory ordering (e.g. only to say 'this
    CTA has started').
    """


@ptx_asm("barrier.cluster.wait.acquire.aligned;")
def cluster_wait():
    """PTX ISA 9.7.13.3 barrier.cluster: wait (acquire) until every thread of the cluster has
    arrived.
    """


@ptx_asm("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;")
def cluster_sync():
    """PTX ISA 9.7.13.3 barrier.cluster: arrive (release) then wait (acquire): a cluster-wide
    __syncthreads.
    """
