"""Inductor's post-grad pass over graphs that hold numba_hopper's operators, in three steps.

First, a training graph's plain products (``numba_hopper::gemm`` with no epilogue: the
linears without bias, every ``dX`` and ``dW``) become ``numba_hopper::mm``, which Inductor calls
directly (``_lowering``) where the operator would go through the dispatcher, in
``training.GEMM_CONFIG``'s tiles (``sustained``).

Then, in such a graph, an embedding's weight gradient made through a float32 (V, H) table
becomes one operator that adds the looked-up rows into a table of the weight's dtype, or, for a
weight tied to the output layer, into that layer's product (``_embedding_grad``).

In such a graph, too, a sum of two or three products of one shape, each used only there (the
gradient of an activation that several linears read: a layer's query, key and value projections,
or its MLP's gate and up projections), becomes one ``numba_hopper::mm_sum``: one GEMM whose K loop
runs over each product's in turn (``numba_hopper.gemm_sum``), in place of the products, their
outputs and the passes that add them (``sum_products``). Its other terms, if any, are added to it.

In such a graph, too, a gated MLP's SiLU-and-multiply derivative (``dg = dh * u * silu'(g)``, ``du =
dh * silu(g)``) at the output of the product ``dh = dy @ W_down`` that nothing else reads becomes
one ``numba_hopper::mm_glu_backward``: the product with the derivative in its epilogue
(``numba_hopper.gemm_glu_backward``), so ``dh`` is never written and read back (``glu_backwards``).
The derivative takes several forms after decompositions (``sigmoid``, or ``1 / (1 + exp(-g))``,
shared with the SiLU's), so the pass recognizes it by value: it evaluates the elementwise nodes
between the product, the two saved products and the two gradients on sample values, in float64,
against the formulas.

In such a graph, too, a sine or cosine that a kernel reads broadcast (the rotary position
embeddings' tables, which every layer's query and key read once per head) is held in memory
(``numba_hopper::materialized``). Inductor inlines a pointwise value into each of its readers, so
each recomputes the sine or cosine (libdevice's, tens of instructions) for every element it reads:
in a compiled Llama step at 8192 tokens and hidden 2048 the rotary kernels were bound by that
arithmetic. Held, the table is computed once a graph and read from memory; its values are the same.

Last, gated MLPs become one GEMM each: the pass finds ``silu(x @ W_gate.T) * (x @ W_up.T)``
(SwiGLU, as Llama, Mistral and Qwen MLPs compute it) over two ``numba_hopper::mm`` and puts one
``numba_hopper::gated_mm`` in their place, or, where something else reads the products too (a
training graph saves them for its backward), one ``numba_hopper::gated_mm_products``, which also
writes both products into one (M, 2N) output whose halves those readers get.

The gated kernel (``numba_hopper.gemm(x, W_gate.t(), up=W_up.t(), activation="silu")``) computes
both products in one tile and writes the gated output, so the elementwise kernel that reads the
products to compute the gating is gone; without other readers the products never reach memory
(``python benchmarks/bench_gated.py``; kept: ``bench_gated_training.py``). Stock PyTorch cannot
do this: cuBLAS has no such epilogue.

The pass sees the graph after AOTAutograd's decompositions, where SiLU in a 16-bit model is
``convert(x32 / (1 + exp(-x32)))`` with ``x32 = convert(x, float32)`` (or ``x32 * sigmoid(x32)``,
or ``silu`` itself). It rewrites only what it recognizes whole: both products read the same
activation, each step of the gating has no other user, and the dtypes are 16-bit; anything else
stays as it was.
"""

from __future__ import annotations

import operator
import pathlib

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..kernels.gemm_config import MAX_K_SEGMENTS
from ..matmul.heuristics import SUSTAINED
from . import training

# What a graph compiled through the pass depends on beyond its own operators, so Inductor's cache
# keys a cached graph by these files: this pass, the autograd formulas whose products it sees
# (ops.py), the operators it puts in (_embedding_grad.py) and the calls that the lowering writes
# into the graph's code (_lowering.py). A cached graph made by another version of any of them
# would call that version's functions.
CACHE_KEY_FILES = ("_post_grad.py", "ops.py", "_embedding_grad.py", "_lowering.py")
aten, prims = torch.ops.aten, torch.ops.prims
_VIEWS = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
# The views a table takes on its way to the kernels that broadcast it (a rotary table: unsqueeze).
_TABLE_VIEWS = (*_VIEWS, aten.unsqueeze.default, aten.expand.default, aten.slice.Tensor, aten.squeeze.dim,
                aten.permute.default, aten.transpose.int)
_CONVERT = prims.convert_element_type.default
_HALF = (torch.bfloat16, torch.float16)


class PostGradPass(CustomGraphPass):
    """The pass (Inductor's ``post_grad_custom_pre_pass``): plain products to ``mm``, then, in
    graphs that hold them, embedding gradients, sums of products, gated units' derivatives and
    broadcast sines and cosines, then gated MLPs;
    ``then``: a pass the user had set there, run first."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, graph: torch.fx.Graph):
        if self.then is not None:
            self.then(graph)
        if plain_products_to_mm(graph) or _holds(graph, torch.ops.numba_hopper.mm.default):
            fuse_embedding_grads(graph)
            sum_products(graph)
            glu_backwards(graph)
            materialize_broadcast_trig(graph)
        fuse_gated_mlps(graph)

    def uuid(self):
        other = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
        return get_hash_for_files(tuple(str(pathlib.Path(__file__).with_name(name)) for name in CACHE_KEY_FILES)), \
            other, training.GEMM_CONFIG


def plain_products_to_mm(graph: torch.fx.Graph) -> int:
    """Put ``numba_hopper::mm(a, b, sustained)`` in place of each ``numba_hopper::gemm`` of ``graph``
    that is a plain product (no ``c``, bias, activation or output dtype, ``alpha`` 1): the same
    output, lowered to a direct call, in the training tiles. Return how many."""
    gemm, mm = torch.ops.numba_hopper.gemm.default, torch.ops.numba_hopper.mm.default
    schema = gemm._schema.arguments
    defaults = {arg.name: arg.default_value for arg in schema if arg.has_default_value()}
    sustained = training.GEMM_CONFIG == SUSTAINED
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != gemm:
            continue
        values = {**defaults, **dict(zip((arg.name for arg in schema), node.args))}
        values.update(node.kwargs)
        if (values["c"] is not None or values["bias"] is not None or values["alpha"] != 1.0
                or values["activation"] is not None or values["out_dtype"] is not None):
            continue
        with graph.inserting_before(node):
            product = graph.call_function(mm, (values["a"], values["b"], sustained))
        product.meta.update(node.meta)
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        replaced += 1
    return replaced


def fuse_gated_mlps(graph: torch.fx.Graph) -> int:
    """Rewrite each gated MLP of ``graph`` in place; return how many. Where something else reads
    the products too (a training graph saves them for its backward), the gated GEMM keeps them
    (``gated_mm_products``) and their readers read its slices."""
    mm = torch.ops.numba_hopper.mm.default
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.mul.Tensor or len(node.args) != 2:
            continue
        for gate_side, up_side in (node.args, node.args[::-1]):
            up_view, up_mm = _under_views(up_side)
            gate_mm = _under_views(_silu_input(gate_side))[1]
            if not (_is(up_mm, mm) and _is(gate_mm, mm) and _same_input(gate_mm.args[0], up_mm.args[0])
                    and _single_use(up_side) and _value(node).dtype in _HALF
                    and _value(gate_mm.args[1]).shape == _value(up_mm.args[1]).shape  # (static: weights)
                    and _k_major(gate_mm.args[1]) and _k_major(up_mm.args[1])):
                continue
            args = (gate_mm.args[0], gate_mm.args[1], up_mm.args[1], "silu")
            if _single_use(up_mm, gate_mm):
                with graph.inserting_before(node):
                    gated = graph.call_function(torch.ops.numba_hopper.gated_mm.default, args)
            else:
                gated = _keeping_products(graph, args, gate_mm, up_mm)
            gated.meta["val"] = _value(gate_mm)  # (M, N) like either product
            with graph.inserting_before(node):
                out = gated if up_view is None else graph.call_function(up_view.target, (gated, *up_view.args[1:]))
                out.meta["val"] = _value(node)
            node.replace_all_uses_with(out)
            fused += 1
            break
    if fused:
        graph.eliminate_dead_code()
    return fused


def _keeping_products(graph, args, gate_mm, up_mm):
    """``numba_hopper::gated_mm_products(*args)``'s gated output, put right after the later of
    ``gate_mm`` and ``up_mm``; their readers after it read its products' slices instead (those
    before it are the gating's, which the rewrite leaves unread)."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    later = max(gate_mm, up_mm, key=position.get)
    n = _value(gate_mm).shape[1]
    with graph.inserting_before(later.next):
        both = graph.call_function(torch.ops.numba_hopper.gated_mm_products.default, args)
        gated = graph.call_function(operator.getitem, (both, 0))
        products = graph.call_function(operator.getitem, (both, 1))
        products.meta["val"] = _value(gate_mm).new_empty((_value(gate_mm).shape[0], 2 * n))
        both.meta["val"] = (_value(gate_mm), products.meta["val"])
        for product, start in ((gate_mm, 0), (up_mm, n)):
            part = graph.call_function(aten.slice.Tensor, (products, 1, start, start + n))
            part.meta["val"] = products.meta["val"][:, start:start + n]
            product.replace_all_uses_with(part, delete_user_cb=lambda user: position[user] > position[later])
    return gated


def fuse_embedding_grads(graph: torch.fx.Graph) -> int:
    """Put ``numba_hopper::embedding_grad`` in place of each embedding weight gradient of ``graph``
    made through a float32 table (``convert(index_put(zeros(V, H), [ids], values, accumulate))``,
    or its masked form), and ``numba_hopper::mm_embedding_grad`` in place of such a gradient
    added to a product (a tied weight's; ``_embedding_grad``). Return how many."""
    mm = torch.ops.numba_hopper.mm.default
    fused = 0
    for node in list(graph.nodes):
        table = _embedding_table(node)
        if table is None:
            continue
        (user,) = node.users
        product = next((x for x in user.args if x is not node), None) if _is(user, aten.add.Tensor) else None
        tied = (_is(product, mm) and _single_use(product) and user.args.count(node) == 1 and not user.kwargs
                and _value(product).shape == _value(node).shape and _value(product).dtype == _value(node).dtype)
        replaced = user if tied else node
        with graph.inserting_before(replaced):
            if tied:
                grad = graph.call_function(torch.ops.numba_hopper.mm_embedding_grad.default, (*product.args, *table))
            else:
                grad = graph.call_function(torch.ops.numba_hopper.embedding_grad.default,
                                           (*table, _value(node).shape[0], _value(node).dtype))
        grad.meta["val"] = _value(replaced)
        replaced.replace_all_uses_with(grad)
        fused += 1
    if fused:
        graph.eliminate_dead_code()
    return fused


def sum_products(graph: torch.fx.Graph) -> int:
    """Put ``numba_hopper::mm_sum`` in place of each sum (a tree of ``add``) of 2 to
    ``MAX_K_SEGMENTS`` ``numba_hopper::mm`` of one tiling, 16-bit dtype and output shape, each
    product under the same view (or none), every step used only there; the sum's other terms
    (a residual's gradient) are added to it. Return how many."""
    mm, mm_sum = torch.ops.numba_hopper.mm.default, torch.ops.numba_hopper.mm_sum.default
    summed, inside = 0, set()
    for node in reversed(list(graph.nodes)):  # (outermost sums first)
        if node in inside or not _is(node, aten.add.Tensor):
            continue
        terms = _sum_terms(node, mm, root=True)
        products = [t for t in terms or () if t[1] is not None]
        others = [t[0] for t in terms or () if t[1] is None]
        if not 2 <= len(products) <= MAX_K_SEGMENTS:
            continue
        (view, first), values = products[0], [_value(p) for _, p in products]
        if not (all(_same_view(v, view) and p.args[2] == first.args[2] for v, p in products)
                and all(v.dtype in _HALF and v.dtype == values[0].dtype and v.shape == values[0].shape for v in values)
                and all(_value(x) is not None and _value(x).shape == _value(node).shape for x in others)
                and _value(node).dtype == values[0].dtype):
            continue
        with graph.inserting_before(node):
            out = graph.call_function(mm_sum, ([p.args[0] for _, p in products], [p.args[1] for _, p in products],
                                               first.args[2]))
            out.meta["val"] = values[0]
            if view is not None:
                out = graph.call_function(view.target, (out, *view.args[1:]))
                out.meta["val"] = _value(view)
            for other in others:
                out = graph.call_function(aten.add.Tensor, (out, other))
                out.meta["val"] = _value(node)
        node.replace_all_uses_with(out)
        inside.update(_sum_nodes(node))
        summed += 1
    if summed:
        graph.eliminate_dead_code()
    return summed


def _sum_terms(node, mm, root=False):
    """The terms that a tree of ``add`` sums (its inner nodes used only in it): ``(view or None,
    product)`` for an ``mm`` used only there (under at most one view, itself used only there),
    ``(node, None)`` for anything else; None if ``node`` is no such tree."""
    if not (_is(node, aten.add.Tensor) and len(node.args) == 2 and not node.kwargs and (root or len(node.users) == 1)):
        if root:
            return None
        view, product = _under_views(node)
        if _is(product, mm) and len(product.users) == 1 and (view is None or view.args[0] is product):
            return [(view, product)]
        return [(node, None)]
    left, right = (_sum_terms(x, mm) for x in node.args)
    return left + right


def _sum_nodes(node, root=True):
    """The inner ``add`` nodes of the tree rooted at ``node`` (:func:`_sum_terms`)."""
    if not (_is(node, aten.add.Tensor) and (root or len(node.users) == 1)):
        return []
    return [node, *_sum_nodes(node.args[0], False), *_sum_nodes(node.args[1], False)]


def _same_view(view, other):
    return (view is None and other is None) or (view is not None and other is not None and view.target == other.target
                                                and view.args[1:] == other.args[1:])


# The elementwise operators a decomposed SiLU derivative is made of, as float64 math on sample
# values; views and dtype conversions pass values through (``_glu_region``).
_ELEMENTWISE = {aten.mul.Tensor: operator.mul, aten.add.Tensor: operator.add, aten.sub.Tensor: operator.sub,
                aten.div.Tensor: operator.truediv, aten.rsub.Scalar: lambda x, y: y - x,
                aten.neg.default: operator.neg, aten.exp.default: torch.exp,
                aten.reciprocal.default: torch.reciprocal, aten.sigmoid.default: torch.sigmoid,
                aten.silu.default: torch.nn.functional.silu}
_PASS_THROUGH = (*_VIEWS, _CONVERT)
_SAMPLES = 97


def glu_backwards(graph: torch.fx.Graph) -> int:
    """Put ``numba_hopper::mm_glu_backward`` in place of each ``numba_hopper::mm`` of ``graph`` whose
    output only an elementwise region reads, and that region's two 16-bit results when they are
    SiLU-and-multiply's two gradients at it (:func:`_glu_region`). Return how many."""
    mm, fused_op = torch.ops.numba_hopper.mm.default, torch.ops.numba_hopper.mm_glu_backward.default
    fused = 0
    for product in list(graph.nodes):
        if not _is(product, mm):
            continue
        found = _glu_region(product)
        if found is None:
            continue
        (gate, up), (d_gate, d_up) = found
        order = {n: i for i, n in enumerate(graph.nodes)}
        anchor = max((product, gate, up), key=order.__getitem__)
        value = _value(product)
        with graph.inserting_before(anchor.next):  # (each new node after the one before)
            inputs = []
            for x in (gate, up):
                if tuple(_value(x).shape) != tuple(value.shape):
                    x = graph.call_function(aten.reshape.default, (x, list(value.shape)))
                    x.meta["val"] = value
                inputs.append(x)
            grads = graph.call_function(fused_op, (*product.args[:2], *inputs, product.args[2]))
            grads.meta["val"] = (value, value)
            for i, old in enumerate((d_gate, d_up)):
                new = graph.call_function(operator.getitem, (grads, i))
                new.meta["val"] = value
                if tuple(_value(old).shape) != tuple(value.shape):
                    new = graph.call_function(aten.reshape.default, (new, list(_value(old).shape)))
                    new.meta["val"] = _value(old)
                old.replace_all_uses_with(new)
        fused += 1
    if fused:
        graph.eliminate_dead_code()
    return fused


def _glu_region(product):
    """``((gate, up), (d_gate, d_up))`` if the nodes that read ``product`` (of 16-bit dtype), through
    elementwise operators and views, compute from it and two other nodes of its size, row-major
    (:func:`_row_major`), exactly two results of its dtype that others read, and those are
    ``dh * u * silu'(g)`` and ``dh * silu(g)`` at ``dh`` = the product, ``g`` and ``u`` the two
    nodes; else None."""
    value = _value(product)
    if not isinstance(value, torch.Tensor) or value.dtype not in _HALF or value.dim() != 2:
        return None
    size = value.numel()
    region, stack = set(), list(product.users)
    while stack:  # what reads the product elementwise
        node = stack.pop()
        if node not in region and _is_any(node, (*_ELEMENTWISE, *_PASS_THROUGH)) and not node.kwargs:
            region.add(node)
            stack.extend(node.users)
    if any(u not in region for u in product.users):
        return None
    results = [n for n in region if any(u not in region for u in n.users)]
    readers = set(region)
    leaves, stack = [], [a for n in region for a in n.args]
    while stack:  # what else it reads: elementwise work on other nodes, down to their sources
        node = stack.pop()
        if not isinstance(node, torch.fx.Node) or node is product or node in region or node in leaves:
            continue
        if _is_any(node, (*_ELEMENTWISE, *_PASS_THROUGH)) and not node.kwargs:
            region.add(node)
            stack.extend(node.args)
        else:
            leaves.append(node)
    values = [_value(n) for n in (*leaves, *region)]
    if not (len(results) == 2 and len(leaves) == 2
            and all(isinstance(v, torch.Tensor) and v.numel() == size for v in values)
            and all(_value(n).dtype == value.dtype for n in (*leaves, *results))
            and all(_row_major(_value(n)) for n in leaves)
            and all(r in readers for r in results)):
        return None
    samples = _evaluate(product, leaves, region)
    if samples is None:
        return None
    dh = samples[product]
    for gate, up in (leaves, leaves[::-1]):
        g, u = samples[gate], samples[up]
        s = torch.sigmoid(g)
        d_gate, d_up = dh * u * s * (1 + g * (1 - s)), dh * g * s
        for first, second in (results, results[::-1]):
            if torch.allclose(samples[first], d_gate, rtol=1e-9) and torch.allclose(samples[second], d_up, rtol=1e-9):
                return (gate, up), (first, second)
    return None


def _row_major(v):
    """Whether TMA reads ``v`` as the GLU backward's row-major matrices: contiguous, or 2-D with
    unit column stride and 16-byte-aligned rows and start (a training graph's saved products are
    the gated GEMM's two halves of one output, ``fuse_gated_mlps``)."""
    return v.is_contiguous() or (v.dim() == 2 and v.stride(1) == 1 and v.stride(0) * v.element_size() % 16 == 0
                                 and v.storage_offset() * v.element_size() % 16 == 0)


def _evaluate(product, leaves, region):
    """Each node of ``region`` on float64 samples (the product's and the leaves' random), or None
    if a node's arguments are not those values and numbers."""
    gen = torch.Generator().manual_seed(0)
    samples = {n: torch.randn(_SAMPLES, dtype=torch.float64, generator=gen) for n in (product, *leaves)}
    for node in product.graph.nodes:  # (graph order: arguments first)
        if node not in region:
            continue
        args = []
        for a in node.args:
            if isinstance(a, torch.fx.Node):
                if a not in samples:
                    return None
                args.append(samples[a])
            elif node.target in _PASS_THROUGH or (isinstance(a, (int, float)) and not isinstance(a, bool)):
                args.append(a)  # (a view's shape, a conversion's dtype, or a number)
            else:
                return None
        samples[node] = args[0] if node.target in _PASS_THROUGH else _ELEMENTWISE[node.target](*args)
    return samples


def materialize_broadcast_trig(graph: torch.fx.Graph) -> int:
    """Put ``numba_hopper::materialized`` after each sine or cosine of ``graph`` (with the scaling
    and conversion that follow it) that some kernel reads broadcast, at least twice per element.
    Return how many."""
    held_op = torch.ops.numba_hopper.materialized.default
    held = 0
    for node in list(graph.nodes):
        if not _is_any(node, (aten.cos.default, aten.sin.default)):
            continue
        table = node
        while len(table.users) == 1 and _scales_or_converts(next(iter(table.users))):
            table = next(iter(table.users))
        if not _read_broadcast(table):
            continue
        with graph.inserting_after(table):
            kept = graph.call_function(held_op, (table,))
        kept.meta["val"] = _value(table)
        table.replace_all_uses_with(kept, delete_user_cb=lambda user: user is not kept)
        held += 1
    return held


def _read_broadcast(table):
    """Whether a kernel reads ``table`` broadcast: a reader (through views) with at least twice
    its elements."""
    size = _value(table).numel() if isinstance(_value(table), torch.Tensor) else None
    return size is not None and any(isinstance(_value(r), torch.Tensor)
                                    and statically_known_true(_value(r).numel() >= 2 * size) for r in _readers(table))


def _scales_or_converts(node):
    """Whether ``node`` multiplies by a number or converts the dtype (a table's scaling and cast)."""
    return _is(node, _CONVERT) or (_is(node, aten.mul.Tensor) and isinstance(node.args[1], (int, float)))


def _readers(node):
    """The nodes that read ``node``'s value, through views of it."""
    readers = []
    for user in node.users:
        if _is_any(user, _TABLE_VIEWS) and user.args[0] is node:
            readers.extend(_readers(user))
        else:
            readers.append(user)
    return readers


_MASKED_PUT = getattr(aten, "_unsafe_masked_index_put_accumulate", None)  # (the newer decomposition's)


def _embedding_table(node):
    """``(ids, values, mask or None)`` if ``node`` converts to a 16-bit dtype a float32 (V, H)
    table of zeros into which ``index_put`` (or its masked form) added ``values`` at rows
    ``ids``, each step used only there; else None."""
    if not (_is(node, _CONVERT) and node.args[1] in _HALF and _single_use(node)):
        return None
    put = node.args[0]
    if _is(put, aten.index_put.default) and len(put.args) == 4 and put.args[3] is True:
        (zeros, indices, values), mask = put.args[:3], None
    elif _MASKED_PUT is not None and _is(put, _MASKED_PUT.default):
        zeros, mask, indices, values = put.args
    else:
        return None
    if not (_single_use(put) and len(indices) == 1 and _is(zeros, aten.full.default) and zeros.args[1] == 0
            and _single_use(zeros)):
        return None
    (ids,), table, v = indices, _value(zeros), _value(values)
    if not (table.dim() == 2 and table.dtype == torch.float32 and v is not None and v.dtype == torch.float32
            and tuple(v.shape) == (*_value(ids).shape, table.shape[1]) and not _value(ids).is_floating_point()
            and (mask is None or _value(mask).numel() == _value(ids).numel())):
        return None
    return ids, values, mask


def _holds(graph, target):
    return any(_is(node, target) for node in graph.nodes)


def _value(node):
    return node.meta.get("val")


def _is(node, target):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target


def _is_any(node, targets):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _is_view(node):
    return _is_any(node, _VIEWS)


def _under_views(node):
    """``(outermost view or None, the node under a chain of single-use views)``."""
    outer = None
    while _is_view(node):
        if len(node.users) > 1:
            return outer, None
        outer = outer or node
        node = node.args[0]
    return outer, node


def _same_input(x, y):
    """Whether two products read the same activation (a node, or equal views of one node)."""
    return x is y or (_is_view(x) and _is_view(y) and x.target == y.target and x.args == y.args)


def _k_major(b):
    """Whether the (K, N) operand ``b`` is column-major with 16-byte rows (``w.t()`` of a row-major
    weight), as the gated kernel reads it."""
    v = _value(b)
    return v is not None and v.dim() == 2 and v.stride(0) == 1 and v.stride(1) * v.element_size() % 16 == 0


def _single_use(*nodes):
    return all(len(n.users) == 1 for n in nodes)


def _silu_input(node):
    """``x`` if ``node`` is ``silu(x)`` for a 16-bit ``x``, in one of the forms decompositions give
    it, each step used only there; else None."""
    if not isinstance(node, torch.fx.Node) or len(node.users) != 1:
        return None
    if _is(node, _CONVERT) and node.args[1] in _HALF:
        node = node.args[0]
        if len(node.users) != 1:
            return None
    if _is(node, aten.silu.default):
        x32 = node.args[0]
    elif _is(node, aten.div.Tensor):  # x / (1 + exp(-x))
        x32, den = node.args
        one_plus = den if _is(den, aten.add.Tensor) and den.args[1] == 1 else None
        exp = one_plus and one_plus.args[0]
        if not (_is(exp, aten.exp.default) and _is(exp.args[0], aten.neg.default) and exp.args[0].args[0] is x32
                and _single_use(one_plus, exp, exp.args[0])):
            return None
    elif _is(node, aten.mul.Tensor):  # x * sigmoid(x)
        x32, sig = node.args
        if not (_is(sig, aten.sigmoid.default) and sig.args[0] is x32 and _single_use(sig)):
            return None
    else:
        return None
    if len(x32.users) != (1 if _is(node, aten.silu.default) else 2):  # (x / (1 + exp(-x)) reads x twice)
        return None
    if _is(x32, _CONVERT) and x32.args[1] == torch.float32:
        x32 = x32.args[0]  # (its single use: _under_views checks the views below)
    return x32 if _value(x32) is not None and _value(x32).dtype in _HALF else None
